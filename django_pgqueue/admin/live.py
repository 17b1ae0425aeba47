"""The live endpoint: the current state of the jobs a page shows, polled by its script.

``static/django_pgqueue/admin/jobs.js`` asks for the jobs on the page (``?id=``) and,
on a job's page, its newest progress events (``?history=``), and updates the cells.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, JsonResponse

from ..models import Job, JobEvent
from ..schema import FINISHED
from .base import JobModelAdmin
from .formatting import display_datetime, status_label, time_state

#: Events shown on a job's page and returned by the live endpoint.
HISTORY_SHOWN = 50
#: Most job ids one live request may ask about.
LIVE_MAX_IDS = 200
#: The columns the live refresh reads.
LIVE_FIELDS = (
    "id",
    "status",
    "progress",
    "current_stage",
    "attempts",
    "max_attempts",
    "worker_id",
    "started_at",
    "completed_at",
    "last_error",
    "events_count",
    "cancel_requested_at",
)


class LiveView(JobModelAdmin):
    """``JobAdmin.live_view``, mounted at ``live/``."""

    def live_view(self, request: HttpRequest) -> JsonResponse:
        """The state of the jobs named by ``?id=``, for the pages' live refresh.

        ``?history=<id>`` adds that job's recent progress events.
        """
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            ids = {uuid.UUID(value) for value in request.GET.getlist("id")}
            history = request.GET.get("history")
            history_id = uuid.UUID(history) if history else None
        except ValueError:
            return JsonResponse({"error": "id and history must be job ids (UUIDs)"}, status=400)
        if len(ids) > LIVE_MAX_IDS:
            return JsonResponse({"error": f"at most {LIVE_MAX_IDS} ids at once"}, status=400)
        jobs = self.get_queryset(request).filter(pk__in=ids).only(*LIVE_FIELDS)
        payload: dict[str, Any] = {"jobs": [live_state(job) for job in jobs]}
        if history_id is not None:
            payload["history"] = [event_state(event) for event in recent_events(history_id)]
        return JsonResponse(payload)


def live_state(job: Job) -> dict[str, Any]:
    """What the live refresh shows of ``job`` (only ``LIVE_FIELDS`` are read)."""
    return {
        "id": str(job.pk),
        "status": job.status,
        "status_label": status_label(job),
        "finished": job.status in FINISHED,
        "progress": job.progress,
        "current_stage": job.current_stage,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "worker_id": job.worker_id,
        "started_at": time_state(job.attempt_started_at),
        "completed_at": time_state(job.completed_at),
        "last_error": job.last_error,
        "events_count": job.events_count,
    }


def recent_events(job_id: uuid.UUID | str) -> list[JobEvent]:
    """The job's newest ``HISTORY_SHOWN`` progress events, oldest first."""
    events = list(JobEvent.objects.filter(job_id=job_id).order_by("-id")[:HISTORY_SHOWN])
    return events[::-1]


def event_state(event: JobEvent) -> dict[str, Any]:
    """One progress event as the history table and the live endpoint show it."""
    return {
        "created_at": display_datetime(event.created_at),
        # Events recorded before they had an attempt show none.
        "attempt": "" if event.attempt is None else event.attempt,
        "progress": event.progress,
        "stage": event.stage,
    }
