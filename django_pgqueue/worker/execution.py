"""Running one job's handler and turning what happened into an ``Outcome``."""

from __future__ import annotations

import inspect
import json
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg
from django.db import OperationalError, connections, transaction
from psycopg import pq

from .. import conf, registry, signals, steps, tracing
from ..backoff import default_backoff
from ..exceptions import (
    AsyncHandlerError,
    FailJob,
    JobCancelled,
    JobSuspended,
    JobTimeout,
    RetryJob,
    Snooze,
    UnknownJobTypeError,
)
from ..logfields import job_fields
from ..response_watch import guard
from ..schema import MAX_DELAY_SECONDS, JobStatus
from . import finishing

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from ..models import Job
    from ..registry import JobDefinition

logger = logging.getLogger("django_pgqueue.worker")


# Outcome statuses as plain strings (the enum's values): they are counted in dicts,
# logged, and dumped by psycopg with the rest of an outcome.
PENDING = JobStatus.PENDING.value
COMPLETED = JobStatus.COMPLETED.value
FAILED = JobStatus.FAILED.value
CANCELLED = JobStatus.CANCELLED.value

# The kinds of slots (RunningJob.kind).
THREAD = "thread"
LOOP = "loop"
PROCESS = "process"


@dataclass
class Outcome:
    """What to write for a job once its run is over; ``status`` is the new status."""

    job_id: uuid.UUID
    status: str
    #: The ``claimed_at`` of the claim whose run this outcome ends: the outcome is
    #: recorded only while that claim holds the job, never over a later claim of it (by
    #: the same worker, after recovery took it back). ``None``: never recorded.
    claimed_at: datetime | None
    delay: float = 0.0
    refund: int = 0
    error: str | None = None
    traceback: str | None = None
    result: str | None = None
    #: ``time.monotonic()`` when the handler started, to record as ``started_at``
    #: (None: the claim's ``started_at`` stays). Written as the seconds since then, on
    #: the database's clock: a worker's wall clock may run fast or slow.
    started: float | None = None
    #: 1 when the handler snoozed the job (``snoozes`` goes up by one), else 0.
    snoozed: int = 0
    #: 1 when the handler slept or began waiting for an event (``JobSuspended``).
    suspended: int = 0
    #: Handed back before its handler started: it keeps no start time, and the room its
    #: rate limits counted for it goes back too (``pgqueue_rate_hand_back()``).
    unstarted: bool = False
    #: Already written, in the handler's own transaction (``record_in_transaction()``):
    #: the worker only counts it.
    recorded: bool = False
    #: What the handler raised, for the log record and the span (never stored or sent
    #: to another process: ``traceback`` is its text); dropped once logged.
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    def name(self) -> str:
        """How the run ended, in a word: ``completed``, ``retried``, ``snoozed``,
        ``suspended``, ``handed_back``, ``failed`` or ``cancelled`` (logs, spans)."""
        if self.status == PENDING:
            if self.snoozed:
                return "snoozed"
            if self.suspended:
                return "suspended"
            return "handed_back" if self.refund else "retried"
        return self.status


class CancelFlag:
    """Set once cancellation of a job was asked for; read by its handler.

    A plain attribute rather than a ``threading.Event``: nothing waits on it, and an
    Event (a Condition and a Lock) per job cost the worker's main loop measurably.
    Setting and reading one attribute is atomic across threads.
    """

    __slots__ = ("_set", "on_set")

    def __init__(self) -> None:
        self._set = False
        #: Called (in the setting thread) once set: an async job's cancels its task.
        self.on_set: Callable[[], None] | None = None

    def set(self) -> None:
        # Set, then read the callback; whoever attaches one writes it, then reads the
        # flag: one of the two always sees the other.
        self._set = True
        callback = self.on_set
        if callback is not None:
            callback()

    def is_set(self) -> bool:
        return self._set


@dataclass(eq=False, slots=True)
class RunningJob:
    """A job held by this worker, shared between the main loop and the slot running it."""

    job: Job
    definition: JobDefinition | None
    deadline: float | None = None
    cancel_event: CancelFlag = field(default_factory=CancelFlag)
    thread_id: int | None = None
    # Held while a timeout is injected and while the handler's thread lets go of the job:
    # an injected JobTimeout therefore always surfaces inside execute().
    thread_lock: threading.Lock = field(default_factory=threading.Lock)
    timeout_signalled_at: float | None = None
    abandoned: bool = False
    outcome: Outcome | None = None
    #: When a slot started the handler: ``time.time()`` and ``time.monotonic()``; None
    #: while the job waits in the worker's prefetch buffer.
    started_wall: float | None = None
    started_monotonic: float | None = None
    #: Seconds the handler ran, once it returned.
    duration: float | None = None
    #: Whether it went to the prefetch buffer, every slot being busy when it was claimed.
    buffered: bool = False
    #: ``time.monotonic()`` by which a slot must start it, or hand it back unstarted: a
    #: rate limit counted it as started then (the claim's ``p_start_within``).
    start_by: float | None = None
    #: Which kind of slot runs it: ``THREAD``, ``LOOP`` (the event loop, an async
    #: handler) or ``PROCESS`` (a child process, ``isolation="process"``).
    kind: str = "thread"

    @property
    def on_loop(self) -> bool:
        return self.kind == LOOP

    @property
    def timeout(self) -> float | None:
        """Seconds an attempt may run: the job's own timeout, else its type's."""
        own = self.job.timeout
        if own is not None:
            return own
        return self.definition.timeout if self.definition is not None else None

    def recorded_start(self) -> float | None:
        """What ``started_at`` becomes when the outcome is written: when a slot took
        the job (its ``time.monotonic()``), if from the prefetch buffer or under a
        start-by moment; ``None`` (the claim's time stays) for a job a free slot started
        at once."""
        return self.started_monotonic if self.buffered or self.start_by is not None else None

    def too_late_to_start(self) -> bool:
        """Whether its start-by moment has passed: starting it now could exceed the rate
        limit that counted it as started by then."""
        return self.start_by is not None and time.monotonic() > self.start_by


def handed_back(running: RunningJob) -> Outcome:
    """A job given back unstarted: ``pending`` and due at once, its attempt refunded
    and its room in its rate limits' windows given back."""
    return Outcome(running.job.id, PENDING, running.job.claimed_at, refund=1, unstarted=True)


def retry_or_fail(running: RunningJob, error: str, tb: str | None, delay: float | None) -> Outcome:
    """A failed attempt: ``pending`` again after ``delay`` (None: the job's backoff), or
    ``failed`` once its attempts are spent."""
    job = running.job
    if job.attempts >= job.max_attempts:
        return Outcome(job.id, FAILED, job.claimed_at, error=error, traceback=tb)
    if delay is None:
        definition = running.definition
        delay = (
            definition.retry_delay(job.attempts)
            if definition
            else default_backoff().delay(job.attempts)
        )
    return Outcome(job.id, PENDING, job.claimed_at, delay=float(delay), error=error, traceback=tb)


def failure_outcome(running: RunningJob, exc: BaseException) -> Outcome:
    """Decide what a handler's exception means: retry, fail now, or cancelled."""
    outcome = _failure_outcome(running, exc)
    outcome.exception = exc
    return outcome


def _failure_outcome(running: RunningJob, exc: BaseException) -> Outcome:
    job = running.job
    error = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, JobTimeout) and running.timeout:
        error = f"JobTimeout: ran past its timeout of {running.timeout:g}s"
    tb = "".join(traceback.format_exception(exc))
    if isinstance(exc, JobCancelled) or running.cancel_event.is_set():
        return Outcome(job.id, CANCELLED, job.claimed_at, error=error, traceback=tb)
    if isinstance(exc, FailJob):
        return Outcome(job.id, FAILED, job.claimed_at, error=error, traceback=tb)
    if isinstance(exc, JobSuspended):
        return Outcome(
            job.id, PENDING, job.claimed_at, delay=exc.delay_seconds, refund=1, suspended=1
        )
    if isinstance(exc, RetryJob | Snooze) and exc.delay_seconds > MAX_DELAY_SECONDS:
        error = (
            f"{error}: the delay is over the longest allowed, 1,000 years "
            f"({MAX_DELAY_SECONDS:.0f} seconds)"
        )
        return Outcome(job.id, FAILED, job.claimed_at, error=error, traceback=tb)
    if isinstance(exc, Snooze):
        return snooze_outcome(running, exc, error, tb)
    if isinstance(exc, RetryJob):
        return retry_or_fail(running, error, tb, exc.delay_seconds)
    return retry_or_fail(running, error, tb, None)


def snooze_outcome(running: RunningJob, exc: Snooze, error: str, tb: str) -> Outcome:
    """``pending`` again after the snooze's delay with this attempt given back, or
    ``failed`` when the job has already snoozed ``PGQUEUE["MAX_SNOOZES"]`` times."""
    job = running.job
    most = conf.get_settings().MAX_SNOOZES
    if job.snoozes >= most:
        error = (
            f"{error}, but the job has already snoozed {job.snoozes} time(s), the most "
            f"PGQUEUE['MAX_SNOOZES'] allows ({most})"
        )
        return Outcome(job.id, FAILED, job.claimed_at, error=error, traceback=tb)
    return Outcome(job.id, PENDING, job.claimed_at, delay=exc.delay_seconds, refund=1, snoozed=1)


def timeout_outcome(running: RunningJob) -> Outcome:
    """The outcome recorded for a job whose handler ignored its timeout."""
    timeout = running.timeout
    if running.on_loop:
        error = (
            f"JobTimeout: ran past its timeout of {timeout:g}s and kept the event loop "
            "blocked, so it could not be cancelled; its task was abandoned"
        )
    else:
        error = (
            f"JobTimeout: ran past its timeout of {timeout:g}s and did not stop when "
            "interrupted; the thread was abandoned"
        )
    return retry_or_fail(running, error, "", None)


def result_json(value: Any) -> tuple[str | None, str | None]:
    """The result to store, and a note when it cannot be: not JSON, or its JSON longer
    than a payload may be (``PGQUEUE["MAX_PAYLOAD_BYTES"]``): results are read back by
    the jobs that depend on it, and kept in the row the claim walks."""
    if value is None:
        return None, None
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return None, f"the return value was not stored: it is not JSON-serialisable ({exc})"
    limit = conf.get_settings().MAX_PAYLOAD_BYTES
    size = len(text)  # json.dumps escapes every non-ASCII character: one byte each
    if size > limit:
        return None, (
            f"the return value was not stored: its JSON is {size:,} bytes, more than "
            f"PGQUEUE['MAX_PAYLOAD_BYTES'] ({limit:,}); store large results elsewhere "
            "and return a reference"
        )
    return text, None


def _send(signal: Any, job: Job, **kwargs: Any) -> None:
    """Send a worker signal; a receiver's error is logged, never lets a job be lost."""
    if not signal.receivers or not signal.has_listeners(type(job)):
        return
    log_receiver_errors(signal.send_robust(sender=type(job), job=job, **kwargs), job)


def log_receiver_errors(responses: Iterable[tuple[Any, Any]], job: Job) -> None:
    """Log the errors of a robust send's receivers: none may let a job be lost."""
    for receiver, response in responses:
        if isinstance(response, Exception):
            logger.error(
                "signal receiver %r failed for job %s",
                receiver,
                job.id,
                exc_info=(type(response), response, response.__traceback__),
                extra=job_fields(job),
            )


def _failed(running: RunningJob, exc: BaseException) -> Outcome:
    outcome = failure_outcome(running, exc)
    if signalled_failure(outcome):
        _send(
            signals.job_failed,
            running.job,
            error=outcome.error,
            exception=exc,
            will_retry=outcome.status == PENDING,
        )
    return outcome


def signalled_failure(outcome: Outcome) -> bool:
    """Whether ``job_failed`` is sent for ``outcome``: a retry or a failure, not a
    snooze, a suspension or a cancellation."""
    return outcome.status in (PENDING, FAILED) and not (outcome.snoozed or outcome.suspended)


def mark_started(running: RunningJob) -> None:
    """Record that a slot starts ``running``'s handler now: its start times, the job's
    ``started_at`` when it is recorded, its deadline, and its cancel flag on the job."""
    job = running.job
    job._cancel_event = running.cancel_event
    running.started_wall = time.time()
    running.started_monotonic = time.monotonic()
    if running.recorded_start() is not None or job.started_at is None:
        job.started_at = datetime.fromtimestamp(running.started_wall, tz=UTC)
    timeout = running.timeout
    if timeout:
        running.deadline = running.started_monotonic + timeout


def execute(running: RunningJob, alias: str, *, in_worker: bool = True) -> Outcome:
    """Run the handler of ``running`` in this thread and return its outcome.

    ``in_worker=False`` (the test kit's ``run_job()``) leaves the thread's connections
    as they are after a failure: a test's connection is inside the test's transaction,
    which a worker would take for a connection the handler left broken.
    """
    if not conf.get_settings().OPENTELEMETRY:
        return _execute(running, alias, in_worker)
    with tracing.run_span(running.job) as span:
        outcome = _execute(running, alias, in_worker)
        end_span(span, outcome)
        return outcome


def end_span(span: Any, outcome: Outcome) -> None:
    """Record ``outcome`` on the span of its run."""
    tracing.end_run(span, outcome.name(), outcome.error, outcome.exception)


def _execute(running: RunningJob, alias: str, in_worker: bool) -> Outcome:
    job = running.job
    definition = running.definition
    if definition is None:
        exc = UnknownJobTypeError(
            f"no handler is registered for job type {job.job_type!r} on worker "
            f"{job.worker_id} (registered: {', '.join(registry.registered_job_types())})"
        )
        return _failed(running, exc)
    if running.cancel_event.is_set():
        # Cancelled while it waited in the prefetch buffer: never started.
        return Outcome(job.id, CANCELLED, job.claimed_at, error="cancelled before it started")
    if running.too_late_to_start():
        return handed_back(running)
    if in_worker:
        _LostConnections.check_since_last_seen()
    mark_started(running)
    assert running.started_monotonic is not None
    _send(signals.job_started, job)
    running.thread_id = threading.get_ident()
    recorded: Outcome | None = None
    try:
        try:
            if definition.atomic:
                with transaction.atomic(using=alias):
                    # Refused inside the transaction: what the handler wrote before
                    # returning the awaitable is rolled back with the failed attempt.
                    value = refuse_awaitable(definition(job), job)
                    if in_worker and definition.effectively_once:
                        recorded = record_in_transaction(running, alias, value)
            else:
                value = refuse_awaitable(definition(job), job)
        finally:
            with running.thread_lock:
                running.thread_id = None
            running.duration = time.monotonic() - running.started_monotonic
            steps.settle(job)
    except BaseException as exc:  # even sys.exit() in a handler must not kill the slot
        if in_worker:
            if _is_operational_error(exc):
                # Maybe a lost connection, which transaction.atomic may already have
                # replaced: the server may have cut the other slots' connections too.
                _LostConnections.found()
            _reset_broken_connections()
        return _failed(running, exc)
    _send(signals.job_completed, job, result=value)
    if recorded is not None:
        return recorded
    result, note = result_json(value)
    return Outcome(job.id, COMPLETED, job.claimed_at, result=result, error=note)


def record_in_transaction(running: RunningJob, alias: str, value: Any) -> Outcome | None:
    """Record the completion of ``running`` in its handler's transaction, if the handler
    used the database in it: its work and its completion then commit together, once (a
    worker that dies after the commit leaves the job completed, not running to be
    recovered and run again). Return the outcome written; None when the transaction has
    not begun (a handler that made no query), whose outcome the worker writes with the
    others of its batch. Raises ``JobLost``, rolling the handler's work back, when the
    attempt no longer holds the job."""
    job = running.job
    # The plain steps' checkpoints first: once the job is completed, they would be
    # refused (the attempt no longer holds a running job).
    steps.settle(job)
    connection = thread_connection(alias)
    raw = connection.connection
    # Read from libpq directly: this runs for every atomic handler, W3's no-ops too.
    if raw is None or raw.pgconn.transaction_status != _IN_TRANSACTION:
        return None
    result, note = result_json(value)
    outcome = Outcome(
        job.id,
        COMPLETED,
        job.claimed_at,
        result=result,
        error=note,
        started=running.recorded_start(),
    )
    assert job.worker_id is not None  # a claimed job's
    timeout = conf.get_settings().RESPONSE_TIMEOUT
    with connection.wrap_database_errors, guard(raw, timeout, "a handler's completion"):
        cursor = psycopg.Cursor(raw)
        statement = finishing.finish_statement([outcome], job.worker_id, in_transaction=True)
        cursor.execute(*statement, prepare=False)
        row = cursor.fetchone()
    # The job's id, or whether the attempt held it (finishing.finish_statement()).
    if not (row and row[0]):
        raise JobLost(
            f"job {job.id} is no longer held by worker {job.worker_id} (it was recovered "
            "meanwhile): the handler's transaction was rolled back"
        )
    outcome.recorded = True
    return outcome


_IN_TRANSACTION = int(pq.TransactionStatus.INTRANS)


class _ThreadConnections(threading.local):
    def __init__(self) -> None:
        self.by_alias: dict[str, BaseDatabaseWrapper] = {}


_thread_connections = _ThreadConnections()


def thread_connection(alias: str) -> BaseDatabaseWrapper:
    """``connections[alias]`` of this thread, looked up once per thread.

    Django keeps one wrapper per thread and alias for the thread's life (closing it
    closes the driver's connection, not the wrapper), and the lookup goes through
    asgiref's ``Local``: a cost on every job of a drain. Should Django replace the
    wrappers (a test changing ``DATABASES``), the kept one is idle: an outcome is then
    written by the worker, as for a handler that made no query.
    """
    by_alias = _thread_connections.by_alias
    connection = by_alias.get(alias)
    if connection is None:
        connection = by_alias[alias] = connections[alias]
    return connection


class JobLost(Exception):
    """The attempt lost its job before its handler's transaction committed."""


#: What handlers return most (None above all): never awaitable, and tested by type
#: alone, where ``inspect.isawaitable`` asks the ``Awaitable`` ABC on every call.
_PLAIN_RESULTS = frozenset({type(None), dict, list, str, int, float, bool})


def refuse_awaitable(value: Any, job: Job) -> Any:
    """Return ``value``, or raise ``AsyncHandlerError`` if it is a coroutine or another
    awaitable: the handler's body has not run, so the job must not complete."""
    if type(value) in _PLAIN_RESULTS or not inspect.isawaitable(value):
        return value
    if inspect.iscoroutine(value) or inspect.isgenerator(value):
        value.close()  # never to be awaited: no "coroutine ... was never awaited" warning
    name = getattr(value, "__qualname__", None)
    returned = f"{type(value).__name__} {name}" if isinstance(name, str) else type(value).__name__
    raise AsyncHandlerError(
        f"the handler of job type {job.job_type!r} returned an awaitable ({returned}) "
        "instead of doing its work. Declare the handler with async def, and the "
        "worker runs it on its event loop; or make it a plain function that calls its "
        "async code through asgiref.sync.async_to_sync"
    )


def suspect_lost_connections() -> None:
    """The main loop lost its own connection: the server may have cut every connection
    of this process (a restart, a failover, terminated backends), so each slot checks
    its connections before its next job instead of failing that job on a dead one."""
    _LostConnections.suspected()


class _LostConnections:
    """How many times this process found a connection cut by the server: a slot's,
    or the main loop's.

    When the server cuts one connection (a restart, terminated backends), the slots'
    idle connections are usually dead too, though nothing says so until they are used:
    each would fail its next job, and a job retried at once could fail on one dead
    connection after another, in one worker process after another, until its attempts
    ran out. So each slot checks its connections once before its next job after any
    connection of its process was found lost.
    """

    count = 0
    _seen = threading.local()

    @classmethod
    def found(cls) -> None:
        """Called in a slot whose handler failed with an OperationalError."""
        cls.count += 1  # a lost update across threads still changes it: enough
        cls._seen.count = cls.count

    @classmethod
    def suspected(cls) -> None:
        """Called by the main loop when it lost its own connection."""
        cls.count += 1

    @classmethod
    def check_since_last_seen(cls) -> None:
        count = cls.count
        if getattr(cls._seen, "count", 0) == count:
            return
        cls._seen.count = count
        for connection in connections.all(initialized_only=True):
            if connection.connection is not None and not connection.is_usable():
                connection.close()


def _is_operational_error(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is an OperationalError
    (lost connections among them), as Django or psycopg raise it."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, (OperationalError, psycopg.OperationalError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _reset_broken_connections() -> None:
    """Close this thread's connections that a failed handler left unusable.

    Unlike ``close_old_connections`` this ignores ``CONN_MAX_AGE``: a worker thread
    keeps its connection from job to job.
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if connection.get_autocommit() != connection.settings_dict["AUTOCOMMIT"]:
            connection.close()
        elif connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                connection.close()


def interrupt(running: RunningJob) -> bool:
    """Raise ``JobTimeout`` inside the thread running ``running`` (best effort).

    The exception arrives at the next Python bytecode; a thread blocked in C code
    (a socket read, ``time.sleep`` in some builds) sees it only when that call returns.
    """
    import ctypes

    running.timeout_signalled_at = time.monotonic()
    with running.thread_lock:
        if running.thread_id is None:
            return False
        changed = ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(running.thread_id), ctypes.py_object(JobTimeout)
        )
    return bool(changed)
