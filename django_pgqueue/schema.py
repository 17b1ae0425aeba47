"""The shape of the jobs table, stated once: its limits and the states of a job.

A leaf module (it imports nothing of the package), so that validation, settings,
models, SQL builders and the admin all take their rules from here. The SQL functions
and partial indexes, which cannot import it, are checked against these sets by tests
(``tests/test_schema.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models
from django.utils.translation import gettext_lazy as _

#: Priorities accepted by ``enqueue``: higher runs first.
PRIORITY_MIN = 0
PRIORITY_MAX = 1000
JOB_TYPE_MAX_LENGTH = 200
QUEUE_MAX_LENGTH = 100
STAGE_MAX_LENGTH = 200
#: The longest error class kept (``Job.error_class``); a longer one is cut to it.
ERROR_CLASS_MAX_LENGTH = 200
#: The longest name of a durable step (``job.step(name, ...)``).
STEP_NAME_MAX_LENGTH = 200
#: The longest name of an event (``emit_event()``, ``job.wait_for_event()``).
EVENT_NAME_MAX_LENGTH = 200
UNIQUE_KEY_MAX_LENGTH = 255
CONCURRENCY_KEY_MAX_LENGTH = 255
MAX_ATTEMPTS_LIMIT = 1000
#: Largest concurrency limit accepted (``QUEUE_LIMITS``, ``JOB_TYPE_LIMITS``, ``@job``).
CONCURRENCY_LIMIT_MAX = 1_000_000
#: The longest delay accepted (``enqueue``, ``RetryJob``, ``Snooze``): a thousand years
#: keeps every ``run_at`` a Python ``datetime`` can hold (before the year 10000).
MAX_DELAY_SECONDS = 1000 * 365.25 * 86400
#: Largest ``PGQUEUE["MAX_SNOOZES"]`` accepted.
MAX_SNOOZES_LIMIT = 1_000_000
#: Every this many events, ``set_progress`` trims a job's history to this many newest
#: events, so a job keeps fewer than twice as many.
EVENTS_KEPT = 100
#: Job types of Django Tasks are this prefix and the task's dotted path (backends.py).
TASK_JOB_PREFIX = "task:"


class JobStatus(models.TextChoices):
    """The states of a job (the ``status`` column and its CHECK constraint).

    Also ``django_pgqueue.JobStatus``, a
    [``TextChoices``](https://docs.djangoproject.com/en/stable/ref/models/fields/#enumeration-types)
    enumeration. See [Design](../explanation/design.md#the-life-of-a-job) for the
    transitions.

    | Member | Value | Meaning |
    |---|---|---|
    | ``WAITING`` | ``"waiting"`` | Waits for the jobs it depends on (``depends_on``). |
    | ``PENDING`` | ``"pending"`` | Waiting to be claimed, at or after ``run_at``. |
    | ``CLAIMED`` | ``"claimed"`` | Taken by a worker, not started yet. |
    | ``RUNNING`` | ``"running"`` | A handler is running it. |
    | ``COMPLETED`` | ``"completed"`` | The handler returned. |
    | ``FAILED`` | ``"failed"`` | No attempts left, or ``FailJob``. Stays until retried. |
    | ``CANCELLED`` | ``"cancelled"`` | Cancelled before or while running. |
    """

    WAITING = "waiting", _("Waiting")
    PENDING = "pending", _("Pending")
    CLAIMED = "claimed", _("Claimed")
    RUNNING = "running", _("Running")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


#: States of a job that waits for the jobs it depends on: never claimed.
BLOCKED = frozenset({JobStatus.WAITING})
#: States a worker may claim a job in (when it is due).
CLAIMABLE = frozenset({JobStatus.PENDING})
#: States a worker holds a job in.
IN_FLIGHT = frozenset({JobStatus.CLAIMED, JobStatus.RUNNING})
#: States a job never leaves on its own.
FINISHED = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
#: States in which a job holds its ``unique_key`` (the partial unique index's predicate).
ACTIVE = CLAIMABLE | IN_FLIGHT
#: States a job can be put back to pending from (retry).
RETRYABLE = frozenset({JobStatus.FAILED, JobStatus.CANCELLED})
#: States a job is cancelled from at once (``cancel()``); jobs in flight are asked to stop.
CANCELLABLE = frozenset({JobStatus.WAITING, JobStatus.PENDING})


def _members(states: JobStatus | Iterable[str]) -> list[JobStatus]:
    """``states`` as members of the enum, in its order; ``ValueError`` for anything else."""
    chosen = {JobStatus(states)} if isinstance(states, str) else {JobStatus(s) for s in states}
    return [state for state in JobStatus if state in chosen]


def values(states: JobStatus | Iterable[str]) -> list[str]:
    """The values of ``states`` as plain strings, in the enum's order (for ORM filters
    and migrations, which compare lists)."""
    return [state.value for state in _members(states)]


def literal(state: JobStatus) -> str:
    """``state`` as an SQL literal, e.g. ``'pending'``.

    Only members of :class:`JobStatus` are accepted, so the text is safe to inline.
    """
    return f"'{JobStatus(state).value}'"


def status_in(states: JobStatus | Iterable[str], column: str = "status") -> str:
    """The SQL predicate "the job is in one of ``states``", for queries written as text.

    ``status_in(IN_FLIGHT)`` is ``status IN ('claimed', 'running')``; one state gives
    ``status = 'pending'``. Only states of :class:`JobStatus` are accepted (``ValueError``
    otherwise, or for none), so the text is safe to interpolate.
    """
    members = _members(states)
    if not members:
        raise ValueError("status_in needs at least one state")
    if len(members) == 1:
        return f"{column} = {literal(members[0])}"
    return f"{column} IN ({', '.join(map(literal, members))})"


class StepKind(models.TextChoices):
    """What a checkpoint of a job records (the ``kind`` of ``pgqueue_job_steps``): a
    step's result, a sleep, or a wait for an event.

    Also ``django_pgqueue.models.StepKind``.
    """

    STEP = "step", _("Step")
    SLEEP = "sleep", _("Sleep")
    EVENT = "event", _("Wait for an event")


def open_wait(table: str = "") -> str:
    """The SQL predicate "this checkpoint is a sleep or a wait for an event that is not
    over", whose job is suspended in it: a sleep before its end, a wait not received
    and not timed out. The one statement of that rule (the admin's job page,
    ``end_waits()``). ``table`` qualifies the columns (``"s"``: ``s.kind``).
    """
    at = f"{table}." if table else ""
    sleep, event = StepKind.SLEEP.value, StepKind.EVENT.value
    return (
        f"CASE {at}kind WHEN '{sleep}' THEN {at}wake_at > now() "
        f"WHEN '{event}' THEN {at}result IS NULL AND ({at}wake_at IS NULL OR {at}wake_at > now()) "
        "ELSE false END"
    )


class OnDependencyFailure(models.TextChoices):
    """What becomes of a job when a job it depends on fails for good or is cancelled.

    Also ``django_pgqueue.OnDependencyFailure``; ``enqueue(on_dependency_failure=...)``
    and ``Dependency(on_failure=...)`` take its values.

    | Member | Value | Meaning |
    |---|---|---|
    | ``CANCEL`` | ``"cancel"`` | The job is cancelled (and what depends on it so). |
    | ``RUN`` | ``"run"`` | The job runs once its other dependencies are done. |
    | ``RUN_ONLY`` | ``"run_only"`` | As ``RUN``, but only after a failure (see below). |

    Retrying the failed or cancelled dependency puts the jobs it cancelled back to
    ``waiting``. A job with ``"run_only"`` dependencies runs only if one of them failed
    or was cancelled: when they all completed, it is cancelled as not needed (the
    ``on_failure`` callback of a [batch](../how-to/workflows.md#batches)).
    """

    CANCEL = "cancel", _("Cancel")
    RUN = "run", _("Run anyway")
    RUN_ONLY = "run_only", _("Run only then")


def edge_resolved(on_failure: str, status: str) -> bool:
    """Whether a dependency with this failure policy no longer holds its dependent back
    while the job it names has this status: when that job completed, or, under ``"run"``
    or ``"run_only"``, failed or was cancelled. The SQL function
    ``pgqueue_edge_resolved`` states the same rule (a test holds them together)."""
    return status == JobStatus.COMPLETED or (
        on_failure != OnDependencyFailure.CANCEL
        and status in (JobStatus.FAILED, JobStatus.CANCELLED)
    )
