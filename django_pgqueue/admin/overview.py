"""The queue overview page: jobs per queue and status, throughput, waiting time, workers;
and its pause and resume buttons."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Count, Min, Q
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.translation import gettext as _

from .. import conf, validation
from ..due import due_q, not_yet_due_q
from ..exceptions import InvalidArgumentError
from ..models import IN_FLIGHT, Job, JobStatus, WorkerRecord
from ..queues import pause_queue, paused_since, queue_limits, resume_queue
from .base import JobAdminBase
from .formatting import TEMPLATES, display_datetime, short_duration


class QueueOverview(JobAdminBase):
    """``JobAdmin.overview_view`` (``overview/``) and ``queue_action_view``."""

    def queue_action_view(self, request: HttpRequest, queue: str, action: str) -> HttpResponse:
        """Pause or resume one queue (the overview's buttons), then go back to the overview."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and self.has_retry_permission(request)):
            raise PermissionDenied
        try:
            validation.queue(queue)
        except InvalidArgumentError:
            return HttpResponse(status=404)
        if action == "pause":
            changed = pause_queue(queue)
            message = (
                _("Queue “%s” paused: workers claim none of its jobs until it is resumed.")
                if changed
                else _("Queue “%s” was already paused.")
            )
        elif action == "resume":
            changed = resume_queue(queue)
            message = (
                _("Queue “%s” resumed: workers claim its jobs again.")
                if changed
                else _("Queue “%s” was not paused.")
            )
        else:
            return HttpResponse(status=404)
        self._report(request, message % queue, int(changed))
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:django_pgqueue_job_overview"))

    def overview_view(self, request: HttpRequest) -> TemplateResponse:
        """Counts per queue and status, throughput, waiting time, and the workers."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = timezone.now()
        changelist = reverse(f"{self.admin_site.name}:django_pgqueue_job_changelist")
        queues = queue_stats(now)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Queue overview"),
            "opts": self.opts,
            "now": display_datetime(now),
            "statuses": JobStatus.choices,
            "queues": [
                _queue_row(row, now, changelist) | state
                for row, state in _with_queue_states(queues, self, request)
            ],
            "totals": _queue_row(_totals(queues), now, changelist),
            "workers": worker_rows(now),
            "changelist_url": changelist,
        }
        return TemplateResponse(request, f"{TEMPLATES}/overview.html", context)


_STATUS_COUNTS = {status: Count("pk", filter=Q(status=status)) for status in JobStatus.values}


def queue_stats(now: datetime) -> list[dict[str, Any]]:
    """One row per queue: jobs per status, oldest due pending job, recent throughput.

    One pass over the table (a million rows take a fraction of a second): this page is
    opened on purpose, unlike the changelist.
    """
    due = due_q() & Q(status=JobStatus.PENDING)
    return list(
        Job.objects.order_by("queue")
        .values("queue")
        .annotate(
            **_STATUS_COUNTS,
            delayed=Count("pk", filter=not_yet_due_q() & Q(status=JobStatus.PENDING)),
            oldest_due=Min("run_at", filter=due),
            completed_last_minute=Count(
                "pk",
                filter=Q(status=JobStatus.COMPLETED, completed_at__gte=now - timedelta(minutes=1)),
            ),
            completed_last_hour=Count(
                "pk",
                filter=Q(status=JobStatus.COMPLETED, completed_at__gte=now - timedelta(hours=1)),
            ),
            failed_last_hour=Count(
                "pk", filter=Q(status=JobStatus.FAILED, completed_at__gte=now - timedelta(hours=1))
            ),
        )
    )


def _with_queue_states(
    rows: list[dict[str, Any]], model_admin: QueueOverview, request: HttpRequest
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each stats row with its queue's pause state, limit and pause/resume button.

    Paused or limited queues without jobs get an empty row, so they can be resumed here.
    """
    paused, limits = paused_since(), queue_limits()
    present = {row["queue"] for row in rows}
    rows = sorted(
        [*rows, *({"queue": name} for name in {*paused, *limits} - present)],
        key=lambda row: row["queue"],
    )
    may_change = model_admin.has_retry_permission(request)
    site = model_admin.admin_site.name
    result = []
    for row in rows:
        name = row["queue"]
        action = "resume" if name in paused else "pause"
        state: dict[str, Any] = {
            "paused_at": display_datetime(paused.get(name)),
            "limit": limits.get(name),
            "queue_action": {
                "label": _("Resume") if name in paused else _("Pause"),
                "url": reverse(f"{site}:django_pgqueue_job_queue_action", args=[name, action]),
            }
            if may_change
            else None,
        }
        result.append((row, state))
    return result


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {"queue": None}
    for row in rows:
        for key, value in row.items():
            if key == "queue" or value is None:
                continue
            if key == "oldest_due":
                totals[key] = min(value, totals.get(key) or value)
            else:
                totals[key] = totals.get(key, 0) + value
    return totals


def _queue_row(row: dict[str, Any], now: datetime, changelist: str) -> dict[str, Any]:
    """A stats row with, for each status, its count and the changelist link showing it."""
    base = {"queue": row["queue"]} if row.get("queue") else {}
    oldest = row.get("oldest_due")
    return {
        **row,
        "counts": [
            {
                "status": status,
                "count": row.get(status, 0),
                "url": f"{changelist}?{urlencode({**base, 'status__exact': status})}",
            }
            for status in JobStatus.values
        ],
        "oldest_due_wait": short_duration(now - oldest) if oldest else "",
        "url": f"{changelist}?{urlencode(base)}",
    }


def worker_rows(now: datetime, limit: int = 50) -> list[dict[str, Any]]:
    """The most recently seen workers, with their state and how many jobs they hold."""
    held = dict(
        Job.objects.filter(status__in=IN_FLIGHT)
        .order_by()
        .values_list("worker_id")
        .annotate(count=Count("pk"))
    )
    stale_after = timedelta(seconds=conf.get_settings().STALE_AFTER)
    rows = []
    for record in WorkerRecord.objects.order_by("-heartbeat_at")[:limit]:
        if record.stopped_at is not None:
            state = _("stopped")
        elif now - record.heartbeat_at > stale_after:
            state = _("not responding")
        else:
            state = _("alive")
        rows.append(
            {
                "record": record,
                "state": state,
                "held": held.get(record.worker_id, 0),
                "last_seen": short_duration(now - record.heartbeat_at),
                "heartbeat_at": display_datetime(record.heartbeat_at),
                "started_at": display_datetime(record.started_at),
                "queues": ", ".join(record.queues) if record.queues else _("all"),
            }
        )
    return rows
