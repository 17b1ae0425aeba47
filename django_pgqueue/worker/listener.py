"""LISTEN for enqueue notifications and wake the worker's main loop.

Runs on a dedicated connection in its own thread. When notifications cannot arrive
(the connection fails, or a PgBouncer in transaction mode swallows them) the worker
still polls every ``poll_interval``, so a lost notification costs latency, never a job.

A listener only reads, so it cannot tell a quiet channel from a half-open connection:
after ``probe_interval`` without a notification it sends a ``SELECT 1``, cut like the
worker's other statements when unanswered (response_watch.py), and reconnects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

import psycopg
from psycopg import sql

from ..response_watch import guard
from ..sideconn import open_raw_connection

logger = logging.getLogger("django_pgqueue.worker")


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
    ) -> None:
        super().__init__(name="pgqueue-listener", daemon=True)
        self._alias = alias
        self._channel = channel
        self._queues = frozenset(queues) if queues else None
        self._wake = wake
        self._stopping = stopping
        self._probe_interval = probe_interval
        self._response_timeout = response_timeout
        self.listening = threading.Event()
        #: ``time.monotonic()`` of the last relevant notification (0: none yet).
        self.last_notified = 0.0

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
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self.listening.set()
            # Wake once on (re)connect: jobs may have arrived while we were not listening.
            self._wake.set()
            heard = time.monotonic()
            while not self._stopping.is_set():
                for notification in conn.notifies(timeout=0.5):
                    heard = time.monotonic()
                    if self._queues is None or notification.payload in self._queues:
                        self.last_notified = heard
                        self._wake.set()
                if time.monotonic() - heard >= self._probe_interval:
                    with guard(conn, self._response_timeout, "the listener's probe"):
                        conn.execute("SELECT 1")
                    heard = time.monotonic()
        finally:
            self.listening.clear()
            conn.close()
