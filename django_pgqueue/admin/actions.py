"""The Job admin's actions: retry, cancel, run now and end a sleep or a wait, on the
changelist and a job's page.

Each action narrows the selection to the jobs it applies to, changes them through the
``JobQuerySet`` transitions, and reports how many changed and why others were skipped.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import cast

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..due import not_yet_due_q
from ..exceptions import StepError
from ..models import Job, JobQuerySet
from ..schema import CANCELLABLE, IN_FLIGHT, RETRYABLE, JobStatus
from .attempts import STEPS_SHOWN, current_wait
from .base import JobAdminBase


class JobActions(JobAdminBase):
    """The actions ``JobAdmin.actions`` names, and the buttons of a job's page."""

    @admin.action(
        permissions=["retry"], description=gettext_lazy("Retry selected failed or cancelled jobs")
    )
    def retry_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        # Counted in the retry's own transaction, with the eligible jobs locked: a worker
        # failing a retried job again, after the commit, is not this action's doing.
        with transaction.atomic(using=queryset.db):
            selected = queryset.count()
            eligible = _locked_ids(queryset.filter(status__in=RETRYABLE))
            changed = queryset.filter(status__in=RETRYABLE).retry()
            retried = self._jobs(queryset, eligible).exclude(status__in=RETRYABLE)
            self._audit(request, list(retried), _("Retried."))
        # What retry() left failed or cancelled: its unique key is held by an active job.
        held = len(eligible) - changed
        message = _(
            "Retry: %(changed)d changed, %(skipped)d skipped (not failed or cancelled)."
        ) % {"changed": changed, "skipped": selected - len(eligible)}
        if held:
            held_message = _("%(held)d skipped (unique key held by an active job).")
            message += " " + held_message % {"held": held}
        self._report(request, message, changed)

    @admin.action(permissions=["retry"], description=gettext_lazy("Cancel selected jobs"))
    def cancel_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        selected = queryset.count()
        with transaction.atomic(using=queryset.db):
            waiting = _locked_ids(queryset.filter(status__in=CANCELLABLE))
            cancelled = queryset.filter(status__in=CANCELLABLE).cancel()
            in_flight = queryset.filter(status__in=IN_FLIGHT, cancel_requested_at__isnull=True)
            running = _locked_ids(in_flight)
            asked = in_flight.cancel()
            self._audit(request, list(self._jobs(queryset, waiting)), _("Cancelled."))
            self._audit(request, list(self._jobs(queryset, running)), _("Asked to stop."))
        changed = cancelled + asked
        self._report(
            request,
            _(
                "Cancel: %(changed)d changed (%(cancelled)d pending or waiting cancelled, "
                "%(asked)d "
                "running asked to stop), %(skipped)d skipped (finished, or already asked "
                "to stop)."
            )
            % {
                "changed": changed,
                "cancelled": cancelled,
                "asked": asked,
                "skipped": selected - changed,
            },
            changed,
        )

    @admin.action(permissions=["retry"], description=gettext_lazy("Run selected delayed jobs now"))
    def run_jobs_now(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        selected = queryset.count()
        with transaction.atomic(using=queryset.db):
            delayed = _locked_ids(queryset.filter(not_yet_due_q(), status=JobStatus.PENDING))
            changed = queryset.run_now()
            self._audit(request, list(self._jobs(queryset, delayed)), _("Made due now."))
        self._report(
            request,
            _("Run now: %(changed)d changed, %(skipped)d skipped (not delayed pending jobs).")
            % {"changed": changed, "skipped": selected - changed},
            changed,
        )

    @admin.action(
        permissions=["retry"],
        description=gettext_lazy("End the sleeps and waits of selected jobs now"),
    )
    def end_waits(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        selected = queryset.count()
        with transaction.atomic(using=queryset.db):
            _locked_ids(queryset.filter(status=JobStatus.PENDING))
            ended = queryset.end_waits_of()
            self._audit(
                request, list(self._jobs(queryset, ended)), _("Ended its sleep or wait now.")
            )
        self._report(
            request,
            _(
                "End sleeps and waits: %(changed)d changed, %(skipped)d skipped (not "
                "sleeping or waiting for an event)."
            )
            % {"changed": len(ended), "skipped": selected - len(ended)},
            len(ended),
        )

    def _rerun_from(self, request: HttpRequest, job: Job, step: str) -> None:
        """Run ``job`` again from its checkpoint ``step`` (``Job.rerun_from_step()``)."""
        status = job.status
        try:
            with transaction.atomic(using=job._state.db):
                cleared = job.rerun_from_step(step)
                message = _("Re-ran from step “%(step)s”: %(cleared)d checkpoint(s) cleared.")
                message %= {"step": step, "cleared": cleared}
                if status in RETRYABLE:
                    message += " " + _("Retried.")
                self._audit(request, [job], message)
        except StepError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        self.message_user(request, message, messages.SUCCESS)

    def _jobs(self, queryset: JobQuerySet, ids: list[uuid.UUID]) -> JobQuerySet:
        """The jobs of ``ids``, whatever the selection's filters say of them now."""
        return self.model._default_manager.using(queryset.db).filter(pk__in=ids)

    def job_actions(self, request: HttpRequest, job: Job) -> list[dict[str, str]]:
        """The actions the user may apply to ``job`` now: for buttons on its page."""
        if not self.has_retry_permission(request):
            return []
        applicable = {
            "retry": job.status in RETRYABLE,
            "cancel": job.status in CANCELLABLE
            or (job.status in IN_FLIGHT and job.cancel_requested_at is None),
            # "Delayed" as the database decides it, like the action itself.
            "run-now": job.status == JobStatus.PENDING
            and self.get_queryset(request).filter(not_yet_due_q(), pk=job.pk).exists(),
            "end-wait": job.status == JobStatus.PENDING and current_wait(job) is not None,
        }
        labels = {
            "retry": _("Retry"),
            "cancel": _("Cancel"),
            "run-now": _("Run now"),
            "end-wait": _("End sleep or wait now"),
        }
        return [
            {
                "label": labels[name],
                "url": reverse(
                    f"{self.admin_site.name}:django_pgqueue_job_action", args=[job.pk, name]
                ),
            }
            for name, ok in applicable.items()
            if ok
        ]

    def object_action_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """Apply one action to one job (the buttons of its page), then go back to it."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        methods: dict[str, Callable[[HttpRequest, JobQuerySet], None]] = {
            "retry": self.retry_jobs,
            "cancel": self.cancel_jobs,
            "run-now": self.run_jobs_now,
            "end-wait": self.end_waits,
        }
        if not (self.has_view_permission(request) and self.has_retry_permission(request)):
            raise PermissionDenied
        job = self.get_object(request, object_id)
        if action == "rerun-from" and job is not None:
            self._rerun_from(request, job, request.POST.get("step", ""))
            return HttpResponseRedirect(
                reverse(f"{self.admin_site.name}:django_pgqueue_job_change", args=[job.pk])
            )
        if action not in methods:
            return self._not_found(request, _("No job action “%s”.") % action)
        if job is None:
            return self._not_found(request, _("No job with id “%s”.") % object_id)
        # Job's manager builds JobQuerySets; the admin's get_queryset is typed as QuerySet.
        this_job = cast(JobQuerySet, self.get_queryset(request).filter(pk=job.pk))
        methods[action](request, this_job)
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:django_pgqueue_job_change", args=[job.pk])
        )


def rerun_choices(job: Job) -> list[str]:
    """The names of the checkpoints ``job`` can run again from, oldest first; none
    unless it is failed, cancelled, pending or waiting."""
    if job.status in IN_FLIGHT or job.status == JobStatus.COMPLETED:
        return []
    return list(job.steps.order_by("id").values_list("name", flat=True)[:STEPS_SHOWN])


def _locked_ids(jobs: JobQuerySet) -> list[uuid.UUID]:
    """The ids of ``jobs``, locked until the end of the transaction: the transition that
    follows changes all of them, and no worker changes them meanwhile."""
    return list(jobs.select_for_update().values_list("pk", flat=True))
