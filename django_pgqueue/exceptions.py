"""Exceptions raised by django-pgqueue, and the ones handlers raise to steer retries."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import Job


class PgQueueError(Exception):
    """Base class of every error django-pgqueue raises."""


class InvalidArgumentError(PgQueueError, ValueError):
    """An argument was rejected before anything was written or started.

    ``field`` names the offending argument (``"data"``, ``"priority"``, ...).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class InvalidJobError(InvalidArgumentError):
    """A job was rejected before anything was written (bad ``enqueue`` arguments)."""


class InvalidWorkerOptionError(InvalidArgumentError):
    """A worker option (concurrency, queues, ...) is invalid; nothing was started."""


class DuplicateJobError(PgQueueError):
    """``enqueue(..., unique_key=..., on_duplicate="raise")`` found an active job with
    that key (pending, claimed or running); nothing was inserted.

    ``unique_key`` is the key, ``job_id`` the existing job's id and ``job`` the existing
    ``Job`` as read at that moment.
    """

    def __init__(self, unique_key: str, job: Job) -> None:
        self.unique_key = unique_key
        self.job = job
        self.job_id = job.id
        super().__init__(
            f"unique_key {unique_key!r} is held by active job {job.id} ({job.status}); "
            "wait for it to finish, or pass on_duplicate='return' to get that job instead"
        )

    def __reduce__(self) -> tuple[type[DuplicateJobError], tuple[str, Job]]:
        return (type(self), (self.unique_key, self.job))


class JobRegistrationError(PgQueueError):
    """A handler could not be registered (for example, a job type registered twice)."""


class UnknownJobTypeError(PgQueueError, LookupError):
    """No handler is registered for a job type."""


class AsyncHandlerError(PgQueueError, TypeError):
    """A handler returned a coroutine or another awaitable: its body never ran, so the
    attempt fails (async handlers are not supported yet)."""


class UndecodableJobError(PgQueueError, ValueError):
    """A claimed job holds a value Python cannot read (a time outside years 1 to 9999,
    say), written outside enqueue's validation: the job fails without running."""


class SettingsError(PgQueueError):
    """The ``PGQUEUE`` setting is malformed."""


class MissingExtraError(PgQueueError, ImportError):
    """An optional feature was used without its optional dependency installed."""

    def __init__(self, feature: str, package: str, extra: str) -> None:
        super().__init__(
            f"{feature} needs {package}, which is not installed: "
            f"pip install 'django-pgqueue[{extra}]'"
        )


class FailJob(PgQueueError):
    """Raise from a handler to fail the job at once, without further retries."""


class TaskReturnValueError(FailJob, TypeError):
    """A Django Task returned a value that is not JSON: the job fails without a retry
    (running the task again would repeat its side effects for the same outcome)."""


class RetryJob(PgQueueError):
    """Raise from a handler to run the job again after ``delay``.

    The attempt counts towards ``max_attempts``: a job that keeps asking to be retried
    still ends ``failed`` once its attempts are spent.
    """

    def __init__(self, message: str = "", *, delay: float | timedelta = 0) -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if seconds < 0:
            raise ValueError(f"RetryJob delay must not be negative, got {seconds!r} seconds")
        self.delay_seconds = seconds
        super().__init__(message or f"retry requested in {seconds:g}s")


class JobCancelled(PgQueueError):
    """Raised inside a handler (by ``job.raise_if_cancel_requested()``) once cancellation
    was requested; the job then ends ``cancelled``."""


class JobTimeout(PgQueueError):
    """Raised inside a handler that ran past its ``timeout``."""
