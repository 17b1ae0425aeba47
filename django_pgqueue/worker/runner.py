"""The ``Worker``: claims due jobs into free slots, records outcomes in batches, and
shuts down gracefully.

One main thread owns claiming and finishing (on its own database connection); slot
threads run handlers (each on its own connection, inside the job's transaction); a
heartbeat thread keeps held jobs alive; a listener thread turns NOTIFY into wake-ups.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import FrameType
from typing import Any

import psycopg

from .. import conf, registry, validation
from ..checkpoint_writer import CheckpointWriter
from ..exceptions import InvalidArgumentError, InvalidWorkerOptionError
from ..inserts import NOTIFY_COALESCE_SECONDS
from ..logfields import fields, job_fields
from ..models import Job
from ..response_watch import guarded_connection
from ..sideconn import open_raw_connection
from ..steps import prepare_claimed
from . import queries
from .adapters import adapt_worker_connection
from .async_slots import AsyncSlots
from .claimed import claimed_jobs
from .execution import (
    CANCELLED,
    COMPLETED,
    LOOP,
    PENDING,
    PROCESS,
    THREAD,
    Outcome,
    RunningJob,
    handed_back,
    interrupt,
    suspect_lost_connections,
    timeout_outcome,
)
from .finishing import finish_statement
from .handback import RELEASED_RUNNING_DELAY, forced_exit_outcomes, hand_back
from .heartbeat import Heartbeat
from .kinds import Pool, SideKind, SideKinds, kind_of
from .listener import NotificationListener
from .pacing import RatePacing, start_by
from .process_slots import ProcessSlots
from .slots import SlotPool

logger = logging.getLogger("django_pgqueue.worker")

#: How long a handler may ignore a timeout interruption before its job is recorded as
#: timed out and the thread abandoned.
TIMEOUT_GRACE = 2.0
MAX_BATCH_SIZE = 1000
MAX_CONCURRENCY = 1000
MAX_ASYNC_CONCURRENCY = 10000
MAX_PROCESS_CONCURRENCY = 1000
MAX_PREFETCH = 10000
#: The prefetch buffer is sized so that a job waits in it about this long at most,
#: judging by how long recent jobs ran: fast jobs get a deep buffer, slow ones none.
PREFETCH_TARGET_WAIT = 0.02
#: The most jobs the prefetch buffer holds while rate limits exist, whatever
#: ``PGQUEUE["PREFETCH"]`` allows: W11 (1,000 keys under rates of their own, two worker
#: processes) drained at 11,000-14,000 jobs/s with 100, at 1,400-2,700 with 400.
RATED_PREFETCH = 100
#: Weight of the newest run in the moving average of run times.
DURATION_SMOOTHING = 0.1


def default_worker_id() -> str:
    """``host:pid:random``, unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Runs jobs until stopped (``stop()``, SIGTERM, SIGINT) or, with ``burst``, until no
    due job is left.

    ``concurrency`` slots run jobs at once. Besides the jobs running, a worker holds at
    most ``prefetch`` claimed jobs in a buffer that free slots take from without waiting
    for the database; the buffer only fills while recent jobs were fast enough to start
    within about 20 ms (``PREFETCH_TARGET_WAIT``), so slow jobs are never hoarded.
    ``prefetch=0`` claims only into free slots. Each claim takes at most ``batch_size``
    jobs (default: ``concurrency + prefetch``, at most 1000). ``queues`` and
    ``job_types`` restrict what is claimed (``None``: any).

    The worker runtime that [`pgqueue_worker`](commands.md#pgqueue_worker) runs. Use it
    directly to embed a worker in your own process or tests:

    ```python
    from django_pgqueue.worker import Worker

    Worker(queues=["emails"], burst=True).run()
    ```

    Args:
        queues: Queues to take jobs from (a single string is accepted); ``None``: all.
            An empty list is rejected.
        job_types: Job types to run; ``None``: all. An empty list is rejected.
        concurrency: Number of slot threads (for sync handlers), 1 to 1000.
        async_concurrency: Most ``async def`` handlers run at once on the worker's event
            loop, 0 to 10000. Default: ``PGQUEUE["ASYNC_CONCURRENCY"]`` (100). The loop
            starts only when async handlers are registered for the job types the worker
            runs; 0 with such handlers is refused. See
            [Run async handlers](../how-to/async-handlers.md).
        process_concurrency: Most jobs of ``isolation="process"`` job types run at once,
            each in a child process of the worker, 0 to 1000. Default:
            ``PGQUEUE["PROCESS_CONCURRENCY"]`` (2). The children start only when such
            job types are among those the worker runs; 0 with such types is refused.
            See [Isolate jobs in processes](../how-to/process-isolation.md).
        max_jobs_per_child: Replace a child process after it ran so many jobs
            (``None``: never), 1 or more.
        max_memory_per_child: Replace a child process once its peak memory passed so
            many MiB, checked after each job (``None``: never), 1 or more; a child
            holding more while its job runs is killed.
        pool: ``"thread"`` (the default): sync handlers run in threads, but those of
            ``isolation="process"`` job types; ``"process"``: every sync handler runs
            in a child process, and ``concurrency`` threads stay idle.
        batch_size: Most jobs claimed per query, 1 to 1000 (default above, plus
            ``async_concurrency`` and ``process_concurrency`` when the event loop and
            the child processes run).
        prefetch: Most claimed jobs held beyond the running ones while jobs are fast, 0
            to 10000. Default: ``PGQUEUE["PREFETCH"]`` (400). The worker holds at most
            ``concurrency + prefetch`` jobs; see [``PREFETCH``](settings.md).
        poll_interval: Seconds between claims when nothing wakes the worker and the
            leader's notifications are not heard (an idle worker that hears them claims
            every ``PGQUEUE["IDLE_POLL_INTERVAL"]``); as the leader, the pace of its
            wake-up calls ([one worker leads](../explanation/design.md#one-worker-leads));
            positive. Default: ``PGQUEUE["POLL_INTERVAL"]``.
        burst: When ``True``, ``run()`` returns as soon as no due job is left and nothing
            is running (due jobs held back by a rate limit are waited for).
        worker_id: Identifier written to ``worker_id`` of claimed jobs, 1 to 255
            characters. Default: ``"<hostname>:<pid>:<6 random hex digits>"``
            ([`default_worker_id()`][django_pgqueue.worker.default_worker_id]). Must be
            unique among live workers.
        using: Database alias. Default: ``PGQUEUE["DATABASE"]``.
        shutdown_grace: Seconds running jobs get to finish once the worker stops; 0 or
            more. Default: ``PGQUEUE["SHUTDOWN_GRACE"]``.
        listen: Whether to ``LISTEN`` for notifications. Default: ``PGQUEUE["NOTIFY"]``.

    Raises:
        InvalidWorkerOptionError: For an invalid option (an ``InvalidArgumentError``, so
            also a ``ValueError``); its ``field`` names the option, and
            ``async_concurrency`` (``process_concurrency``) when it is 0 while async
            handlers (process-isolated ones) are registered for the job types the worker
            runs. Nothing was started.

    Attributes:
        stats: A
            [``collections.Counter``](https://docs.python.org/3/library/collections.html#collections.Counter)
            of the outcomes the worker has recorded, by the job's new status:
            ``"completed"``, ``"pending"`` (a retry, or a job given back at shutdown),
            ``"failed"`` and ``"cancelled"``. Outcomes that were not recorded because the
            job had been recovered by another worker are not counted.
    """

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        job_types: Sequence[str] | None = None,
        concurrency: int = 4,
        async_concurrency: int | None = None,
        process_concurrency: int | None = None,
        max_jobs_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        pool: str = THREAD,
        batch_size: int | None = None,
        prefetch: int | None = None,
        poll_interval: float | None = None,
        burst: bool = False,
        worker_id: str | None = None,
        using: str | None = None,
        shutdown_grace: float | None = None,
        listen: bool | None = None,
    ) -> None:
        settings = conf.get_settings()
        try:
            self._configure(
                settings,
                queues=queues,
                job_types=job_types,
                concurrency=concurrency,
                async_concurrency=async_concurrency,
                process_concurrency=process_concurrency,
                max_jobs_per_child=max_jobs_per_child,
                max_memory_per_child=max_memory_per_child,
                batch_size=batch_size,
                prefetch=prefetch,
                poll_interval=poll_interval,
                shutdown_grace=shutdown_grace,
            )
        except InvalidArgumentError as exc:
            raise InvalidWorkerOptionError(exc.field, exc.message) from None
        self.burst = burst
        self.worker_id = worker_id or default_worker_id()
        if not self.worker_id or len(self.worker_id) > 255:
            raise InvalidWorkerOptionError("worker_id", "must be 1 to 255 characters")
        self.using = conf.jobs_database(using)
        if pool not in (THREAD, PROCESS):
            raise InvalidWorkerOptionError("pool", f"must be 'thread' or 'process', got {pool!r}")
        #: Where sync handlers run: ``"thread"``, or ``"process"`` (all in children).
        self.pool = pool
        #: Its event loop and child processes, with the job types each runs.
        self.side_kinds = SideKinds.find(
            self.job_types,
            {
                LOOP: (self.async_concurrency, "async_concurrency"),
                PROCESS: (self.process_concurrency, "process_concurrency"),
            },
            pool,
        )
        if batch_size is None and self.side_kinds:
            self.batch_size: int = min(self.batch_size + self.side_kinds.total_size, MAX_BATCH_SIZE)
        self.listen = settings.NOTIFY if listen is None else listen
        self._settings = settings

        self._running: dict[Any, RunningJob] = {}
        self._abandoned: dict[Any, RunningJob] = {}
        self._finished: queue.SimpleQueue[tuple[RunningJob, Outcome]] = queue.SimpleQueue()
        self._outcomes: list[Outcome] = []
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._threads_stopping = threading.Event()
        self._signals_received = 0
        #: Set when shutdown released a job whose handler was still running: its thread
        #: must not outlive the process by long (``pgqueue_worker`` then exits at once).
        self.handlers_left_running = False
        #: Outcomes recorded so far, by new status ("completed", "pending" for a retry, ...).
        self.stats: Counter[str] = Counter()
        #: Round trips of the main loop (each records outcomes and/or claims a batch).
        self.round_trips = 0
        self._conn: psycopg.Connection[Any] | None = None
        #: Writes the checkpoints of its handlers' plain steps, in the background.
        self._checkpoints = CheckpointWriter(self.using, self.response_timeout)
        self._listener: NotificationListener | None = None
        self._heartbeat: Heartbeat | None = None
        self._last_claim_at = 0.0
        #: The rate limits it claims under: whether any exists, when a full window has
        #: room, how soon it promises to start what it prefetches.
        self.pacing = RatePacing()
        #: Moving average of handler run times (None until a job ran).
        self._average_duration: float | None = None

    @property
    def processed(self) -> int:
        """How many outcomes this worker recorded (a retried job counts once per attempt).

        The sum of ``stats``: completions, failures, retries and cancellations all count,
        so a job that failed twice and then completed counts three times.
        """
        return sum(self.stats.values())

    @property
    def async_job_types(self) -> list[str]:
        """The job types it runs on its event loop (async handlers)."""
        kind = self.side_kinds.get(LOOP)
        return kind.job_types if kind else []

    @property
    def process_job_types(self) -> list[str]:
        """The job types it runs in child processes (``isolation="process"``)."""
        kind = self.side_kinds.get(PROCESS)
        return kind.job_types if kind else []

    def _make_pool(self, kind: SideKind) -> Pool:
        if kind.name == LOOP:
            return AsyncSlots(kind.size, self._on_job_done)
        return ProcessSlots(
            kind.size,
            self.using,
            self._on_job_done,
            max_jobs_per_child=self.max_jobs_per_child,
            max_memory_per_child=(
                None if self.max_memory_per_child is None else self.max_memory_per_child << 20
            ),
        )

    def _configure(
        self,
        settings: conf.PgQueueSettings,
        *,
        queues: Sequence[str] | None,
        job_types: Sequence[str] | None,
        concurrency: int,
        async_concurrency: int | None,
        process_concurrency: int | None,
        max_jobs_per_child: int | None,
        max_memory_per_child: int | None,
        batch_size: int | None,
        prefetch: int | None,
        poll_interval: float | None,
        shutdown_grace: float | None,
    ) -> None:
        self.queues = validation.names(queues, validation.queue, "queues", InvalidWorkerOptionError)
        self.job_types = validation.names(
            job_types, validation.job_type, "job_types", InvalidWorkerOptionError
        )
        self.concurrency = _bounded_int(concurrency, "concurrency", MAX_CONCURRENCY)
        self.async_concurrency = _bounded_int(
            settings.ASYNC_CONCURRENCY if async_concurrency is None else async_concurrency,
            "async_concurrency",
            MAX_ASYNC_CONCURRENCY,
            minimum=0,
        )
        self.process_concurrency = _bounded_int(
            settings.PROCESS_CONCURRENCY if process_concurrency is None else process_concurrency,
            "process_concurrency",
            MAX_PROCESS_CONCURRENCY,
            minimum=0,
        )
        self.max_jobs_per_child = (
            None
            if max_jobs_per_child is None
            else _bounded_int(max_jobs_per_child, "max_jobs_per_child", 10**9)
        )
        self.max_memory_per_child = (
            None
            if max_memory_per_child is None
            else _bounded_int(max_memory_per_child, "max_memory_per_child", 10**9)
        )
        self.prefetch = _bounded_int(
            settings.PREFETCH if prefetch is None else prefetch,
            "prefetch",
            MAX_PREFETCH,
            minimum=0,
        )
        self.batch_size = _bounded_int(
            batch_size
            if batch_size is not None
            else min(self.concurrency + self.prefetch, MAX_BATCH_SIZE),
            "batch_size",
            MAX_BATCH_SIZE,
        )
        self.poll_interval = validation.seconds(
            settings.POLL_INTERVAL if poll_interval is None else poll_interval,
            "poll_interval",
            allow_zero=False,
        )
        self.idle_poll_interval = max(settings.IDLE_POLL_INTERVAL, self.poll_interval)
        self.shutdown_grace = validation.seconds(
            settings.SHUTDOWN_GRACE if shutdown_grace is None else shutdown_grace,
            "shutdown_grace",
        )
        self.response_timeout = settings.RESPONSE_TIMEOUT

    # -- public control -------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs finish within the grace period (thread-safe).

        ``run()`` returns once shutdown is complete.
        """
        self._stopping.set()
        self._wake.set()

    def run(self) -> int:
        """Run until stopped; return the process exit code (0 on a clean stop).

        When called in the main thread it installs handlers for ``SIGTERM`` and
        ``SIGINT``: the first signal stops the worker gracefully, a second one hands the
        held jobs back (one attempt of about a second) and ends the process at once with
        status 128 + the signal number. See
        [Shut workers down gracefully](../how-to/production.md#shut-workers-down-gracefully).
        When ``run()`` returns, the handlers that were installed before it are restored.
        Its last log line counts the outcomes it recorded, by new status, for example
        ``worker <id> stopped: completed=12, failed=1, pending=2`` (``no job run`` when
        there were none).
        """
        logger.info(
            "worker %s starting: queues=%s job_types=%s concurrency=%d async_concurrency=%d "
            "process_concurrency=%d pool=%s prefetch=%d batch_size=%d",
            self.worker_id,
            ",".join(self.queues) if self.queues else "*",
            ",".join(self.job_types) if self.job_types else "*",
            self.concurrency,
            self.side_kinds.size(LOOP),
            self.side_kinds.size(PROCESS),
            self.pool,
            self.prefetch,
            self.batch_size,
        )
        previous_handlers = self._install_signal_handlers()
        self._register()
        self._sync_limits()
        self._check_release_channel()
        slots = SlotPool(self.concurrency, self.using, self._on_job_done)
        self.side_kinds.start(self._make_pool)
        threads = self._start_threads()
        try:
            self._loop(slots)
        finally:
            self._drain_and_release(slots)
            self._mark_stopped()
            slots.stop()
            self.side_kinds.stop()
            self._checkpoints.close()
            self._threads_stopping.set()
            if self._heartbeat is not None:
                self._heartbeat.nudge()  # it may be waiting for its next idle beat
            for thread in threads:
                # The listener is not waited for: it notices the stop within its 0.5 s
                # notification timeout and is a daemon thread, so an exiting worker
                # (a --burst run, say) need not pay that wait.
                if thread is not self._listener:
                    thread.join(timeout=2)
            self._drop_connection()
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
        logger.info(
            "worker %s stopped: %s",
            self.worker_id,
            ", ".join(f"{status}={count}" for status, count in sorted(self.stats.items()))
            or "no job run",
        )
        return 0

    def _db(self) -> psycopg.Connection[Any]:
        """The main loop's own autocommit connection, reopened after a failure."""
        if self._conn is None or self._conn.closed:
            self._conn = conn = open_raw_connection(
                self.using, default_connect_timeout=self.response_timeout
            )
            adapt_worker_connection(conn)
            if conn.info.parameter_status("TimeZone") != "UTC":
                # As Django does for its own connections. psycopg then returns claimed
                # jobs' six timestamps with datetime.timezone.utc, as the ORM does,
                # instead of zoneinfo's UTC: four times faster to build.
                conn.execute("SET TIME ZONE 'UTC'")
        return self._conn

    def _guarded(self, what: str) -> AbstractContextManager[psycopg.Connection[Any]]:
        """The main loop's connection, cut if the database leaves a statement of the
        block unanswered past ``PGQUEUE["RESPONSE_TIMEOUT"]`` (response_watch.py)."""
        return guarded_connection(self._db(), self.response_timeout, what)

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _register(self) -> None:
        """Record this worker in ``pgqueue_workers`` (retrying while the database is down)."""
        params = [
            self.worker_id,
            socket.gethostname(),
            os.getpid(),
            json.dumps(self.queues),
            json.dumps(self.job_types),
            self.concurrency + self.side_kinds.total_size,
        ]
        failures = 0
        while True:
            try:
                with self._guarded("the worker's registration") as conn:
                    conn.execute(queries.REGISTER_WORKER, params)
                return
            except psycopg.Error as exc:
                failures += 1
                delay = min(0.5 * 2 ** (failures - 1), 30.0)
                logger.error("cannot reach the database (%s); retrying in %.1fs", exc, delay)
                self._drop_connection()
                if self._stopping.wait(delay):
                    return

    def _sync_limits(self) -> None:
        """Write the declared concurrency and rate limits, which ``claim_job_batch``
        enforces."""
        from django.db import DatabaseError, connections

        from ..limits import sync_declared_limits
        from ..rate_limits import sync_declared_rate_limits

        try:
            sync_declared_limits(self.using)
            sync_declared_rate_limits(self.using)
            row = self._db().execute(queries.RATE_LIMITED).fetchone()
            self.pacing.limited = bool(row and row[0])
        except (DatabaseError, psycopg.Error) as exc:
            # The limits stored by an earlier worker still apply: keep running.
            logger.error("could not write the declared limits (%s)", exc)
        # They were written on this thread's Django connection, which the main loop does
        # not use again (it has its own, _db()): close it rather than hold it idle. Not
        # inside a transaction (a test running a worker in its own thread).
        connection = connections[self.using]
        if not connection.in_atomic_block:
            connection.close()

    def _check_release_channel(self) -> None:
        """Warn when the database notifies released workflow steps on another channel
        than the one this worker listens to: they would wait for a poll."""
        settings = conf.get_settings()
        if not settings.NOTIFY:
            return
        try:
            row = self._db().execute(queries.RELEASE_CHANNEL).fetchone()
        except psycopg.Error as exc:
            logger.warning("could not read pgqueue.notify_channel (%s)", exc)
            return
        channel = row[0] if row else None
        if channel != settings.NOTIFY_CHANNEL:
            logger.warning(
                "PGQUEUE['NOTIFY_CHANNEL'] is %r, but the database notifies workflow steps "
                "it releases on %r: idle workers find them at their next poll. Run ALTER "
                "DATABASE <name> SET pgqueue.notify_channel = %r",
                settings.NOTIFY_CHANNEL,
                channel,
                settings.NOTIFY_CHANNEL,
            )

    def _mark_stopped(self) -> None:
        try:
            with self._guarded("the worker's stop") as conn:
                conn.execute(queries.WORKER_STOPPED, [self.worker_id])
        except psycopg.Error as exc:
            logger.warning("could not record the worker's stop (%s)", exc)

    # -- main loop ----------------------------------------------------------------------

    def _loop(self, slots: SlotPool) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                self._reap()
                self._enforce_timeouts()
                claimed, asked = self._cycle(slots)
                failures = 0
            except (psycopg.DataError, psycopg.ProgrammingError, psycopg.IntegrityError):
                # Not an outage: sending the same outcomes again would fail forever. Drop
                # them; no longer heartbeated, their jobs go stale and recovery retries
                # them, so nothing is lost.
                logger.exception(
                    "could not record %d outcome(s); their jobs will be recovered",
                    len(self._outcomes),
                )
                self._outcomes = []
                self._drop_connection()
                continue
            except psycopg.Error as exc:
                failures += 1
                delay = min(0.5 * 2 ** (failures - 1), 30.0)
                logger.error(
                    "database unavailable (%s: %s); retrying in %.1fs",
                    type(exc).__name__,
                    str(exc).strip(),
                    delay,
                )
                if isinstance(exc, psycopg.OperationalError):
                    suspect_lost_connections()  # the slots' may be gone with it
                self._drop_connection()
                self._stopping.wait(delay)
                continue
            idle = not claimed and not self._running and not self._outcomes
            if self.burst and idle and not self._waiting_for_rate_limits():
                logger.info("burst: no due job left")
                return
            if asked and len(claimed) == asked:
                continue  # more may be due right away
            self._wake.wait(self._wait_timeout())
            self._wake.clear()

    def _due_jobs_announced(self) -> bool:
        """Whether every job this worker could claim is announced by a notification: the
        leader's wake-up calls reach it (worker/listener.py) and no concurrency limit
        exists (the room a finished job frees in one is not announced)."""
        heartbeat = self._heartbeat
        return (
            self._listener is not None
            and heartbeat is not None
            and not heartbeat.concurrency_limited
            and self._listener.hears_ticks()
        )

    def _wait_timeout(self) -> float:
        timeout = self.poll_interval
        if not self._running and not self._outcomes and self._due_jobs_announced():
            # Idle, and the leader announces every job that becomes due: a poll now and
            # then only for a job made due without a notification.
            timeout = self.idle_poll_interval
        now = time.monotonic()
        for running in self._running.values():
            if running.deadline is not None:
                timeout = min(timeout, max(running.deadline - now, 0.0) + 0.01)
        if self._listener is not None and self._room() > 0:
            # Enqueuers skip the NOTIFY of a job committed just after one they sent
            # (enqueue.NOTIFY_COALESCE_SECONDS): claim once more that long after each one.
            recheck_at = self._listener.last_notified + NOTIFY_COALESCE_SECONDS
            if self._last_claim_at < recheck_at:
                timeout = min(timeout, max(recheck_at - now, 0.0))
        room_at = self.pacing.wake_at()
        if room_at is not None and self._free_slots() > 0:
            timeout = min(timeout, max(room_at - now, 0.0))
        return timeout

    def _room(self) -> int:
        """How many more jobs to hold: free slots of every kind plus the prefetch
        buffer's room."""
        return self._thread_room() + self.side_kinds.room

    def _thread_room(self) -> int:
        """How many more sync jobs to hold: free slot threads and the prefetch buffer
        (none with ``pool="process"``: child processes run them)."""
        if self.pool == PROCESS:
            return 0
        return self.concurrency + self._prefetch_depth() - self._held_by_threads()

    def _held_by_threads(self) -> int:
        return len(self._running) + len(self._abandoned) - self.side_kinds.held

    def _claim_filter(self) -> tuple[list[str] | None, list[str] | None]:
        """The job types to claim and those to leave (``p_skip_job_types``): while one
        kind of slot has no room, only the other kinds' jobs (worker/kinds.py)."""
        return self.side_kinds.claim_filter(self.job_types, self._thread_room())

    def _waiting_for_rate_limits(self) -> bool:
        """Whether due jobs of this worker are only waiting for a rate limit's window: a
        burst run waits for them (it ends when no due job is left)."""
        if self.pacing.wake_at() is None:
            return False
        with self._guarded("the worker's rate limit check") as conn:
            found = conn.execute(
                queries.RATE_LIMITED_DUE, {"job_types": self.job_types, "queues": self.queues}
            ).fetchone()
        return bool(found and found[0])

    def _free_slots(self) -> int:
        """Slots idle now, of every kind: a job handed to one starts at once."""
        free_elsewhere = sum(max(kind.room, 0) for kind in self.side_kinds.kinds)
        return self._free_threads() + free_elsewhere

    def _free_threads(self) -> int:
        if self.pool == PROCESS:
            return 0
        return max(self.concurrency - self._held_by_threads(), 0)

    def _prefetch_depth(self) -> int:
        average = self._average_duration
        if not self.prefetch or average is None:
            return 0
        # Under rate limits a prefetched job is counted in its windows before it starts
        # (pacing.py): a shallower buffer keeps that count close to the starts.
        most = min(self.prefetch, RATED_PREFETCH) if self.pacing.limited else self.prefetch
        return min(most, int(self.concurrency * PREFETCH_TARGET_WAIT / max(average, 1e-6)))

    def _observe_duration(self, seconds: float) -> None:
        average = self._average_duration
        self._average_duration = (
            seconds if average is None else average + DURATION_SMOOTHING * (seconds - average)
        )

    def _claim_size(self) -> int:
        """How many jobs to claim now: the room there is, up to ``batch_size``; none while
        every slot is busy and the prefetch buffer is still at least half full. A claim
        is a transaction of its own once outcomes are written elsewhere (in handlers'
        transactions): topping the buffer up at each finished job would claim one or two
        jobs at a time, at the cost of a commit each."""
        room = max(min(self._room(), self.batch_size), 0)
        if room and not self._outcomes and self._free_slots() == 0:
            depth = self._prefetch_depth()
            if room < max(depth // 2, 1):
                return 0
        return room

    def _cycle(self, slots: SlotPool | None) -> tuple[list[Job], int]:
        """Record pending outcomes, claim into free slots (and the prefetch buffer) and
        hand what was claimed to the slots.

        The statements go to the server as one pipeline: one network round trip
        and one transaction, so a failure leaves nothing half done.
        """
        asked = 0 if slots is None or self._stopping.is_set() else self._claim_size()
        outcomes = self._outcomes
        if not outcomes and not asked:
            return [], 0
        if asked:
            self._last_claim_at = time.monotonic()
        start_within = self.pacing.start_within(
            asked=asked,
            free=self._free_slots(),
            held=len(self._running) + len(self._abandoned),
            concurrency=self.concurrency + self.side_kinds.total_size,
            average=self._average_duration,
        )
        job_types, skip_job_types = self._claim_filter()
        finish = claim = rate_wait = None
        with self._guarded("the worker's claim and outcomes") as conn, conn.pipeline():
            # Plain server-binding cursors (Django's settings may make the connection's
            # default a ClientCursor, which quotes parameters into the SQL in Python and
            # cannot return binary), never prepared: a transaction pooler such as
            # PgBouncer may sit in between.
            # Before FINISH, which lets the jobs go: their rate limits' room goes back.
            unstarted = [o.job_id for o in outcomes if o.unstarted]
            if unstarted and self.pacing.limited:
                psycopg.Cursor(conn).execute(
                    queries.RATE_HAND_BACK, [unstarted, self.worker_id], prepare=False
                )
            if outcomes:
                finish = psycopg.Cursor(conn)
                finish.execute(*finish_statement(outcomes, self.worker_id), prepare=False)
            if asked:
                # Binary results: psycopg's C loaders decode the timestamps and UUIDs
                # of a whole batch far faster than text parsing in Python.
                claim = psycopg.Cursor(conn)
                claim.execute(
                    queries.CLAIM,
                    [
                        self.worker_id,
                        job_types,
                        asked,
                        self.queues,
                        self._free_slots(),
                        start_within,
                        skip_job_types,
                    ],
                    binary=True,
                    prepare=False,
                )
                if self.pacing.limited:
                    rate_wait = psycopg.Cursor(conn)
                    rate_wait.execute(
                        queries.RATE_LIMIT_WAIT, [self.job_types, self.queues], prepare=False
                    )
        self.round_trips += 1
        if claim is not None:
            self.pacing.claim_came_back(time.monotonic() - self._last_claim_at)
        if rate_wait is not None:
            (seconds,) = rate_wait.fetchone() or (None,)
            self.pacing.room_in(seconds, time.monotonic())
        if finish is not None:
            self._record_finished(outcomes, finish)
        if claim is None:
            return [], asked
        jobs, undecodable = claimed_jobs(claim, self.using)
        prepare_claimed(jobs, self._checkpoints)
        if undecodable:
            self._outcomes.extend(undecodable)
            self._wake.set()  # record their failures now, not after a poll interval
        assert slots is not None
        # Only a claim given p_start_within returns jobs with a start-by moment.
        self._start(jobs, slots, sent_at=self._last_claim_at if start_within else None)
        return jobs, asked

    def _start(self, jobs: list[Job], slots: SlotPool, sent_at: float | None) -> None:
        """Hand ``jobs`` to the slots: free ones start them at once, the rest wait in
        the prefetch buffer. With ``sent_at`` (when the claim was sent), jobs with a
        start-by moment go first (pacing.py)."""
        free = self._free_threads()
        free_elsewhere = {kind.name: kind.room for kind in self.side_kinds.kinds}
        # Most workers run threads only: no job of theirs needs routing.
        routed = bool(free_elsewhere)
        deadlines = [None if sent_at is None else start_by(job, sent_at) for job in jobs]
        batch = list(zip(jobs, deadlines, strict=True))
        if sent_at is not None:
            batch.sort(key=lambda pair: pair[1] is None)  # stable: claim order otherwise
        for job, deadline in batch:
            if job.cancel_requested_at is not None:
                self._outcomes.append(
                    Outcome(job.id, CANCELLED, job.claimed_at, error="cancelled before it started")
                )
                continue
            # The slot sets the deadline when it starts the handler (execution.execute).
            definition = registry.find_definition(job.job_type)
            kind = kind_of(definition, self.pool) if routed else THREAD
            side = self.side_kinds.get(kind) if kind != THREAD else None
            if side is not None and side.pool is not None:
                running = RunningJob(
                    job=job,
                    definition=definition,
                    buffered=free_elsewhere[kind] <= 0,
                    start_by=deadline,
                    kind=kind,
                )
                free_elsewhere[kind] -= 1
                side.held += 1
                if self._running.setdefault(job.id, running) is not running:
                    self._supersede(running)
                side.pool.submit(running)
                continue
            running = RunningJob(
                job=job,
                definition=definition,
                buffered=free <= 0,
                start_by=deadline,
            )
            free -= 1
            # One lookup, as the assignment it stands for: an earlier run of the job is
            # rare (recovery took the job back and this worker claimed it again).
            if self._running.setdefault(job.id, running) is not running:
                self._supersede(running)
            slots.submit(running)

    def _supersede(self, running: RunningJob) -> None:
        """Hold ``running`` in place of an earlier run of its job, which is asked to stop:
        that run's claim is gone, and its outcome will be refused."""
        job_id = running.job.id
        self._running[job_id].cancel_event.set()
        self._running[job_id] = running
        logger.warning(
            "job %s was claimed again by %s while an earlier run of it went on (recovery "
            "had taken it back): that run is asked to stop, and its outcome will not be "
            "recorded",
            job_id,
            self.worker_id,
            extra=job_fields(running.job),
        )

    def _record_finished(self, outcomes: list[Outcome], finish: psycopg.Cursor[Any]) -> None:
        self._outcomes = self._outcomes[len(outcomes) :]
        if finish.rowcount == len(outcomes):  # each job once: every outcome was written
            self.stats.update(outcome.status for outcome in outcomes)
            return
        written = {row[0] for row in finish.fetchall()}
        for outcome in outcomes:
            if outcome.job_id in written:
                self.stats[outcome.status] += 1
            else:
                logger.warning(
                    "job %s was no longer held by %s (recovered by another worker, or "
                    "completed by its handler's transaction although the commit's "
                    "acknowledgement was lost); its outcome %r was not recorded",
                    outcome.job_id,
                    self.worker_id,
                    outcome.status,
                    # The job is no longer this worker's: only its id is known here.
                    extra=fields(outcome.job_id, None, None, None, self.worker_id),
                )

    def _on_job_done(self, running: RunningJob, outcome: Outcome) -> None:
        # Called in the slot thread: hand over to the main loop and wake it.
        running.outcome = outcome
        self._finished.put((running, outcome))
        if not self._wake.is_set():  # set() takes a lock, even when already set
            self._wake.set()

    def _reap(self) -> None:
        # Once a round: a completion is logged only at DEBUG, and usually is not.
        log_completed = logger.isEnabledFor(logging.DEBUG)
        while True:
            try:
                running, outcome = self._finished.get_nowait()
            except queue.Empty:
                return
            job_id = running.job.id
            if running.kind != THREAD:  # no call per job for a worker of threads only
                self.side_kinds.let_go(running)
            # Tested first: hashing a UUID is a Python call, and this is seldom needed.
            if self._abandoned and self._abandoned.get(job_id) is running:
                del self._abandoned[job_id]
                continue  # its timeout outcome was recorded when it was abandoned
            # Not another claim's: recovery may have taken the job back and this worker
            # claimed it again while this run went on (its outcome will be refused).
            if self._running.get(job_id) is running:
                del self._running[job_id]
            if running.duration is not None:
                self._observe_duration(running.duration)
            if outcome.recorded:  # in the handler's transaction
                self.stats[outcome.status] += 1
            else:
                outcome.started = running.recorded_start()
                self._outcomes.append(outcome)
            if outcome.status != COMPLETED or log_completed:
                _log_outcome(running.job, outcome)
            outcome.exception = None  # logged: its frames need not live until written

    def _enforce_timeouts(self) -> None:
        now = time.monotonic()
        for job_id, running in list(self._running.items()):
            if running.deadline is None or now < running.deadline:
                continue
            if running.timeout_signalled_at is None:
                if running.on_loop:
                    # asyncio.timeout cancels it on the loop; if the loop is blocked,
                    # it is abandoned once the grace period is over, as below.
                    running.timeout_signalled_at = now
                    continue
                logger.warning(
                    "job %s ran past its timeout; interrupting it",
                    job_id,
                    extra=job_fields(running.job),
                )
                interrupt(running)
            elif now - running.timeout_signalled_at > TIMEOUT_GRACE:
                # The handler ignores the interruption (blocked in C code, or swallowed
                # the exception): record the timeout now and keep the slot counted as
                # busy until the thread comes back, so concurrency is never exceeded.
                del self._running[job_id]
                self._abandoned[job_id] = running
                outcome = timeout_outcome(running)  # its error says it was abandoned
                outcome.started = running.recorded_start()
                self._outcomes.append(outcome)
                _log_outcome(running.job, outcome)

    # -- shutdown -----------------------------------------------------------------------

    def _drain_and_release(self, slots: SlotPool) -> None:
        """Release the jobs no slot started yet, let running jobs finish within the grace
        period, then release the rest."""
        for running in slots.take_unstarted() + self.side_kinds.take_unstarted():
            self._running.pop(running.job.id, None)
            self.side_kinds.let_go(running)
            self._outcomes.append(handed_back(running))
        self._reap()
        deadline = time.monotonic() + self.shutdown_grace
        if self._running:
            logger.info(
                "waiting up to %.1fs for %d running job(s)", self.shutdown_grace, len(self._running)
            )
        while self._running and time.monotonic() < deadline:
            self._wake.wait(min(0.1, max(deadline - time.monotonic(), 0)))
            self._wake.clear()
            self._reap()
        for job_id, running in self._running.items():
            logger.warning("releasing job %s, still running at shutdown", job_id)
            running.cancel_event.set()
            # Due once this process, and the handler in it, is gone (the command exits
            # with os._exit right after: handlers_left_running).
            claimed_at = running.job.claimed_at
            self._outcomes.append(
                Outcome(job_id, PENDING, claimed_at, refund=1, delay=RELEASED_RUNNING_DELAY)
            )
            self.handlers_left_running = True
        self._running.clear()
        for kind in self.side_kinds.kinds:
            kind.held = sum(running.kind == kind.name for running in self._abandoned.values())
        for attempt in range(3):
            try:
                self._cycle(None)
                return
            except psycopg.Error as exc:
                logger.error("could not record outcomes at shutdown (%s)", exc)
                self._drop_connection()
                time.sleep(0.5 * (attempt + 1))
        logger.error(
            "%d outcome(s) were not recorded; recovery will return those jobs to pending",
            len(self._outcomes),
        )

    def _start_threads(self) -> list[threading.Thread]:
        settings = self._settings
        threads: list[threading.Thread] = []
        if self.listen:
            self._listener = NotificationListener(
                # LISTEN needs a session: through a transaction pooler it hears nothing.
                alias=settings.LISTEN_DATABASE or self.using,
                channel=settings.NOTIFY_CHANNEL,
                queues=self.queues,
                wake=self._wake,
                stopping=self._threads_stopping,
                probe_interval=settings.HEARTBEAT_INTERVAL,
                response_timeout=self.response_timeout,
                poll_interval=self.poll_interval,
                leads=lambda: heartbeat.leads,
                on_ticks_lost=lambda: heartbeat.nudge(),
            )
            threads.append(self._listener)
        self._heartbeat = heartbeat = Heartbeat(
            alias=self.using,
            worker_id=self.worker_id,
            interval=settings.HEARTBEAT_INTERVAL,
            recover_interval=settings.RECOVER_INTERVAL,
            stale_after=settings.STALE_AFTER,
            held_jobs=lambda: list(self._running.values()),
            unflushed_job_ids=lambda: [outcome.job_id for outcome in self._outcomes],
            stopping=self._threads_stopping,
            on_rate_limited=lambda limited: setattr(self.pacing, "limited", limited),
            response_timeout=self.response_timeout,
            announced=self._due_jobs_announced,
            # Its beats run on the listener's connection: no connection of its own.
            listener=self._listener,
        )
        threads.insert(0, heartbeat)
        for thread in threads:
            thread.start()
        return threads

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Handle SIGTERM/SIGINT; return the handlers they replace, to restore them."""
        if threading.current_thread() is not threading.main_thread():
            return {}  # signals can only be handled in the main thread (e.g. under tests)
        return {
            signum: signal.signal(signum, self._handle_signal)
            for signum in (signal.SIGTERM, signal.SIGINT)
        }

    def _hand_back(self) -> None:
        """Before a forced exit: write what this worker holds, within about a second."""
        # Copies: the loop this signal interrupted may be changing them.
        outcomes = forced_exit_outcomes(list(self._running.values()), list(self._outcomes))
        if not outcomes:
            return
        written = hand_back(self.using, *finish_statement(outcomes, self.worker_id))
        if written is None:
            logger.error(
                "%d job(s) not handed back; recovery returns them once their heartbeat "
                "is STALE_AFTER old",
                len(outcomes),
            )
        else:
            logger.warning("handed back or recorded %d job(s) before exiting", written)

    def _handle_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals_received += 1
        name = signal.Signals(signum).name
        if self._signals_received > 1:
            logger.warning("%s again: handing held jobs back, then exiting", name)
            self._hand_back()
            os._exit(128 + signum)
        logger.info(
            "%s: stopping; running jobs have %.1fs to finish (send again to exit at once)",
            name,
            self.shutdown_grace,
        )
        self.stop()


def _log_outcome(job: Job, outcome: Outcome) -> None:
    if outcome.status == COMPLETED:
        logger.debug("job %s (%s) completed", job.id, job.job_type, extra=job_fields(job))
        return
    fields = job_fields(job)
    if outcome.status == PENDING and outcome.refund and not (outcome.snoozed or outcome.suspended):
        logger.info(
            "job %s (%s) not started by the moment its rate limit counted it at: handed back",
            job.id,
            job.job_type,
            extra=fields,
        )
    elif outcome.suspended:
        logger.info(
            "job %s (%s) suspended (a sleep or a wait for an event) for up to %.2fs",
            job.id,
            job.job_type,
            outcome.delay,
            extra=fields,
        )
    elif outcome.snoozed:
        logger.info(
            "job %s (%s) snoozed for %.2fs (snooze %d)",
            job.id,
            job.job_type,
            outcome.delay,
            job.snoozes + 1,
            extra=fields,
        )
    elif outcome.status == PENDING:
        logger.warning(
            "job %s (%s) attempt %d/%d failed, retrying in %.2fs: %s%s",
            job.id,
            job.job_type,
            job.attempts,
            job.max_attempts,
            outcome.delay,
            outcome.error,
            _traceback_text(outcome),
            exc_info=_exc_info(outcome),
            extra=fields,
        )
    elif outcome.status == CANCELLED:
        logger.info("job %s (%s) cancelled", job.id, job.job_type, extra=fields)
    else:
        logger.error(
            "job %s (%s) failed: %s%s",
            job.id,
            job.job_type,
            outcome.error,
            _traceback_text(outcome),
            exc_info=_exc_info(outcome),
            extra=fields,
        )


def _exc_info(outcome: Outcome) -> tuple[type[BaseException], BaseException, Any] | None:
    """The ``exc_info`` of a failed attempt's record: what the handler raised, with its
    traceback, for formatters and error trackers (Sentry's logging integration)."""
    exc = outcome.exception
    return None if exc is None else (type(exc), exc, exc.__traceback__)


def _traceback_text(outcome: Outcome) -> str:
    """The traceback to append to the message when there is no exception to attach: a
    process-isolated handler's, which its child process sent as text."""
    if outcome.exception is not None or not outcome.traceback:
        return ""
    return "\n" + outcome.traceback.rstrip("\n")


def _bounded_int(value: Any, field: str, maximum: int, *, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise InvalidWorkerOptionError(
            field, f"must be an integer from {minimum} to {maximum}, got {value!r}"
        )
    return value
