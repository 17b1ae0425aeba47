"""A job's attempt history as its page shows it: the attempts recorded in
``JobAttempt``, then the job's own current or completing attempt; and the checkpoints
of its durable steps."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone
from django.utils.translation import gettext as _

from ..models import AttemptOutcome, Job, JobAttempt, JobStep, StepKind
from ..schema import JobStatus, open_wait
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
    steps = list(
        JobStep.objects.filter(job_id=job.pk)
        .annotate(has_result=ExpressionWrapper(Q(result__isnull=False), BooleanField()))
        .order_by("id")[: STEPS_SHOWN + 1]
    )
    hidden = (
        JobStep.objects.filter(job_id=job.pk).count() - STEPS_SHOWN
        if len(steps) > STEPS_SHOWN
        else 0
    )
    now = timezone.now()
    rows = []
    for step in steps[:STEPS_SHOWN]:
        result = json.dumps(step.result)
        rows.append(
            {
                "name": step.name,
                "kind": StepKind(step.kind).label,
                "attempt": step.attempt,
                "started": display_datetime(step.started_at),
                "duration": ""
                if step.kind != StepKind.STEP
                else short_duration(step.completed_at - step.started_at),
                "state": _state(step, now),
                "result": result[:RESULT_SHOWN] + ("…" if len(result) > RESULT_SHOWN else "")
                if step.kind == StepKind.STEP or _received(step)
                else "",
            }
        )
    return rows, hidden


def _received(step: JobStep) -> bool:
    """Whether a wait's event was received: its result is JSON (``null`` for a payload
    of None, which the ORM reads as None too), not SQL NULL."""
    return bool(getattr(step, "has_result", step.result is not None))


def _state(step: JobStep, now: datetime) -> str:
    """A sleep's or a wait's state in words; "" for a step."""
    end = step.wake_at
    if step.kind == StepKind.SLEEP:
        assert end is not None
        if end > now:
            return _("sleeping until %s") % display_datetime(end)
        return _("slept until %s") % display_datetime(end)
    if step.kind == StepKind.EVENT:
        if _received(step):
            return _("received at %s") % display_datetime(step.completed_at)
        if end is None:
            return _("waiting, without a timeout")
        if end > now:
            return _("waiting until %s") % display_datetime(end)
        return _("timed out at %s") % display_datetime(end)
    return ""


def current_wait(job: Job) -> JobStep | None:
    """The sleep or wait ``job`` is suspended in now, if any: the newest one not over
    (``schema.open_wait()``). Read once per ``job`` object: the job page asks twice."""
    if "_current_wait" not in job.__dict__:
        is_open = ExpressionWrapper(RawSQL(open_wait(), ()), output_field=BooleanField())
        found = JobStep.objects.filter(is_open, job_id=job.pk).order_by("-id").first()
        job.__dict__["_current_wait"] = found
    step: JobStep | None = job.__dict__["_current_wait"]
    return step


def wait_summary(job: Job) -> str:
    """What a suspended ``job`` waits for, in words ("" when it does not)."""
    if job.status != JobStatus.PENDING:
        return ""
    step = current_wait(job)
    if step is None:
        return ""
    if step.kind == StepKind.SLEEP:
        assert step.wake_at is not None
        return _("Sleeping at “%(name)s” until %(end)s.") % {
            "name": step.name,
            "end": display_datetime(step.wake_at),
        }
    if step.wake_at is None:
        return _("Waiting for event “%s”, without a timeout.") % step.name
    return _("Waiting for event “%(name)s” until %(end)s.") % {
        "name": step.name,
        "end": display_datetime(step.wake_at),
    }
