"""The periodic jobs page: every schedule (from code, settings and the database), its
next and last tick, the job its last tick made, whether it is paused, and buttons that
run it now, pause and resume it; links to add and edit the schedules stored in the
database (``admin.schedules``)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from .. import periodic
from ..cron import Schedule
from ..exceptions import DuplicateJobError, SettingsError
from ..models import Job, PeriodicTick, StoredSchedule
from .base import JobAdminBase
from .formatting import TEMPLATES, display_datetime


class PeriodicPage(JobAdminBase):
    """``JobAdmin.periodic_view`` and its run-now button."""

    def periodic_view(self, request: HttpRequest) -> TemplateResponse:
        """Every schedule with its next tick, last tick and the last tick's job."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        site = self.admin_site.name
        try:
            declared = periodic.schedules()
            errors = [
                _("Stored schedule “%(name)s” is ignored: %(problem)s")
                % {"name": name, "problem": problem}
                for name, problem in periodic.stored_schedule_problems().items()
            ]
        except SettingsError as exc:
            declared, errors = [], [str(exc)]
        ticks = {
            tick.name: tick
            for tick in PeriodicTick.objects.filter(name__in=[s.name for s in declared])
        }
        last_ids = [tick.last_job_id for tick in ticks.values() if tick.last_job_id]
        statuses = dict(Job.objects.filter(pk__in=last_ids).values_list("pk", "status"))
        stored_ids = dict(StoredSchedule.objects.values_list("name", "pk"))
        now = timezone.now()
        may = self._schedule_permissions(request)
        rows = [
            self._schedule_row(
                schedule, ticks.get(schedule.name), statuses, stored_ids, now, site, may
            )
            for schedule in declared
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": _("Periodic jobs"),
            "opts": self.opts,
            "schedules": rows,
            "errors": errors,
            "may_act": may["run"],
            "add_url": reverse(f"{site}:django_pgqueue_storedschedule_add") if may["add"] else "",
            "stored_url": reverse(f"{site}:django_pgqueue_storedschedule_changelist")
            if may["view_stored"]
            else "",
            "changelist_url": reverse(f"{site}:django_pgqueue_job_changelist"),
        }
        return TemplateResponse(request, f"{TEMPLATES}/periodic.html", context)

    def _schedule_permissions(self, request: HttpRequest) -> dict[str, bool]:
        """What the user may do on the page: run, pause and resume (``retry_job``), view,
        add and change stored schedules (that model's permissions)."""
        stored = self.admin_site._registry.get(StoredSchedule)
        return {
            "run": self.has_retry_permission(request),
            "view_stored": bool(stored and stored.has_view_or_change_permission(request)),
            "add": bool(stored and stored.has_add_permission(request)),
            "change": bool(stored and stored.has_change_permission(request)),
        }

    def _schedule_row(
        self,
        schedule: Schedule,
        tick: PeriodicTick | None,
        statuses: dict[Any, str],
        stored_ids: dict[str, int],
        now: Any,
        site: str,
        may: dict[str, bool],
    ) -> dict[str, Any]:
        if schedule.stored:
            source = _("the admin (stored)")
        elif periodic.declared_in_code(schedule):
            source = _("@job(schedule=...)")
        else:
            source = _("PGQUEUE['SCHEDULE']")
        last_job = tick.last_job_id if tick else None
        paused_at = tick.paused_at if tick else None
        stored_id = stored_ids.get(schedule.name) if schedule.stored else None
        return {
            "name": schedule.name,
            "job_type": schedule.job_type,
            "cron": schedule.cron,
            "zone": schedule.zone_name,
            "source": source,
            "paused_since": display_datetime(paused_at) if paused_at else "",
            "next_tick": "" if paused_at else display_datetime(schedule.next_tick(now)),
            "last_tick": display_datetime(tick.last_tick) if tick else "",
            "last_job": last_job,
            "last_job_status": statuses.get(last_job, _("pruned")) if last_job else "",
            "last_job_url": reverse(f"{site}:django_pgqueue_job_change", args=[last_job])
            if last_job
            else "",
            "edit_url": reverse(f"{site}:django_pgqueue_storedschedule_change", args=[stored_id])
            if stored_id is not None and may["change"]
            else "",
            "run_url": reverse(f"{site}:django_pgqueue_job_periodic_run", args=[schedule.name])
            if may["run"]
            else "",
            "pause_url": reverse(
                f"{site}:django_pgqueue_job_periodic_{'resume' if paused_at else 'pause'}",
                args=[schedule.name],
            )
            if may["run"]
            else "",
        }

    def periodic_pause_view(self, request: HttpRequest, name: str, pause: bool) -> HttpResponse:
        """Pause or resume a schedule (the page's buttons), then go back to the page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and self.has_retry_permission(request)):
            raise PermissionDenied
        try:
            changed = periodic.pause_schedule(name) if pause else periodic.resume_schedule(name)
        except LookupError:
            return self._not_found(request, _("No periodic job “%s”.") % name)
        if pause:
            message = (
                _("Periodic job “%s” paused: no tick is enqueued until it is resumed.")
                if changed
                else _("Periodic job “%s” was already paused.")
            )
        else:
            message = (
                _("Periodic job “%s” resumed: it runs from its next tick.")
                if changed
                else _("Periodic job “%s” was not paused.")
            )
        self._report(request, message % name, int(changed))
        if changed:
            tick = PeriodicTick.objects.filter(name=name).first()
            done = (
                _("Paused from the periodic jobs page.")
                if pause
                else _("Resumed from the periodic jobs page.")
            )
            self._audit(request, [tick] if tick else [], done)
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:django_pgqueue_job_periodic"))

    def periodic_run_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """Enqueue a schedule's job now (the page's buttons), then go back to the page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and self.has_retry_permission(request)):
            raise PermissionDenied
        try:
            job = periodic.run_now(name)
        except LookupError:
            return self._not_found(request, _("No periodic job “%s”.") % name)
        except DuplicateJobError as exc:
            held = _(
                "Periodic job “%(name)s” not run: job %(job)s with its unique key is "
                "still %(status)s."
            )
            facts = {"name": name, "job": exc.job_id, "status": exc.job.status}
            self._report(request, held % facts, 0)
        else:
            done = _("Periodic job “%(name)s” enqueued now: job %(job)s.")
            self._report(request, done % {"name": name, "job": job.pk}, 1)
            self._audit(request, [job], _("Enqueued now from the periodic jobs page."))
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:django_pgqueue_job_periodic"))
