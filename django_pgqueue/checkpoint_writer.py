"""A worker's checkpoint writer: commits the checkpoints of plain steps that its slots
finished, several in one transaction, on a connection of its own.

A plain step is at least once (a worker killed before its checkpoint commits runs it
again), so its handler need not wait for the checkpoint's round trip: ``run_step()``
hands the checkpoint to the writer and goes on. The writer's thread writes whatever it
was handed since its last write in one statement (``pgqueue_write_checkpoints``,
sql/steps_v2.sql) and one commit, each checkpoint only while its attempt holds the job.
The worker waits for a handler's checkpoints (``wait()``) once the handler has ended
and before it records the job's outcome, so a job's outcome never commits before the
checkpoints its handler wrote.

The thread and its connection start with the first checkpoint; the connection closes
after ``IDLE_SECONDS`` without one. A worker whose jobs have no steps holds neither.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, NamedTuple

import psycopg

from .response_watch import guard
from .sideconn import open_raw_connection

logger = logging.getLogger("django_pgqueue.steps")

#: The connection closes after this long without a checkpoint to write.
IDLE_SECONDS = 30.0
#: Checkpoints written by one statement, at most.
MAX_BATCH = 1000
#: How long opening the writer's connection may take before the write is given up.
CONNECT_TIMEOUT = 10

_WRITE = (
    "SELECT pgqueue_write_checkpoints(%s::uuid[], %s::text[], %s::integer[], %s::text[], "
    "%s::jsonb[], %s::float8[], %s::float8[])"
)


class Handed(NamedTuple):
    """A checkpoint handed to the writer, with its ticket."""

    ticket: int
    job_id: Any
    worker_id: str | None
    attempt: int
    name: str
    result: str
    #: When the step's function was called and returned, as ``time.monotonic()``.
    started: float
    returned: float


class CheckpointWriter:
    """Writes handed checkpoints in the background for the slots of one worker."""

    def __init__(self, alias: str, response_timeout: float = 0.0) -> None:
        self.alias = alias
        #: ``PGQUEUE["RESPONSE_TIMEOUT"]`` of its worker: the longest a write may wait
        #: for the database's answer before its connection is cut (0: forever).
        self.response_timeout = response_timeout
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._queue: list[Handed] = []
        self._last_ticket = 0
        #: Every checkpoint up to this ticket was written, or given up.
        self._done = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # A job sent to a child process (isolation="process") writes its own there.
        return (_no_writer, ())

    def hand(
        self,
        job_id: Any,
        worker_id: str | None,
        attempt: int,
        name: str,
        result: str,
        started: float,
        returned: float,
    ) -> int | None:
        """Queue a checkpoint; return its ticket for ``wait()``, or None when the writer
        no longer takes any (closed, or inherited by a forked process)."""
        with self._cond:
            if self._closed or os.getpid() != self._pid:
                return None
            self._last_ticket += 1
            ticket = self._last_ticket
            self._queue.append(
                Handed(ticket, job_id, worker_id, attempt, name, result, started, returned)
            )
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pgqueue-checkpoints", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
            return ticket

    def wait(self, ticket: int, timeout: float) -> bool:
        """Wait until the checkpoint ``ticket`` and every one handed before it were
        written (or given up); whether they were within ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self._done >= ticket, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what was handed, then stop the thread and close the connection. Later
        checkpoints are refused (``hand()`` returns None)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            while True:
                with self._cond:
                    if not self._queue and not self._closed:
                        self._cond.wait(IDLE_SECONDS)
                    if not self._queue:
                        if self._closed:
                            return
                        if conn is not None:  # idle: hold no connection
                            conn.close()
                            conn = None
                        continue
                    batch = self._queue[:MAX_BATCH]
                    del self._queue[:MAX_BATCH]
                try:
                    conn = self._write(conn, batch)
                except Exception as exc:  # never leave the waiters waiting on a dead thread
                    logger.exception("checkpoint writer: unexpected error")
                    _give_up(batch, exc)
                with self._cond:
                    self._done = batch[-1].ticket
                    self._cond.notify_all()
        finally:
            if conn is not None:
                conn.close()

    def _write(
        self, conn: psycopg.Connection[Any] | None, batch: list[Handed]
    ) -> psycopg.Connection[Any] | None:
        """Write ``batch``, reconnecting once if the connection was lost; return the
        connection to use next (None: open a new one)."""
        params = _params(batch)
        for attempt in (1, 2):
            try:
                if conn is None or conn.closed:
                    conn = open_raw_connection(self.alias, connect_timeout=CONNECT_TIMEOUT)
                with guard(conn, self.response_timeout, "step checkpoints"):
                    conn.execute(_WRITE, params, prepare=False)
                return conn
            except psycopg.OperationalError as exc:
                # Written and lost on the way back, or not written: a second write of
                # the same checkpoints leaves those already stored as they are.
                lost = conn is None or conn.broken or conn.closed
                if lost and conn is not None:
                    conn.close()
                if lost:
                    conn = None
                if not lost or attempt == 2:
                    _give_up(batch, exc)
                    return conn
            except psycopg.Error as exc:
                _give_up(batch, exc)
                return conn
        return conn


def _params(batch: list[Handed]) -> tuple[list[Any], ...]:
    now = time.monotonic()
    return (
        [handed.job_id for handed in batch],
        [handed.worker_id for handed in batch],
        [handed.attempt for handed in batch],
        [handed.name for handed in batch],
        [handed.result for handed in batch],
        [now - handed.started for handed in batch],
        [now - handed.returned for handed in batch],
    )


def _give_up(batch: list[Handed], exc: Exception) -> None:
    logger.warning(
        "%d step checkpoints were not written (%s): those steps run again if their jobs "
        "are retried; first: job %s, step %r",
        len(batch),
        exc,
        batch[0].job_id,
        batch[0].name,
    )


def _no_writer() -> None:
    return None
