"""The periodic jobs page: every schedule (from code and from settings), its next and
last tick, the job its last tick made, and a button that runs it now."""

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
from ..models import Job, PeriodicTick
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
            error = ""
        except SettingsError as exc:
            declared, error = [], str(exc)
        ticks = {
            tick.name: tick
            for tick in PeriodicTick.objects.filter(name__in=[s.name for s in declared])
        }
        last_ids = [tick.last_job_id for tick in ticks.values() if tick.last_job_id]
        statuses = dict(Job.objects.filter(pk__in=last_ids).values_list("pk", "status"))
        now = timezone.now()
        may_run = self.has_retry_permission(request)
        rows = [
            self._schedule_row(schedule, ticks.get(schedule.name), statuses, now, site, may_run)
            for schedule in declared
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": _("Periodic jobs"),
            "opts": self.opts,
            "schedules": rows,
            "error": error,
            "changelist_url": reverse(f"{site}:django_pgqueue_job_changelist"),
        }
        return TemplateResponse(request, f"{TEMPLATES}/periodic.html", context)

    def _schedule_row(
        self,
        schedule: Schedule,
        tick: PeriodicTick | None,
        statuses: dict[Any, str],
        now: Any,
        site: str,
        may_run: bool,
    ) -> dict[str, Any]:
        from_code = periodic.declared_in_code(schedule)
        last_job = tick.last_job_id if tick else None
        return {
            "name": schedule.name,
            "job_type": schedule.job_type,
            "cron": schedule.cron,
            "zone": schedule.zone_name,
            "source": _("@job(schedule=...)") if from_code else _("PGQUEUE['SCHEDULE']"),
            "next_tick": display_datetime(schedule.next_tick(now)),
            "last_tick": display_datetime(tick.last_tick) if tick else "",
            "last_job": last_job,
            "last_job_status": statuses.get(last_job, _("pruned")) if last_job else "",
            "last_job_url": reverse(f"{site}:django_pgqueue_job_change", args=[last_job])
            if last_job
            else "",
            "run_url": reverse(f"{site}:django_pgqueue_job_periodic_run", args=[schedule.name])
            if may_run
            else "",
        }

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
