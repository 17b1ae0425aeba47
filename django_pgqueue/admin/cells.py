"""The cells of the Job admin's list and page: status badges, progress, times, payloads.

A cell the live refresh updates carries ``data-pgqueue-job`` and ``data-pgqueue-field``
(see ``static/django_pgqueue/admin/jobs.js``); every cell is built with ``format_html``
or an app template, never by concatenating text.
"""

from __future__ import annotations

from datetime import datetime

from django.contrib import admin
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..models import Job
from ..schema import JobStatus
from ..tracing import stored_ids
from .attempts import attempt_rows, step_rows, wait_summary
from .base import JobModelAdmin
from .formatting import (
    TEMPLATES,
    display_datetime,
    json_pre,
    short_datetime,
    short_duration,
    status_label,
)
from .live import event_state, recent_events

#: Characters of a job's id the changelist shows: its last ones, random in every id.
SHORT_ID = 12


class JobCells(JobModelAdmin):
    """The display methods ``JobAdmin`` names in ``list_display`` and ``fieldsets``."""

    def _live(self, job: Job, field: str, text: object) -> SafeString:
        """A cell the live refresh updates (see static/django_pgqueue/admin/jobs.js)."""
        return format_html(
            '<span data-pgqueue-job="{}" data-pgqueue-field="{}">{}</span>',
            job.pk,
            field,
            text if text not in (None, "") else self.get_empty_value_display(),
        )

    @admin.display(description=gettext_lazy("ID"), ordering="id")
    def short_id(self, job: Job) -> SafeString:
        # The end of the id: a version 7 UUID starts with its creation time, the same for
        # every job of a minute, and ends with random bits that tell them apart.
        return format_html('<code title="{}">…{}</code>', job.pk, str(job.pk)[-SHORT_ID:])

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_badge(self, job: Job) -> SafeString:
        return format_html(
            '<span class="pgqueue-status pgqueue-status-{}" data-pgqueue-job="{}" '
            'data-pgqueue-field="status" data-pgqueue-status="{}">{}</span>',
            job.status,
            job.pk,
            job.status,
            status_label(job),
        )

    @admin.display(description=gettext_lazy("progress"), ordering="progress")
    def progress_bar(self, job: Job) -> str:
        return render_to_string(f"{TEMPLATES}/progress.html", {"job": job})

    @admin.display(description=gettext_lazy("current stage"))
    def stage(self, job: Job) -> SafeString:
        return self._live(job, "stage", job.current_stage)

    @admin.display(description=gettext_lazy("attempts"), ordering="attempts")
    def attempts_display(self, job: Job) -> SafeString:
        return self._live(job, "attempts", f"{job.attempts} / {job.max_attempts}")

    @admin.display(description=gettext_lazy("worker"), ordering="worker_id")
    def worker(self, job: Job) -> SafeString:
        return format_html(
            '<span class="pgqueue-worker" title="{}" data-pgqueue-job="{}" '
            'data-pgqueue-field="worker">{}</span>',
            job.worker_id or "",
            job.pk,
            job.worker_id or self.get_empty_value_display(),
        )

    def _time(self, job: Job, field: str, value: datetime | None, *, short: bool) -> SafeString:
        """A time cell; ``field`` names it for the live refresh ("" when it never changes)."""
        text: str
        if value is None:
            text = self.get_empty_value_display()
        else:
            text = short_datetime(value) if short else display_datetime(value)
        return format_html(
            '<span class="pgqueue-time" title="{}" data-pgqueue-job="{}" data-pgqueue-field="{}" '
            'data-pgqueue-format="{}">{}</span>',
            display_datetime(value),
            job.pk,
            field,
            "short" if short else "full",
            text,
        )

    @admin.display(description=gettext_lazy("created at"), ordering="created_at")
    def created(self, job: Job) -> SafeString:
        return self._time(job, "", job.created_at, short=True)

    @admin.display(description=gettext_lazy("started at"), ordering="started_at")
    def started(self, job: Job) -> SafeString:
        return self._time(job, "started", job.attempt_started_at, short=True)

    @admin.display(description=gettext_lazy("completed at"), ordering="completed_at")
    def completed(self, job: Job) -> SafeString:
        return self._time(job, "completed", job.completed_at, short=True)

    @admin.display(description=gettext_lazy("created at"))
    def created_full(self, job: Job) -> SafeString:
        return self._time(job, "", job.created_at, short=False)

    @admin.display(description=gettext_lazy("run at"))
    def run_at_full(self, job: Job) -> SafeString:
        return self._time(job, "", job.run_at, short=False)

    @admin.display(description=gettext_lazy("claimed at"))
    def claimed_full(self, job: Job) -> SafeString:
        return self._time(job, "", job.claimed_at, short=False)

    @admin.display(description=gettext_lazy("started at"))
    def started_full(self, job: Job) -> SafeString:
        return self._time(job, "started", job.attempt_started_at, short=False)

    @admin.display(description=gettext_lazy("last heartbeat"))
    def heartbeat_full(self, job: Job) -> SafeString:
        return self._time(job, "", job.heartbeat_at, short=False)

    @admin.display(description=gettext_lazy("completed at"))
    def completed_full(self, job: Job) -> SafeString:
        return self._time(job, "completed", job.completed_at, short=False)

    @admin.display(description=gettext_lazy("cancel requested at"))
    def cancel_requested(self, job: Job) -> SafeString:
        return self._time(job, "", job.cancel_requested_at, short=False)

    @admin.display(description=gettext_lazy("runs at"), ordering="run_at")
    def runs_at(self, job: Job) -> SafeString | str:
        """When a pending job is due: "in 4m" ahead (a delayed job, a retry in backoff),
        "due" once reached; waiting jobs run after their dependencies."""
        if job.status == JobStatus.WAITING:
            return _("after its dependencies")
        if job.status != JobStatus.PENDING:
            return ""
        # Due as the database decides it: the changelist's annotation (JobChangeList).
        if getattr(job, "is_due", False):
            text = _("due")
        else:
            text = _("in %s") % short_duration(job.run_at - timezone.now())
        return format_html('<span title="{}">{}</span>', display_datetime(job.run_at), text)

    @admin.display(description=gettext_lazy("age"), ordering="-created_at")
    def age(self, job: Job) -> SafeString:
        return format_html(
            '<span title="{}">{}</span>',
            display_datetime(job.created_at),
            short_duration(timezone.now() - job.created_at),
        )

    @admin.display(description=gettext_lazy("data"))
    def data_pretty(self, job: Job) -> SafeString:
        return json_pre(job.data)

    @admin.display(description=gettext_lazy("result"))
    def result_pretty(self, job: Job) -> SafeString | str:
        return json_pre(job.result) if job.result is not None else ""

    @admin.display(description=gettext_lazy("workers of each attempt"))
    def worker_ids_display(self, job: Job) -> str:
        return ", ".join(job.worker_ids)

    @admin.display(description=gettext_lazy("trace"))
    def trace_display(self, job: Job) -> SafeString | str:
        ids = stored_ids(job.trace_context)
        if ids is None:
            return ""
        return format_html("<code>{}</code> (enqueued in span <code>{}</code>)", *ids)

    @admin.display(description=gettext_lazy("last error"))
    def last_error_pre(self, job: Job) -> SafeString | str:
        if not job.last_error:
            return ""
        return format_html(
            '<pre class="pgqueue-pre" data-pgqueue-job="{}" data-pgqueue-field="last_error">'
            "{}</pre>",
            job.pk,
            job.last_error,
        )

    @admin.display(description=gettext_lazy("traceback"))
    def traceback_pre(self, job: Job) -> SafeString | str:
        if not job.last_traceback:
            return ""
        return format_html('<pre class="pgqueue-pre">{}</pre>', job.last_traceback)

    @admin.display(description=gettext_lazy("durations"))
    def durations(self, job: Job) -> str:
        now = timezone.now()
        if job.status == JobStatus.PENDING:  # claimed_at and started_at: an earlier attempt
            if job.run_at > now:
                return _("due in %s") % short_duration(job.run_at - now)
            return _("due %s ago, waiting for a worker") % short_duration(now - job.run_at)
        parts = []
        if job.claimed_at and job.run_at:
            waited = short_duration(job.claimed_at - job.run_at)
            parts.append(_("waited %s after it was due") % waited)
        started = job.attempt_started_at
        if started:
            end = job.completed_at or now
            ran = short_duration(end - started)
            parts.append(_("ran %s") % ran if job.completed_at else _("running for %s") % ran)
        return "; ".join(parts)

    @admin.display(description=gettext_lazy("attempts"))
    def attempt_history(self, job: Job) -> str:
        rows, hidden = attempt_rows(job)
        return render_to_string(f"{TEMPLATES}/attempts.html", {"attempts": rows, "hidden": hidden})

    @admin.display(description=gettext_lazy("steps"))
    def steps_display(self, job: Job) -> str:
        rows, hidden = step_rows(job)
        return render_to_string(
            f"{TEMPLATES}/steps.html",
            {"steps": rows, "hidden": hidden, "waiting": wait_summary(job)},
        )

    @admin.display(description=gettext_lazy("events"))
    def history(self, job: Job) -> str:
        return render_to_string(
            f"{TEMPLATES}/history.html",
            {"job": job, "events": [event_state(event) for event in recent_events(job.pk)]},
        )
