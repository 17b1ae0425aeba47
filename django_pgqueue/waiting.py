"""Waiting for a job to finish: what ``Job.wait()`` and ``Job.await_result()`` do.

A waiter LISTENs on ``pgqueue_finished``, then marks the job awaited, then reads its
status. A finish committed after the mark notifies the channel with the job's id
(sql/notify_finished_v1.sql); one committed before it is seen by the read. Between
notifications the waiter reads again every ``poll_interval`` seconds: behind a
transaction pooler, where LISTEN hears nothing, polling alone finds the finish.

The waiter's connection is its own (``PGQUEUE["LISTEN_DATABASE"]`` when set, else the
jobs database), in autocommit: it sees only committed jobs, and holds no transaction.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections

from . import conf, validation
from .exceptions import CancelledJobError, JobFailedError, JobNotFoundError, WaitTimeoutError
from .schema import FINISHED, JobStatus, status_in

#: The channel awaited jobs notify when they finish (their id as the payload).
FINISHED_CHANNEL = "pgqueue_finished"
#: Seconds between reads of the job's status when no notification came (the default).
DEFAULT_POLL_INTERVAL = 1.0

_MARK_AWAITED = (
    "UPDATE pgqueue_jobs SET awaited = true "
    f"WHERE id = %s AND NOT awaited AND NOT {status_in(FINISHED)}"
)
_READ = "SELECT status, result, last_error, attempts, job_type FROM pgqueue_jobs WHERE id = %s"


@dataclass(frozen=True)
class _Waiting:
    """One wait's arguments, checked."""

    job_id: uuid.UUID
    alias: str
    deadline: float | None
    poll_interval: float

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def next_wait(self) -> float:
        """Seconds to listen before reading again; raises once the time is up."""
        left = self.seconds_left()
        if left is None:
            return self.poll_interval
        if left <= 0:
            raise _TimeUp
        return min(self.poll_interval, left)


class _TimeUp(Exception):
    pass


def waiting(job_id: uuid.UUID, alias: str, timeout: Any, poll_interval: Any) -> _Waiting:
    """Check the arguments of a wait (``InvalidArgumentError`` names the bad one)."""
    seconds = None if timeout is None else validation.seconds(timeout, "timeout", allow_zero=False)
    interval = validation.seconds(poll_interval, "poll_interval", allow_zero=False)
    deadline = None if seconds is None else time.monotonic() + seconds
    return _Waiting(job_id, alias, deadline, interval)


def _connection_params(alias: str) -> dict[str, Any]:
    """The connection parameters of the waiter's own connection."""
    listen_alias = conf.get_settings().LISTEN_DATABASE or alias
    params = dict(connections[listen_alias].get_connection_params())
    # Django's cursor class and adapters are for its sync connections; the default
    # ones read the few columns a waiter reads.
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


def wait_for(wait: _Waiting, in_transaction: bool) -> Any:
    """Block until the job finishes; return its result or raise what its end means."""
    with psycopg.Connection.connect(**_connection_params(wait.alias), autocommit=True) as conn:
        conn.execute(f"LISTEN {FINISHED_CHANNEL}")
        conn.execute(_MARK_AWAITED, [wait.job_id])
        while True:
            row = conn.execute(_READ, [wait.job_id]).fetchone()
            if row is None or row[0] in FINISHED:
                return _outcome(wait, row, in_transaction)
            try:
                seconds = wait.next_wait()
            except _TimeUp:
                raise _timed_out(wait, row) from None
            _hear(conn, str(wait.job_id), seconds)


def _hear(conn: psycopg.Connection[Any], payload: str, seconds: float) -> None:
    """Wait up to ``seconds`` for the notification of this job's finish."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        for note in conn.notifies(timeout=left, stop_after=1):
            if note.payload == payload:
                return


async def await_finish(wait: _Waiting, in_transaction: bool) -> Any:
    """``wait_for()`` for async code, on an async connection: no thread is blocked."""
    params = _connection_params(wait.alias)
    conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
    async with conn:
        await conn.execute(f"LISTEN {FINISHED_CHANNEL}")
        await conn.execute(_MARK_AWAITED, [wait.job_id])
        while True:
            cursor = await conn.execute(_READ, [wait.job_id])
            row = await cursor.fetchone()
            if row is None or row[0] in FINISHED:
                return _outcome(wait, row, in_transaction)
            try:
                seconds = wait.next_wait()
            except _TimeUp:
                raise _timed_out(wait, row) from None
            await _ahear(conn, str(wait.job_id), seconds)


async def _ahear(conn: psycopg.AsyncConnection[Any], payload: str, seconds: float) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        async for note in conn.notifies(timeout=left, stop_after=1):
            if note.payload == payload:
                return


def _outcome(wait: _Waiting, row: tuple[Any, ...] | None, in_transaction: bool) -> Any:
    if row is None:
        hint = (
            " It is not committed yet: wait outside the transaction that enqueued it "
            "(with transaction.on_commit(), or after the atomic block)."
            if in_transaction
            else " It was deleted (pruned, or by hand), or it is in another database."
        )
        raise JobNotFoundError(
            f"job {wait.job_id} is not in the jobs database {wait.alias!r}.{hint}"
        )
    status, result, error, attempts, job_type = row
    if status == JobStatus.COMPLETED:
        return result
    if status == JobStatus.CANCELLED:
        raise CancelledJobError(
            f"job {wait.job_id} ({job_type}) was cancelled" + (f": {error}" if error else ""),
            job_id=wait.job_id,
            error=error,
        )
    raise JobFailedError(
        f"job {wait.job_id} ({job_type}) failed after {attempts} attempt(s): {error}",
        job_id=wait.job_id,
        error=error,
    )


def _timed_out(wait: _Waiting, row: tuple[Any, ...]) -> WaitTimeoutError:
    status, _, _, attempts, job_type = row
    return WaitTimeoutError(
        f"job {wait.job_id} ({job_type}) had not finished when the wait timed out: it is "
        f"{status}, after {attempts} attempt(s)",
        job_id=wait.job_id,
        error=None,
    )
