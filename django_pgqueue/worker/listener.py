"""LISTEN for enqueue notifications and wake the worker's main loop; on the leader, send
the wake-up calls for jobs that became due without a notification.

Runs on a dedicated connection in its own thread. When notifications cannot arrive
(the connection fails, or a PgBouncer in transaction mode swallows them) the worker
still polls every ``poll_interval``, so a lost notification costs latency, never a job.

Jobs that become due with time (delayed jobs, retries, snoozes, sleeps) announce
nothing when they do. The workers' leader (the live worker with the lowest id, named by
each heartbeat: worker/heartbeat.py) asks the database every poll interval which queues
have such jobs and notifies them, then sends a tick (``queries.TICK``). An idle worker
that hears the ticks at least as often as it would poll leaves the polling to the
leader: it claims when notified, and otherwise only every ``idle_poll_interval``.
Without the ticks (no leader yet, or it stopped) it polls every ``poll_interval``.

A listener only reads, so it cannot tell a quiet channel from a half-open connection:
after ``probe_interval`` without a notification (the ticks count) it sends a
``SELECT 1``, cut like the worker's other statements when unanswered
(response_watch.py), and reconnects.

Its connection is lent between two waits for notifications (``borrow()``): the
heartbeat's beats run on it, so that a worker holds no connection of its own for them.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from ..response_watch import guard
from ..sideconn import open_raw_connection
from . import queries

logger = logging.getLogger("django_pgqueue.worker")

#: Most seconds the listener blocks waiting for a notification before it looks again
#: whether it must stop, probe or send the leader's wake-up call.
NOTIFIES_TIMEOUT = 0.5
#: Slack on a tick's expected moment (the leader's scheduling, the round trip).
TICK_SLACK = 0.25

T = TypeVar("T")
Work = Callable[[psycopg.Connection[Any]], Any]


class ListenerUnavailable(Exception):
    """The listener cannot lend its connection: it is not listening, or it did not
    start the work in time."""


class NotificationListener(threading.Thread):
    def __init__(
        self,
        *,
        alias: str,
        channel: str,
        queues: Iterable[str] | None,
        wake: threading.Event,
        stopping: threading.Event,
        probe_interval: float = 10.0,
        response_timeout: float = 0.0,
        poll_interval: float = 1.0,
        leads: Callable[[], bool] = lambda: False,
        on_ticks_lost: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(name="pgqueue-listener", daemon=True)
        self._alias = alias
        self._channel = channel
        self._queues = frozenset(queues) if queues else None
        self._wake = wake
        self._stopping = stopping
        self._probe_interval = probe_interval
        self._response_timeout = response_timeout
        self._poll_interval = poll_interval
        self._leads = leads
        self._on_ticks_lost = on_ticks_lost
        self.listening = threading.Event()
        #: ``time.monotonic()`` of the last relevant notification (0: none yet).
        self.last_notified = 0.0
        #: ``time.monotonic()`` of the last tick heard, and the gap before it.
        self._last_tick = -math.inf
        self._tick_gap = math.inf
        #: The server's moment of the leader's last wake-up call (None: none yet).
        self._woken_until: datetime | None = None
        #: Work waiting for the connection (``borrow()``), with the future of its result.
        self._requests: queue.SimpleQueue[tuple[Work, str, Future[Any]]] = queue.SimpleQueue()

    def borrow(self, work: Callable[[psycopg.Connection[Any]], T], what: str, wait: float) -> T:
        """Run ``work`` on the listening connection, in the listener's thread between two
        waits for notifications, and return its result (thread-safe).

        Its statements are bounded like the listener's own, named ``what`` in the error.
        Raises ``ListenerUnavailable`` when the listener is not listening or has not
        started the work within ``wait`` seconds (the caller then uses a connection of
        its own); the work's own errors are raised as they are.
        """
        if not self.listening.is_set():
            raise ListenerUnavailable("the listener is not listening")
        request: Future[T] = Future()
        self._requests.put((work, what, request))
        try:
            return request.result(wait)
        except TimeoutError:
            if request.cancel():
                raise ListenerUnavailable(
                    f"the listener did not take the work within {wait:g}s"
                ) from None
        return request.result()  # started: bounded like the listener's statements

    def hears_ticks(self, now: float | None = None) -> bool:
        """Whether the leader's ticks reach this worker at least every poll interval:
        then it need not poll (thread-safe)."""
        now = time.monotonic() if now is None else now
        on_time = self._poll_interval + TICK_SLACK
        return (
            self.listening.is_set()
            and self._tick_gap <= on_time
            and now - self._last_tick <= on_time + self._poll_interval
        )

    def run(self) -> None:
        delay = 0.5
        while not self._stopping.is_set():
            try:
                self._listen()
                delay = 0.5
            except psycopg.Error as exc:
                self.listening.clear()
                logger.warning(
                    "LISTEN connection lost (%s); polling only, retrying in %.1fs", exc, delay
                )
                self._stopping.wait(delay)
                delay = min(delay * 2, 30.0)

    def _listen(self) -> None:
        conn = open_raw_connection(self._alias, default_connect_timeout=self._response_timeout)
        try:
            with guard(conn, self._response_timeout, "the listener's LISTEN"):
                # The wake-up call's estimated cost can pass jit_above_cost on a large
                # table, and compiling it would take longer than running it.
                conn.execute("SET jit = off")
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self.listening.set()
            # Wake once on (re)connect: jobs may have arrived while we were not listening.
            self._wake.set()
            heard = time.monotonic()
            next_call = heard
            ticking = False
            while not self._stopping.is_set():
                timeout = min(NOTIFIES_TIMEOUT, max(next_call - time.monotonic(), 0.0))
                for notification in conn.notifies(timeout=timeout):
                    heard = time.monotonic()
                    if notification.payload == queries.TICK:
                        self._tick_gap = heard - self._last_tick
                        self._last_tick = heard
                    elif self._queues is None or notification.payload in self._queues:
                        self.last_notified = heard
                        self._wake.set()
                if self._serve_requests(conn):
                    heard = time.monotonic()  # the connection answers
                now = time.monotonic()
                if self._stopping.is_set():
                    break  # a stopped worker leads no more
                if now >= next_call:
                    if self._leads():
                        self._call_due_queues(conn)
                        heard = time.monotonic()
                    else:
                        self._woken_until = None  # a new leadership starts from its lookback
                    next_call = now + self._poll_interval
                ticking = self._notice_lost_ticks(ticking, now)
                if time.monotonic() - heard >= self._probe_interval:
                    with guard(conn, self._response_timeout, "the listener's probe"):
                        conn.execute("SELECT 1")
                    heard = time.monotonic()
        finally:
            self.listening.clear()
            self._refuse_requests()
            conn.close()

    def _serve_requests(self, conn: psycopg.Connection[Any]) -> bool:
        """Run the work lent the connection since the last look; return whether any ran.

        Raises the error that broke the connection (the listener then reconnects)."""
        served = False
        while True:
            try:
                work, what, request = self._requests.get_nowait()
            except queue.Empty:
                return served
            if not request.set_running_or_notify_cancel():
                continue  # its borrower gave up waiting
            try:
                with guard(conn, self._response_timeout, what):
                    result = work(conn)
            except Exception as exc:
                request.set_exception(exc)
                if isinstance(exc, psycopg.Error) and (conn.closed or conn.broken):
                    raise
            else:
                request.set_result(result)
                served = True

    def _refuse_requests(self) -> None:
        """Send the waiting borrowers back to connections of their own."""
        while True:
            try:
                _, _, request = self._requests.get_nowait()
            except queue.Empty:
                return
            if request.set_running_or_notify_cancel():
                request.set_exception(ListenerUnavailable("the listener stopped listening"))

    def _call_due_queues(self, conn: psycopg.Connection[Any]) -> None:
        """The leader's wake-up call: notify the queues whose jobs became due since the
        last call, then tick."""
        params = {
            "since": self._woken_until,
            "lookback": self._poll_interval,
            "channel": self._channel,
        }
        with guard(conn, self._response_timeout, "the leader's wake-up call"):
            row = conn.execute(queries.WAKE_DUE_QUEUES, params).fetchone()
        if row is not None:
            self._woken_until = row[0]

    def _notice_lost_ticks(self, ticking: bool, now: float) -> bool:
        """Whether ticks reach this worker now; when they stopped, wake the main loop
        (it polls again) and tell the heartbeat (it beats to see who leads now)."""
        hears = self.hears_ticks(now)
        if ticking and not hears:
            logger.info("the leader's ticks stopped; polling every %.3gs", self._poll_interval)
            self._wake.set()
            self._on_ticks_lost()
        return hears
