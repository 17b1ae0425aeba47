"""The queue overview page and its pause and resume buttons.

Every figure on the page comes from one :func:`django_pgqueue.stats.snapshot` (with its
totals), the read model ``pgqueue_status`` and the metrics format too; this module
only arranges it into rows and links. The table lists the queues with jobs, a pause or
a limit; a queue that only a worker names shows in that worker's row.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _

from .. import rollups, stats, validation
from ..exceptions import InvalidArgumentError
from ..models import ConcurrencyLimit, QueueState, RateLimit
from ..queues import known_queues, pause_queue, resume_queue
from ..schema import IN_FLIGHT, JobStatus
from ..stats import QueueStats, WorkerState, WorkerStats
from .base import JobAdminBase
from .filters import recent_values
from .formatting import TEMPLATES, display_datetime, short_duration

#: Most workers listed (the newest heartbeats first, after the state).
WORKERS_SHOWN = 50
#: Jobs a worker's page lists; the page says when it holds more.
JOBS_SHOWN = 50
#: Seconds between the overview's reloads.
REFRESH_SECONDS = 30
#: The states the overview counts, a column each: completed and cancelled jobs are
#: counted over the last hour and day instead (``stats.QueueStats.jobs_by_status()``).
COUNTED = (
    JobStatus.WAITING,
    JobStatus.PENDING,
    JobStatus.CLAIMED,
    JobStatus.RUNNING,
    JobStatus.FAILED,
)


class QueueOverview(JobAdminBase):
    """``JobAdmin.overview_view`` (``overview/``) and ``queue_action_view``."""

    def queue_action_view(self, request: HttpRequest, queue: str, action: str) -> HttpResponse:
        """Pause or resume one queue (the overview's buttons), then go back to the overview."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and self.has_retry_permission(request)):
            raise PermissionDenied
        if action not in ("pause", "resume"):
            return self._not_found(request, _("No queue action “%s”.") % action)
        try:
            validation.queue(queue)
        except InvalidArgumentError:
            return self._not_found(request, _("No queue “%s”.") % queue)
        if action == "pause" and not queue_exists(queue):
            # Paused, it would show on the overview as a queue, and nothing would run it.
            unknown = _("No queue “%s”: no job, job type, worker or setting names it.")
            return self._not_found(request, unknown % queue)
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
        self._report(request, message % queue, int(changed))
        if changed:
            state = QueueState.objects.filter(name=queue).first()
            self._audit(
                request,
                [state] if state else [],
                _("Paused.") if action == "pause" else _("Resumed."),
            )
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:django_pgqueue_job_overview"))

    def overview_view(self, request: HttpRequest) -> TemplateResponse:
        """Counts per queue and status, throughput, waiting time, and the workers."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        shot = stats.snapshot(totals=True)
        changelist = reverse(f"{self.admin_site.name}:django_pgqueue_job_changelist")
        edit = {
            "limit": self._limit_urls(request, ConcurrencyLimit),
            "rate_limit": self._limit_urls(request, RateLimit),
        }
        context = {
            **self.admin_site.each_context(request),
            "title": _("Queue overview"),
            "opts": self.opts,
            "now": display_datetime(shot.taken_at),
            "statuses": [(status.value, status.label) for status in COUNTED],
            "queues": [
                queue_row(queue, changelist) | self._queue_state(request, queue, edit)
                for queue in shot.queues
                if queue.has_jobs
                or queue.paused
                or queue.max_running is not None
                or queue.rate_limit is not None
            ],
            "totals": queue_row(shot.all_queues(), changelist),
            "workers": [
                worker_row(worker, shot.taken_at) for worker in shot.workers[:WORKERS_SHOWN]
            ],
            "changelist_url": changelist,
            "charts_url": reverse(f"{self.admin_site.name}:django_pgqueue_job_charts"),
            "refresh": REFRESH_SECONDS,
        }
        return TemplateResponse(request, f"{TEMPLATES}/overview.html", context)

    def worker_view(self, request: HttpRequest, worker_id: str) -> HttpResponse:
        """One worker: what it serves, its heartbeat, and the jobs it holds now."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        found = stats.worker(worker_id)
        if found is None:
            return self._not_found(
                request, _("No worker “%s” has reported in the last day.") % worker_id
            )
        worker, taken_at = found
        held = (
            self.get_queryset(request)
            .filter(worker_id=worker_id, status__in=IN_FLIGHT)
            .order_by("claimed_at", "id")[: JOBS_SHOWN + 1]
        )
        jobs = [
            {
                "id": job.pk,
                "url": reverse(f"{self.admin_site.name}:django_pgqueue_job_change", args=[job.pk]),
                "job_type": job.job_type,
                "queue": job.queue,
                "status": job.get_status_display(),
                "cancel_requested": job.cancel_requested_at is not None,
                "attempts": job.attempts,
                "progress": job.progress,
                "started": display_datetime(job.attempt_started_at),
            }
            for job in held
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": _("Worker %s") % worker_id,
            "opts": self.opts,
            "worker": worker_row(worker, taken_at),
            "jobs": jobs[:JOBS_SHOWN],
            "more": len(jobs) > JOBS_SHOWN,
            "now": display_datetime(taken_at),
            "changelist_url": reverse(f"{self.admin_site.name}:django_pgqueue_job_changelist"),
        }
        return TemplateResponse(request, f"{TEMPLATES}/worker.html", context)

    def _limit_urls(
        self, request: HttpRequest, model: type[ConcurrencyLimit] | type[RateLimit]
    ) -> Callable[[str], str] | None:
        """For a user who may change ``model``'s limits: the page that edits a queue's
        limit (its change form, or the add form for the queue); else None."""
        model_admin = self.admin_site._registry.get(model)
        if model_admin is None or not model_admin.has_change_permission(request):
            return None
        info = f"{self.admin_site.name}:{model._meta.app_label}_{model._meta.model_name}"
        existing = dict(model.objects.filter(scope="queue").values_list("name", "pk"))
        may_add = model_admin.has_add_permission(request)

        def url(queue: str) -> str:
            if queue in existing:
                return reverse(f"{info}_change", args=[existing[queue]])
            if may_add:
                return f"{reverse(f'{info}_add')}?{urlencode({'scope': 'queue', 'name': queue})}"
            return ""

        return url

    def _queue_state(
        self,
        request: HttpRequest,
        queue: QueueStats,
        edit: dict[str, Callable[[str], str] | None],
    ) -> dict[str, Any]:
        """The queue's pause state and limits with the pages that edit them, and its
        pause or resume button."""
        action = "resume" if queue.paused else "pause"
        button = {
            "label": _("Resume") if queue.paused else _("Pause"),
            "url": reverse(
                f"{self.admin_site.name}:django_pgqueue_job_queue_action",
                args=[queue.name, action],
            ),
        }
        return {
            "paused_at": display_datetime(queue.paused_at),
            "limit": queue.max_running,
            "rate_limit": queue.rate_limit,
            **{f"{name}_url": url(queue.name) if url else "" for name, url in edit.items()},
            "queue_action": button if self.has_retry_permission(request) else None,
        }


def queue_exists(name: str) -> bool:
    """Whether anything names queue ``name``: the queues ``pgqueue_queue list`` shows,
    the queues of the newest jobs, or of jobs finished within the rollups' retention
    (never a search of the whole jobs table)."""
    return (
        name in known_queues()
        or name in recent_values("queue")
        or name in rollups.rolled_up_names()[0]
    )


# The changelist's filter of the pending jobs held back by a per-key limit.
_HELD = {"status__exact": JobStatus.PENDING.value, "held__exact": "1"}


def queue_row(queue: QueueStats, changelist: str) -> dict[str, Any]:
    """A queue's figures as the table shows them, each count linked to its jobs.

    ``queue.name == ""`` is the row of all queues (:meth:`Snapshot.all_queues`).
    """
    base = {"queue": queue.name} if queue.name else {}
    by_status = queue.jobs_by_status()
    age = queue.oldest_pending_age_seconds
    return {
        "queue": queue.name or None,
        **{status.value: by_status[status] or 0 for status in COUNTED},
        "delayed": queue.scheduled,
        "held": queue.held,
        "held_url": f"{changelist}?{urlencode({**base, **_HELD})}",
        "oldest_due_wait": short_duration(timedelta(seconds=age)) if age is not None else "",
        "completed_last_minute": queue.completed_last_minute,
        "failed_last_minute": queue.failed_last_minute,
        "cancelled_last_minute": queue.cancelled_last_minute,
        "completed_last_hour": queue.completed_last_hour or 0,
        "failed_last_hour": queue.failed_last_hour or 0,
        "cancelled_last_hour": queue.cancelled_last_hour or 0,
        "completed_last_day": queue.completed_last_day or 0,
        "failed_last_day": queue.failed_last_day or 0,
        "counts": [
            {
                "status": status.value,
                "count": by_status[status] or 0,
                "url": f"{changelist}?{urlencode({**base, 'status__exact': status.value})}",
            }
            for status in COUNTED
        ],
        "url": f"{changelist}?{urlencode(base)}",
    }


def worker_row(worker: WorkerStats, taken_at: datetime) -> dict[str, Any]:
    """A worker as the tables show it, its last heartbeat measured at ``taken_at``."""
    return {
        "record": worker,
        "state": WorkerState(worker.state).label,
        # The leader alone recovers, prunes, writes the rollups and enqueues periodic
        # jobs: the worker to look at when that work stops.
        "leads": worker.leads,
        "held": worker.running,
        "last_seen": short_duration(taken_at - worker.heartbeat_at),
        "heartbeat_at": display_datetime(worker.heartbeat_at),
        "started_at": display_datetime(worker.started_at),
        "stopped_at": display_datetime(worker.stopped_at),
        "queues": ", ".join(worker.queues) if worker.queues else _("all"),
        "job_types": ", ".join(worker.job_types) if worker.job_types else _("all"),
        "url": reverse("admin:django_pgqueue_job_worker", args=[worker.worker_id]),
    }
