"""Exceptions raised by django-pgqueue, and the ones handlers raise to steer retries.

```text
Exception
└── PgQueueError
    ├── InvalidArgumentError (also a ValueError)
    │   ├── InvalidJobError
    │   └── InvalidWorkerOptionError
    ├── DuplicateJobError
    ├── JobRegistrationError
    ├── UnknownJobTypeError (also a LookupError)
    ├── AsyncHandlerError (also a TypeError)
    ├── UndecodableJobError (also a ValueError)
    ├── SettingsError
    ├── MissingExtraError (also an ImportError)
    ├── FailJob
    │   └── TaskReturnValueError (also a TypeError)
    ├── RetryJob
    ├── Snooze
    ├── JobCancelled
    ├── JobTimeout
    ├── StepError
    ├── EventTimeout (also a TimeoutError)
    ├── JobNotFoundError (also a LookupError)
    └── JobNotCompletedError
        ├── JobFailedError
        ├── CancelledJobError
        └── WaitTimeoutError (also a TimeoutError)
BaseException
└── JobSuspended (raised by job.sleep() and job.wait_for_event(); let it through)
```

The ones used most are also exported by ``django_pgqueue``.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import Job

__all__ = [
    "AsyncHandlerError",
    "CancelledJobError",
    "DuplicateJobError",
    "EventTimeout",
    "FailJob",
    "InvalidArgumentError",
    "InvalidJobError",
    "InvalidWorkerOptionError",
    "JobCancelled",
    "JobFailedError",
    "JobNotCompletedError",
    "JobNotFoundError",
    "JobRegistrationError",
    "JobSuspended",
    "JobTimeout",
    "MissingExtraError",
    "PgQueueError",
    "RetryJob",
    "SettingsError",
    "Snooze",
    "StepError",
    "TaskReturnValueError",
    "UndecodableJobError",
    "UnknownJobTypeError",
    "WaitTimeoutError",
]


class PgQueueError(Exception):
    """Base class of every error django-pgqueue raises."""


class InvalidArgumentError(PgQueueError, ValueError):
    """An argument was rejected before anything was written or started.

    ``field`` names the offending argument (``"data"``, ``"priority"``, ...).

    Also a ``ValueError``. ``field`` may name a spec's key (``"specs[2].queue"``) or a
    worker option (``"concurrency"``); the message starts with it
    (``"<field>: <message>"``). Catch it to handle both subclasses.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class InvalidJobError(InvalidArgumentError):
    """A job was rejected before anything was written (bad ``enqueue`` arguments).

    Raised by ``enqueue()``, ``enqueue_many()``, ``@job(...)`` and
    ``job.set_progress()`` for invalid arguments.
    """


class InvalidWorkerOptionError(InvalidArgumentError):
    """A worker option (concurrency, queues, ...) is invalid; nothing was started.

    Raised by [`Worker`][django_pgqueue.worker.Worker]; ``field`` is one of
    ``"queues"``, ``"job_types"``, ``"concurrency"``, ``"prefetch"``, ``"batch_size"``,
    ``"poll_interval"``, ``"shutdown_grace"``, ``"worker_id"``.
    """


class DuplicateJobError(PgQueueError):
    """``enqueue(..., unique_key=..., on_duplicate="raise")`` found a job holding that
    key: an active one (pending, claimed or running), or, with ``unique_for``, one
    enqueued within that window; nothing was inserted.

    ``unique_key`` is the key, ``job_id`` the existing job's id and ``job`` the existing
    ``Job`` as read at that moment; ``window`` is the ``unique_for`` in seconds when the
    holder is a finished job within it, else ``None``.

    Also raised by ``enqueue_many(..., on_duplicate="raise")``.
    """

    def __init__(self, unique_key: str, job: Job, *, window: float | None = None) -> None:
        self.unique_key = unique_key
        self.job = job
        self.job_id = job.id
        self.window = window
        if window is None:
            held = f"is held by active job {job.id} ({job.status}); wait for it to finish"
        else:
            held = (
                f"is held by job {job.id} ({job.status}), enqueued within unique_for "
                f"({window:g}s); wait for the window to pass"
            )
        super().__init__(
            f"unique_key {unique_key!r} {held}, or pass on_duplicate='return' to get that "
            "job instead"
        )

    def __reduce__(self) -> Any:
        return (_rebuild_duplicate, (self.unique_key, self.job, self.window))


def _rebuild_duplicate(unique_key: str, job: Job, window: float | None) -> DuplicateJobError:
    """Unpickle a ``DuplicateJobError`` (its ``window`` is keyword-only)."""
    return DuplicateJobError(unique_key, job, window=window)


class JobRegistrationError(PgQueueError):
    """A handler could not be registered (for example, a job type registered twice)."""


class UnknownJobTypeError(PgQueueError, LookupError):
    """No handler is registered for a job type.

    A worker that claims such a job fails the attempt with this error, and the job is
    retried like after any other failure.
    """


class AsyncHandlerError(PgQueueError, TypeError):
    """A handler returned a coroutine or another awaitable: its body never ran, so the
    attempt fails (async handlers are not supported yet).

    The worker closes the coroutine unawaited, fails the attempt with this error (rolling
    back what an atomic handler wrote) and retries the job like after any other failure,
    so it ends ``failed``, never ``completed``. Make the handler a plain function; to call
    async code from it, wrap that code with ``asgiref.sync.async_to_sync``.
    """


class UndecodableJobError(PgQueueError, ValueError):
    """A claimed job holds a value Python cannot read (a time outside years 1 to 9999,
    say), written outside enqueue's validation: the job fails without running.

    Such values are a time outside years 1 to 9999 (``infinity``, or a year 10000 once
    converted to UTC) or JSON with a number of more digits than Python's ``int``
    accepts; only SQL written outside ``enqueue`` can store one. The worker fails that
    job at once, its ``last_error`` naming the column and the value; the rest of the
    claimed batch runs. Correct the value, then retry the job.
    """


class SettingsError(PgQueueError):
    """The ``PGQUEUE`` setting is malformed.

    Reported by the system check [`E001`](system-checks.md#e001).
    """


class MissingExtraError(PgQueueError, ImportError):
    """An optional feature was used without its optional dependency installed.

    See [Metrics](metrics.md#missingextraerror).
    """

    def __init__(self, feature: str, package: str, extra: str) -> None:
        super().__init__(
            f"{feature} needs {package}, which is not installed: "
            f"pip install 'django-pgqueue[{extra}]'"
        )


class FailJob(PgQueueError):
    """Raise from a handler to fail the job at once, without further retries.

    The job ends ``failed``. See [Handle failures and retries](../how-to/retries.md).
    """


class TaskReturnValueError(FailJob, TypeError):
    """A Django Task returned a value that is not JSON: the job fails without a retry
    (running the task again would repeat its side effects for the same outcome).

    Raised in the worker; see [Django Tasks backend](tasks-backend.md).
    """


class RetryJob(PgQueueError):
    """Raise from a handler to run the job again after ``delay``.

    The attempt counts towards ``max_attempts``: a job that keeps asking to be retried
    still ends ``failed`` once its attempts are spent.

    The job is retried after exactly ``delay`` (no jitter). ``delay_seconds`` holds it
    as a ``float``. Without a message, the error reads ``retry requested in <delay>s``.

    Args:
        message: The error recorded on the job.
        delay: Seconds or a ``timedelta``.

    Raises:
        ValueError: When ``delay`` is negative.
    """

    def __init__(self, message: str = "", *, delay: float | timedelta = 0) -> None:
        self.delay_seconds = _delay_seconds("RetryJob", delay)
        super().__init__(message or f"retry requested in {self.delay_seconds:g}s")


class Snooze(PgQueueError):
    """Raise from a handler to run the job again after ``delay``, without spending an
    attempt: the job is not ready yet, nothing failed.

    The job goes back to ``pending``, due after exactly ``delay``; its ``attempts`` stay
    as they were before this run and its ``snoozes`` count goes up by one (shown in the
    admin). ``last_error`` is left as it was. A job may snooze at most
    ``PGQUEUE["MAX_SNOOZES"]`` times (100 by default): snoozing once more fails it, with
    the reason as its error. Cancellation wins: a job asked to stop ends ``cancelled``.
    See [Snooze a job](../how-to/snooze.md).

    Args:
        delay: Seconds or a ``timedelta``; at most 1,000 years (a longer one fails the
            job with the reason as its error).

    Raises:
        ValueError: When ``delay`` is negative, not finite, or not a number of seconds
            or a ``timedelta``.
    """

    def __init__(self, delay: float | timedelta) -> None:
        self.delay_seconds = _delay_seconds("Snooze", delay)
        super().__init__(f"snoozed for {self.delay_seconds:g}s")


def _delay_seconds(what: str, delay: float | timedelta) -> float:
    """``delay`` in seconds; ``ValueError`` unless it is a finite, non-negative number of
    seconds or ``timedelta``."""
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise ValueError(
            f"{what} delay must be a number of seconds or a timedelta, got {type(delay).__name__}"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} delay must be finite and not negative, got {delay!r}")
    return seconds


class JobCancelled(PgQueueError):
    """Raised inside a handler (by ``job.raise_if_cancel_requested()``) once cancellation
    was requested; the job then ends ``cancelled``.

    A handler may raise it too. See [Cancel jobs](../how-to/cancel.md).
    """


class JobTimeout(PgQueueError):
    """Raised inside a handler that ran past its ``timeout``.

    The attempt fails and is retried like any other failure. See
    [Set timeouts](../how-to/timeouts.md).
    """


class StepError(PgQueueError):
    """A [durable step](../how-to/steps.md) was misused or could not be recorded.

    Raised by ``job.step()`` outside a running job, for a name already used in this
    attempt, and for an atomic step whose job is no longer held by this attempt (it
    was recovered or finished meanwhile): the step's writes are rolled back.
    """


class JobSuspended(BaseException):
    """Raised by ``job.sleep()`` and ``job.wait_for_event()`` to suspend the job: the
    worker sets it ``pending`` again, due when the sleep or the wait ends, without
    spending an attempt, and its slot goes to other jobs.

    It derives from ``BaseException``, as ``asyncio.CancelledError`` does, so that an
    ``except Exception:`` in the handler does not swallow it; let it propagate. Once
    the job resumes, its earlier steps return their checkpoints. See
    [Durable steps](../how-to/steps.md#sleep-for-days).

    Attributes:
        name: The sleep's or the wait's name.
        kind: ``"sleep"`` or ``"event"``.
        delay_seconds: Seconds until it ends on its own (the sleep's end, the wait's
            timeout).
    """

    def __init__(self, kind: str, name: str, delay_seconds: float) -> None:
        self.kind = kind
        self.name = name
        self.delay_seconds = delay_seconds
        what = "sleeping at" if kind == "sleep" else "waiting for event"
        super().__init__(kind, name, delay_seconds)
        self.message = f"{what} {name!r} for {delay_seconds:g}s"

    def __str__(self) -> str:
        return self.message


class EventTimeout(PgQueueError, TimeoutError):
    """Raised by ``job.wait_for_event()`` in the handler when the event was not emitted
    before the wait's timeout (or staff ended the wait from the admin).

    The wait stays timed out on later attempts, unless the event has been emitted by
    then: a retry then receives it.

    Attributes:
        event: The event's name.
    """

    def __init__(self, event: str, message: str) -> None:
        self.event = event
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.event, str(self)))


class JobNotFoundError(PgQueueError, LookupError):
    """Raised by ``Job.wait()`` and ``Job.await_result()`` for a job the jobs database
    does not hold: not committed yet (waiting inside the transaction that enqueued it),
    or deleted."""


class JobNotCompletedError(PgQueueError):
    """A job waited for (``Job.wait()``, ``Job.await_result()``) did not complete.

    Attributes:
        job_id: The job's id.
        error: Its ``last_error`` (``None`` for a wait that timed out).
    """

    def __init__(self, message: str, *, job_id: Any, error: str | None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.error = error


class JobFailedError(JobNotCompletedError):
    """The job waited for failed: its attempts ran out, or its handler raised
    ``FailJob``. The message quotes its last error. See
    [Wait for a job's result](../how-to/wait-for-results.md)."""


class CancelledJobError(JobNotCompletedError):
    """The job waited for was cancelled. Not to be confused with ``JobCancelled``, which
    a handler raises to end its own job cancelled."""


class WaitTimeoutError(JobNotCompletedError, TimeoutError):
    """The wait's ``timeout`` passed before the job finished. The job goes on: wait
    again, or cancel it. The message says its status and attempts so far."""
