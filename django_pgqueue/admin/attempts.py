"""A job's attempt history as its page shows it: the attempts recorded in
``JobAttempt``, then the job's own current or completing attempt; and the checkpoints
of its durable steps."""

from __future__ import annotations

import json
from typing import Any

from django.utils.translation import gettext as _

from ..models import AttemptOutcome, Job, JobAttempt, JobStep
from ..schema import JobStatus
from .formatting import display_datetime, short_duration

#: The most recent attempts shown; older ones are counted.
ATTEMPTS_SHOWN = 50
#: The first steps shown; later ones are counted.
STEPS_SHOWN = 50
#: How much of a step's JSON result is quoted.
RESULT_SHOWN = 200

# The job's own attempt is not in JobAttempt while it is held or once it completed it.
_OWN_ATTEMPT = {JobStatus.CLAIMED, JobStatus.RUNNING, JobStatus.COMPLETED}


def attempt_rows(job: Job) -> tuple[list[dict[str, Any]], int]:
    """The rows of ``job``'s attempt history, oldest first, and how many recorded
    attempts are left out (older than the newest ``ATTEMPTS_SHOWN``)."""
    recorded = JobAttempt.objects.filter(job_id=job.pk).order_by("-id")
    shown = list(recorded[:ATTEMPTS_SHOWN])[::-1]
    hidden = recorded.count() - ATTEMPTS_SHOWN if len(shown) == ATTEMPTS_SHOWN else 0
    rows = [_recorded_row(attempt) for attempt in shown]
    if job.status in _OWN_ATTEMPT and job.attempts:
        rows.append(_own_row(job))
    return rows, hidden


def _recorded_row(attempt: JobAttempt) -> dict[str, Any]:
    return {
        "number": attempt.attempt,
        "worker": attempt.worker_id,
        "started": display_datetime(attempt.started_at),
        "ended": display_datetime(attempt.ended_at),
        "duration": short_duration(attempt.ended_at - attempt.started_at)
        if attempt.started_at
        else "",
        "outcome": attempt.outcome,
        "outcome_label": AttemptOutcome(attempt.outcome).label,
        "error": attempt.error,
        "traceback": attempt.traceback,
    }


def _own_row(job: Job) -> dict[str, Any]:
    started = job.attempt_started_at
    end = job.completed_at
    return {
        "number": job.attempts,
        "worker": job.worker_id or "",
        "started": display_datetime(started),
        "ended": display_datetime(end),
        "duration": short_duration(end - started) if started and end else "",
        "outcome": job.status,
        "outcome_label": _("Completed") if job.status == JobStatus.COMPLETED else _("In progress"),
        "error": "",
        "traceback": "",
    }


def step_rows(job: Job) -> tuple[list[dict[str, Any]], int]:
    """The rows of ``job``'s completed steps in the order they ran, and how many more
    there are than ``STEPS_SHOWN``."""
    steps = list(JobStep.objects.filter(job_id=job.pk).order_by("id")[: STEPS_SHOWN + 1])
    hidden = (
        JobStep.objects.filter(job_id=job.pk).count() - STEPS_SHOWN
        if len(steps) > STEPS_SHOWN
        else 0
    )
    rows = []
    for step in steps[:STEPS_SHOWN]:
        result = json.dumps(step.result)
        rows.append(
            {
                "name": step.name,
                "attempt": step.attempt,
                "started": display_datetime(step.started_at),
                "duration": short_duration(step.completed_at - step.started_at),
                "result": result[:RESULT_SHOWN] + ("…" if len(result) > RESULT_SHOWN else ""),
            }
        )
    return rows, hidden
