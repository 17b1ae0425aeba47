"""The heartbeat thread: proves this worker is alive, relays cancellation requests and
learns whether it leads. The leader alone (the live worker with the lowest id) recovers
jobs of workers that died, prunes, writes the rollups, enqueues periodic jobs on their
ticks and, from its listener, wakes idle workers for jobs that became due with time:
with every worker doing so, a hundred idle workers kept the database busy.

A worker holding jobs beats every ``interval`` (its jobs' heartbeats); an idle one that
hears the leader's ticks every ``idle_interval``, enough to stay alive in the admin's
eyes (``STALE_AFTER``) and to take the lead when the leader is gone.

A beat runs on the listener's connection when the worker listens (a worker then holds
no connection for its heartbeats), and on this thread's own Django connection when it
does not, or while the listener reconnects. The leader's periodic work uses Django's
ORM on this thread's connection, opened for it and closed after it when the beats go
through the listener."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.db import DatabaseError, connections

from ..exceptions import PgQueueError
from ..horizon import HorizonWatch
from ..logfields import job_fields
from ..periodic import database_now, enqueue_due_ticks, schedules
from ..pruning import prune_by_settings, prune_events_by_settings
from ..rate_limits import prune_rate_starts
from ..recovery import recover_stale_jobs, release_held_jobs
from ..response_watch import statement_guard
from ..rollups import write_rollups
from . import queries
from .execution import RunningJob
from .listener import ListenerUnavailable, NotificationListener

logger = logging.getLogger("django_pgqueue.worker")

#: Most seconds a beat waits for the listener to take it (it looks between waits for
#: notifications of at most ``listener.NOTIFIES_TIMEOUT``) before it uses a connection
#: of its own.
LISTENER_WAIT = 2.0

BeatRows = tuple[tuple[Any, ...], list[tuple[Any, ...]]]


class Heartbeat(threading.Thread):
    def __init__(
        self,
        *,
        alias: str,
        worker_id: str,
        interval: float,
        recover_interval: float,
        stale_after: float,
        held_jobs: Callable[[], list[RunningJob]],
        unflushed_job_ids: Callable[[], list[Any]],
        stopping: threading.Event,
        run_schedules: bool = True,
        on_rate_limited: Callable[[bool], None] | None = None,
        response_timeout: float = 0.0,
        announced: Callable[[], bool] = lambda: False,
        listener: NotificationListener | None = None,
    ) -> None:
        super().__init__(name="pgqueue-heartbeat", daemon=True)
        self._alias = alias
        self._worker_id = worker_id
        self._interval = interval
        self._recover_interval = recover_interval
        self._stale_after = stale_after
        self._held_jobs = held_jobs
        self._unflushed_job_ids = unflushed_job_ids
        self._stopping = stopping
        self._run_schedules = run_schedules
        self._on_rate_limited = on_rate_limited
        self._horizon = HorizonWatch()
        self._response_timeout = response_timeout
        self._announced = announced
        self._listener = listener
        #: Seconds between the beats of an idle worker that hears the leader's ticks.
        self._idle_interval = max(interval, stale_after / 3)
        self._nudged = threading.Event()
        #: Whether its last beat found it the leader (read by the listener).
        self.leads = False
        #: Whether its last beat found a concurrency limit (read by the main loop).
        self.concurrency_limited = True
        self._beaten = False

    def nudge(self) -> None:
        """Beat now (the leader's ticks stopped), or look at ``stopping`` now."""
        self._nudged.set()

    def run(self) -> None:
        started = time.monotonic()
        next_beat = started  # at once: whether it leads
        next_recovery = started + self._recover_interval
        # At once on start: a leader starting after downtime enqueues missed ticks now.
        next_schedule = started if self._run_schedules else math.inf
        # Every statement of this thread's connection is bounded: a heartbeat stuck on a
        # half-open connection would let this worker's jobs be recovered while it runs.
        unanswered = statement_guard(self._response_timeout, "the heartbeat's statements")
        try:
            with connections[self._alias].execute_wrapper(unanswered):
                while not self._stopping.is_set():
                    until = min(next_beat, next_schedule if self.leads else math.inf)
                    if self._nudged.wait(max(until - time.monotonic(), 0)):
                        self._nudged.clear()
                        next_beat = time.monotonic()
                    if self._stopping.is_set():
                        break
                    if time.monotonic() >= next_beat:
                        next_recovery = self._maintain(next_recovery)
                        next_beat = time.monotonic() + self._beat_interval()
                    if self.leads and time.monotonic() >= next_schedule:
                        next_schedule = self._enqueue_periodic_jobs()
                    if self._listener is not None:
                        # The beats go through the listener: hold no connection between
                        # the leader's rounds of periodic work, nor after a beat made
                        # while the listener could not lend its connection (the first,
                        # often: this thread starts before the listener listens).
                        connections[self._alias].close()
        finally:
            connections.close_all()

    def _beat_interval(self) -> float:
        """Seconds to the next beat: ``interval`` while it leads, holds jobs or cannot
        count on the leader's wake-up calls, ``idle_interval`` otherwise."""
        if self.leads or self._held_jobs() or self._unflushed_job_ids():
            return self._interval
        return self._idle_interval if self._announced() else self._interval

    def _maintain(self, next_recovery: float) -> float:
        """Beat; as the leader also recover, prune and write the minute's rollups;
        return when recovery is due next."""
        try:
            led, first = self.leads, not self._beaten
            self.leads = self.beat()
            if not self.leads or first:
                # The first beat, at start, only learns whether it leads: the periodic
                # work waits for the next one, as it did when that was the first.
                return next_recovery
            if not led:
                # It took over from a leader that stopped or died: that one's jobs (or
                # another's) may be waiting for recovery already.
                next_recovery = time.monotonic()
            if time.monotonic() >= next_recovery:
                next_recovery = time.monotonic() + self._recover_interval
                recover_stale_jobs(self._stale_after, using=self._alias)
                release_held_jobs(using=self._alias)
                prune_rate_starts(using=self._alias)
                prune_events_by_settings(using=self._alias)
                self._horizon.check(using=self._alias)
                with connections[self._alias].cursor() as cursor:
                    cursor.execute(queries.FORGET_OLD_WORKERS)
            # Bounded in time so that heartbeats stay on schedule; a backlog of
            # finished jobs shrinks over the following beats.
            prune_by_settings(max_seconds=self._interval / 2, using=self._alias)
            write_rollups(using=self._alias)
        except (DatabaseError, psycopg.Error) as exc:
            logger.warning("heartbeat failed (%s); retrying in %.1fs", exc, self._interval)
            connections[self._alias].close()
        return next_recovery

    def _enqueue_periodic_jobs(self) -> float:
        """Enqueue due ticks of periodic jobs; return when to do it next.

        Next is the earliest upcoming tick by the database's clock (this host's may run
        fast or slow), so ticks are enqueued on time, but never later than one interval
        away: a tick that could not be enqueued is caught up within an interval. Never
        raises.
        """
        try:
            found = schedules(self._alias)
            if not found:
                return time.monotonic() + self._interval
            now = database_now(self._alias)
            enqueue_due_ticks(now=now, using=self._alias)
            upcoming = min(schedule.next_tick(now) for schedule in found)
        except DatabaseError as exc:
            logger.warning(
                "periodic jobs: could not enqueue due ticks (%s); retrying in %.1fs",
                exc,
                self._interval,
            )
            connections[self._alias].close()
            return time.monotonic() + self._interval
        except PgQueueError as exc:
            logger.error("periodic jobs: %s; retrying in %.1fs", exc, self._interval)
            return time.monotonic() + self._interval
        except Exception:
            # A broken schedule must not stop heartbeats: they keep this worker's jobs.
            logger.exception("periodic jobs: unexpected error; retrying in %.1fs", self._interval)
            return time.monotonic() + self._interval
        wait = min(self._interval, max((upcoming - now).total_seconds(), 0.0))
        return time.monotonic() + wait

    def beat(self) -> bool:
        """Refresh ``heartbeat_at`` of this worker and its held jobs, deliver cancellation
        requests; return whether it leads.

        Held jobs are those running in a slot and those whose outcome is not written yet.
        Also tells the worker whether rate limits exist (staff may add one at any time).
        """
        # Snapshot before the query: a job claimed after it cannot be mistaken for lost.
        held = {running.job.id: running for running in self._held_jobs()}
        ids = [*held, *self._unflushed_job_ids()]
        params = {"worker": self._worker_id, "stale_after": self._stale_after}

        def statements(cursor: Any) -> BeatRows:
            cursor.execute(queries.WORKER_BEAT, params)
            worker_row = cursor.fetchone()
            if not ids:
                return worker_row, []
            cursor.execute(queries.HEARTBEAT, [ids, self._worker_id])
            return worker_row, cursor.fetchall()

        (leads, rate_limited, self.concurrency_limited), rows = self._run(statements)
        self._beaten = True
        if self._on_rate_limited is not None:
            self._on_rate_limited(bool(rate_limited))
        still_ours = set()
        for job_id, cancel_requested in rows:
            still_ours.add(job_id)
            running = held.get(job_id)
            if running and cancel_requested and not running.cancel_event.is_set():
                logger.info(
                    "cancellation requested for job %s", job_id, extra=job_fields(running.job)
                )
                running.cancel_event.set()
        for job_id, running in held.items():
            if job_id not in still_ours and running.outcome is None:
                # Recovery gave the job to someone else (our heartbeat was late): ask the
                # handler to stop; whatever it reports will not be recorded.
                logger.warning(
                    "job %s is no longer held by %s",
                    job_id,
                    self._worker_id,
                    extra=job_fields(running.job),
                )
                running.cancel_event.set()
        return bool(leads)

    def _run(self, statements: Callable[[Any], BeatRows]) -> BeatRows:
        """Run the beat's ``statements`` on a cursor of the listener's connection, or of
        this thread's own when the listener cannot lend its connection."""
        if self._listener is not None:

            def on_listener(conn: psycopg.Connection[Any]) -> BeatRows:
                with conn.cursor() as cursor:
                    return statements(cursor)

            try:
                what = "the heartbeat's statements (on the listener's connection)"
                return self._listener.borrow(on_listener, what, LISTENER_WAIT)
            except ListenerUnavailable:
                pass
        with connections[self._alias].cursor() as cursor:
            return statements(cursor)
