"""Durable steps: ``job.step(name, func, ...)`` runs ``func`` once per job and name.

The first attempt that reaches a step calls the function and writes its JSON result as
a checkpoint (``pgqueue_job_steps``); every later attempt of the job returns the stored
result without calling it. A step that raised stores nothing and runs again next time.

Where the checkpoint is written decides what "once" means:

- A plain step writes it right after the function returns, committed on its own, so
  that a later failure that rolls the handler back keeps it. In a worker, the step
  hands it to the worker's ``CheckpointWriter`` and returns; the worker waits for it
  before recording the job's outcome (``settle()``). Elsewhere the step writes it on
  the caller's connection in autocommit, or through the side connection (``sideconn``)
  when the caller is inside a transaction. A worker killed between the function's
  return and that commit runs the step again: at least once.
- An atomic step (``atomic=True``) runs the function and writes the checkpoint in one
  transaction on the jobs database: the function's writes there and the checkpoint
  commit together, or neither does. Exactly once, for writes to the jobs database.

A checkpoint is written only while this attempt holds the job (its worker and attempt
number, as ``set_progress()`` checks): a job recovered and handed to another worker
meanwhile gets no checkpoint from the one that lost it.

Sleeps (``job.sleep()``) and waits for events (``job.wait_for_event()``) are
checkpoints too, which record when they end. Until then they raise ``JobSuspended``,
and the worker sets the job pending again, due at that moment, without spending an
attempt; the job's next run reaches the same sleep or wait and goes on past it. A wait
begins in ``pgqueue_await_event()`` (sql/events_v1.sql), ordered with the emitters of
its event so that neither misses the other.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import psycopg
from asgiref.sync import sync_to_async
from django.db import connections, transaction

from . import conf, validation
from .checkpoint_writer import CheckpointWriter
from .exceptions import EventTimeout, JobSuspended, StepError
from .schema import IN_FLIGHT, MAX_DELAY_SECONDS, StepKind
from .sideconn import fetch_autocommit

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .models import Job

T = TypeVar("T")

logger = logging.getLogger("django_pgqueue.steps")

# Every moment a checkpoint holds is the database's, never this host's clock, which may
# run fast or slow: a sleep's or a wait's end is read as the seconds left until it.
_CHECKPOINTS = """
SELECT job_id, name, result::text, kind, extract(epoch FROM wake_at - clock_timestamp())
  FROM pgqueue_job_steps
 WHERE job_id = ANY(%s)
"""

# Only while the same attempt holds the job: a worker that lost it writes nothing.
# Parameters: _params(); the last one says whether to commit without waiting for the
# disk (a checkpoint committed on its own: a plain step's, a sleep's). A database crash
# may lose the last such checkpoints, which only runs those steps again (plain steps are
# at least once); the commit of the job's outcome waits for the disk, and with it for
# every checkpoint written before, so a job never completes without its checkpoints.
# The end of a sleep is given as seconds from now, its start as seconds ago, both on the
# database's clock.
_CHECKPOINT = (
    "SELECT pgqueue_write_checkpoint(%s, %s, %s, %s, %s, %s::jsonb, "
    "clock_timestamp() + %s * interval '1 second', "
    "clock_timestamp() - %s * interval '1 second', %s)"
)

# The timeout of a new wait is given as seconds from now; returns the wait's payload
# (NULL: none yet) and the seconds left until it times out (NULL: no timeout).
_AWAIT = """
SELECT w.result, extract(epoch FROM w.wake_at - clock_timestamp())
  FROM pgqueue_await_event(%s, %s, %s, %s, clock_timestamp() + %s * interval '1 second',
                           clock_timestamp()) AS w
"""

_EMITTED = "SELECT payload::text FROM pgqueue_emitted_events WHERE name = %s"

#: A sleep or a wait this close to its end when the job runs again is over: the job is
#: made due at its end, and claimed a moment before the database's clock passes it.
_CLOCK_SLACK = 0.05


class Checkpoint(NamedTuple):
    """A stored checkpoint, as an attempt reads it."""

    #: The result's JSON (a wait's payload); None for a sleep, or a wait still waiting.
    result: str | None
    kind: str
    #: When a sleep ends or a wait times out, as a ``time.monotonic()`` of this process
    #: (read from the database's clock as the seconds left); None for none.
    wakes: float | None


def run_step(
    job: Job, name: str, func: Callable[..., Any], args: Any, kwargs: Any, atomic: bool
) -> Any:
    """``job.step()``: the stored result of step ``name``, or ``func(*args, **kwargs)``'s
    once its checkpoint is written."""
    name = validation.step_name(name)
    alias, stored = _begin(job, name, StepKind.STEP)
    if stored is not None:
        assert stored.result is not None
        return json.loads(stored.result)
    started = time.monotonic()
    if atomic:
        settle(job)  # the checkpoints handed before this one come first
        with transaction.atomic(using=alias):
            text = _result_json(func(*args, **kwargs))
            params = _params(job, name, StepKind.STEP, text, None, _since(started), unflushed=False)
            if job._store_steps and not _write(connections[alias], params):
                raise StepError(
                    f"job {job.id} is no longer held by this attempt (it was recovered or "
                    f"finished meanwhile): step {name!r} and its writes were rolled back"
                )
    else:
        text = _result_json(func(*args, **kwargs))
        if job._store_steps and not _hand_to_writer(job, alias, name, text, started):
            _write_now(alias, job, _params(job, name, StepKind.STEP, text, None, _since(started)))
    _checkpoints(job, alias)[name] = Checkpoint(text, StepKind.STEP, None)
    return json.loads(text)


async def arun_step(
    job: Job, name: str, func: Callable[..., Any], args: Any, kwargs: Any, atomic: bool
) -> Any:
    """``job.astep()``: ``run_step()`` for async code; ``func`` may be a coroutine
    function, awaited on the caller's event loop."""
    if not inspect.iscoroutinefunction(func):
        return await sync_to_async(run_step)(job, name, func, args, kwargs, atomic)
    if atomic:
        raise StepError(
            f"step {name!r} of job {job.id}: an atomic step runs a plain function in a "
            "database transaction, and Django runs no transaction across awaits; make "
            "the function sync, or the step not atomic"
        )
    name = validation.step_name(name)
    alias, stored = await sync_to_async(_begin)(job, name, StepKind.STEP)
    if stored is not None:
        assert stored.result is not None
        return json.loads(stored.result)
    started = time.monotonic()
    text = _result_json(await func(*args, **kwargs))
    if job._store_steps and not _hand_to_writer(job, alias, name, text, started):
        await sync_to_async(_write_now)(
            alias, job, _params(job, name, StepKind.STEP, text, None, _since(started))
        )
    _checkpoints(job, alias)[name] = Checkpoint(text, StepKind.STEP, None)
    return json.loads(text)


def sleep(job: Job, name: str, duration: float | timedelta) -> None:
    """``job.sleep()``: return once the sleep ``name`` of ``job`` has ended; until then
    raise ``JobSuspended`` to suspend the job until it ends."""
    name = validation.step_name(name)
    seconds = validation.delay(duration, "duration")
    alias, stored = _begin(job, name, StepKind.SLEEP)
    if stored is None:
        stored = Checkpoint(None, StepKind.SLEEP, time.monotonic() + seconds)
        if job._store_steps:
            _write_now(alias, job, _params(job, name, StepKind.SLEEP, None, seconds, 0.0))
        _checkpoints(job, alias)[name] = stored
    assert stored.wakes is not None
    left = stored.wakes - time.monotonic()
    if left > _CLOCK_SLACK:
        raise JobSuspended(StepKind.SLEEP, name, left)


def wait_for_event(job: Job, name: str, timeout: float | timedelta | None) -> Any:
    """``job.wait_for_event()``: the payload of the event ``name`` once it was emitted;
    until then ``JobSuspended``, and ``EventTimeout`` once ``timeout`` has passed."""
    name = validation.event_name(name)
    seconds = None if timeout is None else validation.delay(timeout, "timeout")
    alias, stored = _begin(job, name, StepKind.EVENT)
    if stored is not None and stored.result is not None:
        return json.loads(stored.result)
    # A wait already recorded keeps its timeout; a new one ends ``seconds`` from now.
    if job._store_steps:
        params = (job.id, job.worker_id, job.attempts, name, seconds)
        row = _fetch_now(alias, job, _AWAIT, params)
        if row is None:
            raise StepError(
                f"job {job.id} is no longer held by this attempt (it was recovered or "
                f"finished meanwhile): it cannot wait for event {name!r}"
            )
        result = row[0]
        wakes = None if row[1] is None else time.monotonic() + float(row[1])
    else:  # the test kit's run_job(): nothing is written
        with connections[alias].cursor() as cursor:
            cursor.execute(_EMITTED, [name])
            found = cursor.fetchone()
        result = None if found is None else found[0]
        new_end = None if seconds is None else time.monotonic() + seconds
        wakes = stored.wakes if stored is not None else new_end
    _checkpoints(job, alias)[name] = Checkpoint(result, StepKind.EVENT, wakes)
    if result is not None:
        return json.loads(result)
    if wakes is None:
        raise JobSuspended(StepKind.EVENT, name, MAX_DELAY_SECONDS)
    left = wakes - time.monotonic()
    if left > _CLOCK_SLACK:
        raise JobSuspended(StepKind.EVENT, name, left)
    raise EventTimeout(
        name, f"job {job.id} waited for event {name!r} until its timeout, and it was not emitted"
    )


def _begin(job: Job, name: str, kind: str) -> tuple[str, Checkpoint | None]:
    """Check that ``job`` may run the step, sleep or wait ``name`` now; return the jobs
    database and the stored checkpoint of ``name`` (None: none yet)."""
    if job.status not in IN_FLIGHT:
        raise StepError(
            f"job {job.id} is {job.status}: steps, sleeps and waits run inside the "
            "handler of a running job"
        )
    seen = job.__dict__.setdefault("_steps_seen", set())
    if name in seen:
        raise StepError(
            f"{name!r} was already used in this attempt of job {job.id}: give each step, "
            "sleep and wait of a job its own name"
        )
    seen.add(name)
    alias = conf.jobs_database(job._state.db)
    stored = _checkpoints(job, alias).get(name)
    if stored is not None and stored.kind != kind:
        raise StepError(
            f"{name!r} is a {_KIND_NAMES[stored.kind]} of job {job.id}, stored by an earlier "
            f"attempt, not a {_KIND_NAMES[kind]}: give each step, sleep and wait its own name"
        )
    return alias, stored


_KIND_NAMES: dict[str, str] = {
    StepKind.STEP: "step",
    StepKind.SLEEP: "sleep",
    StepKind.EVENT: "wait for an event",
}


def _checkpoints(job: Job, alias: str) -> dict[str, Checkpoint]:
    """The job's checkpoints by name, read once per attempt (with those of its batch,
    when the worker claimed it in one: ``share_reads()``)."""
    cached: dict[str, Checkpoint] | None = job.__dict__.get("_steps_stored")
    if cached is None:
        cached = {}
        if job._store_steps:
            batch: BatchReads | None = job.__dict__.get("_steps_batch")
            if batch is None:
                cached = _read_checkpoints([job.id], alias).get(job.id, {})
            else:
                cached = batch.take(job.id, alias)
        job.__dict__["_steps_stored"] = cached
    return cached


def _read_checkpoints(job_ids: list[Any], alias: str) -> dict[Any, dict[str, Checkpoint]]:
    found: dict[Any, dict[str, Checkpoint]] = {}
    with connections[alias].cursor() as cursor:
        cursor.execute(_CHECKPOINTS, [job_ids])
        rows = cursor.fetchall()
    read_at = time.monotonic()
    for job_id, name, result, kind, left in rows:
        wakes = None if left is None else read_at + float(left)
        found.setdefault(job_id, {})[name] = Checkpoint(result, kind, wakes)
    return found


class BatchReads:
    """The checkpoints of the jobs of one claim, read in one query when the first of
    them reaches a step, a sleep or a wait: a batch of jobs that resume (woken waits,
    retries) reads once instead of once a job.

    A job's checkpoints change only through the attempt that holds it, with two
    exceptions that a read made a little earlier does not miss: an event emitted for
    its wait (``wait_for_event()`` asks ``pgqueue_await_event()`` again when the read
    has no payload), and the admin ending a sleep or a wait (it makes the job due again
    if it was already claimed, and the next attempt reads afresh).
    """

    def __init__(self, job_ids: list[Any]) -> None:
        self._job_ids = job_ids
        self._lock = threading.Lock()
        self._read: dict[Any, dict[str, Checkpoint]] | None = None

    def __reduce__(self) -> tuple[type[BatchReads], tuple[list[Any]]]:
        # A job sent to a child process (isolation="process") reads its own there.
        return (BatchReads, ([],))

    def take(self, job_id: Any, alias: str) -> dict[str, Checkpoint]:
        """The checkpoints of ``job_id``, read with the batch's the first time."""
        with self._lock:
            if self._read is None:
                self._read = _read_checkpoints(self._job_ids or [job_id], alias)
            return self._read.pop(job_id, {})


def prepare_claimed(jobs: list[Job], writer: CheckpointWriter | None) -> None:
    """Have the jobs of one claim read their checkpoints together (``BatchReads``) and
    hand their plain steps' checkpoints to their worker's ``writer`` (None: each step
    writes its own)."""
    batch = BatchReads([job.id for job in jobs]) if len(jobs) > 1 else None
    for job in jobs:
        if writer is not None:
            job.__dict__["_steps_writer"] = writer
        if batch is not None:
            job.__dict__["_steps_batch"] = batch


def _hand_to_writer(job: Job, alias: str, name: str, text: str, started: float) -> bool:
    """Hand a plain step's checkpoint to the job's worker's writer; whether it took it.
    The worker waits for it before recording the job's outcome (``settle()``)."""
    writer: CheckpointWriter | None = job.__dict__.get("_steps_writer")
    if writer is None or writer.alias != alias:
        return False
    ticket = writer.hand(job.id, job.worker_id, job.attempts, name, text, started, time.monotonic())
    if ticket is None:
        return False
    job.__dict__["_steps_ticket"] = ticket
    return True


#: How long the worker waits for a handler's checkpoints before it records the job's
#: outcome anyway (a checkpoint written later is refused: the attempt no longer holds
#: the job, and its step runs again if the job is retried).
SETTLE_SECONDS = 30.0


def unsettled(job: Job) -> bool:
    """Whether ``job``'s handler handed checkpoints to its worker's writer that
    ``settle()`` has not waited for."""
    return "_steps_ticket" in job.__dict__


def settle(job: Job) -> None:
    """Wait until the checkpoints that ``job``'s handler handed to its worker's writer
    are written: the worker calls it when the handler has ended, before the outcome,
    and a checkpoint written by the handler itself (an atomic step's, a sleep's, a
    wait's) after them, so that a job's checkpoints follow the order of its steps."""
    ticket: int | None = job.__dict__.pop("_steps_ticket", None)
    if ticket is None:
        return
    writer: CheckpointWriter = job.__dict__["_steps_writer"]
    if not writer.wait(ticket, SETTLE_SECONDS):
        logger.warning(
            "job %s: its step checkpoints were not written within %g s; its outcome is "
            "recorded without waiting longer (a step whose checkpoint is lost runs again "
            "if the job is retried)",
            job.id,
            SETTLE_SECONDS,
        )


def _result_json(value: Any) -> str:
    return validation.json_value(value, "result", max_bytes=conf.get_settings().MAX_PAYLOAD_BYTES)


def _params(
    job: Job,
    name: str,
    kind: str,
    text: str | None,
    wake_in: float | None,
    started_ago: float,
    unflushed: bool = True,
) -> tuple[Any, ...]:
    """_CHECKPOINT's parameters: ``wake_in``, a sleep's seconds from now; ``started_ago``,
    the seconds since the step's function was called."""
    return (job.id, job.worker_id, job.attempts, name, kind, text, wake_in, started_ago, unflushed)


def _since(started: float) -> float:
    return time.monotonic() - started


def _write(connection: BaseDatabaseWrapper, params: tuple[Any, ...]) -> bool:
    """Write a checkpoint on ``connection``; whether the attempt still held the job."""
    connection.ensure_connection()
    with connection.wrap_database_errors:
        row = (
            psycopg.Cursor(connection.connection)
            .execute(_CHECKPOINT, params, prepare=False)
            .fetchone()
        )
        return bool(row is not None and row[0])


def _write_now(alias: str, job: Job, params: tuple[Any, ...]) -> None:
    """Commit a checkpoint now, whatever transaction the caller is in, after those its
    job handed to the writer before it."""
    settle(job)
    connection = connections[alias]
    if not connection.in_atomic_block:
        _write(connection, params)
        return
    row = fetch_autocommit(alias, _CHECKPOINT, params)
    if row is not None and row[0]:
        return
    # Not held as the side connection sees the database: either lost (nothing to
    # write), or a job that exists only in the caller's transaction, a test's: the
    # test kit writes it once the handler's savepoint is over (write_deferred()).
    job.__dict__.setdefault("_steps_deferred", []).append((_CHECKPOINT, params))


def _fetch_now(alias: str, job: Job, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Run ``sql`` (a function that writes a checkpoint and returns a row) and commit it
    now, whatever transaction the caller is in, after the checkpoints its job handed to
    the writer before it; its row, None for none."""
    settle(job)
    connection = connections[alias]
    if not connection.in_atomic_block:
        return _fetch(connection, sql, params)
    row = fetch_autocommit(alias, sql, params)
    if row is not None:
        return row
    # As in _write_now(): for a job of the test's transaction, run it there now (the
    # handler's savepoint may roll it back) and again once the savepoint is over.
    row = _fetch(connection, sql, params)
    if row is not None:
        job.__dict__.setdefault("_steps_deferred", []).append((sql, params))
    return row


def _fetch(
    connection: BaseDatabaseWrapper, sql: str, params: tuple[Any, ...]
) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        row: tuple[Any, ...] | None = cursor.fetchone()
        return row


def write_deferred(job: Job, alias: str) -> None:
    """Write the checkpoints that the side connection could not, on the caller's
    connection: for the test kit, whose jobs live in the test's transaction, after the
    handler's own savepoint has ended (kept, or rolled back)."""
    with connections[alias].cursor() as cursor:
        for sql, params in job.__dict__.pop("_steps_deferred", ()):
            cursor.execute(sql, list(params))


_CLEAR_FROM = """
DELETE FROM pgqueue_job_steps
 WHERE job_id = %s
   AND id >= (SELECT id FROM pgqueue_job_steps WHERE job_id = %s AND name = %s)
"""


def clear_checkpoints_from(job_id: Any, name: str, alias: str) -> int:
    """Delete the checkpoint ``name`` of the job and every one stored after it; return
    how many. ``StepError`` when the job has no checkpoint ``name``."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_CLEAR_FROM, [job_id, job_id, name])
        cleared: int = cursor.rowcount
    if not cleared:
        raise StepError(f"job {job_id} has no step, sleep or wait named {name!r}")
    return cleared
