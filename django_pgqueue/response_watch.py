"""Cut a connection the database has stopped answering.

A connection can go half-open: a load balancer, a NAT or a network partition stops
carrying its packets without closing either end. A statement sent on it waits for an
answer that never comes, and the kernel notices only with TCP keepalives (hours by
default, and never when a userspace proxy on the path still answers for the server). So
the worker bounds its own statements (claims and outcomes, heartbeats, the listener's
probe, checkpoints, a completion written in a handler's transaction): each runs under
``guard()``, and one watch thread shuts the socket of a statement still unanswered after
``PGQUEUE["RESPONSE_TIMEOUT"]``. The blocked call then fails as on a lost connection and
the caller's usual handling reconnects. Handlers' own statements are not bounded: a
long query is theirs to run (TCP keepalives cover their connections, see the
production how-to).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

logger = logging.getLogger("django_pgqueue.worker")

#: How often the watch thread looks for overdue statements, at most, in seconds.
TICK_SECONDS = 0.25


class ResponseWatch:
    """One thread watching the guarded statements of a process; started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[object, tuple[psycopg.Connection[Any], float, float, str]] = {}
        self._thread: threading.Thread | None = None
        #: How many connections the watch has cut (for tests and logs).
        self.cut = 0

    @contextlib.contextmanager
    def guard(
        self, conn: psycopg.Connection[Any], timeout: float, what: str = "a statement"
    ) -> Iterator[None]:
        """Run the block's statements on ``conn``, cutting the connection if they wait
        longer than ``timeout`` seconds for the database's answer (0: never)."""
        if timeout <= 0:
            yield
            return
        token = object()
        with self._lock:
            self._waiting[token] = (conn, time.monotonic() + timeout, timeout, what)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="pgqueue-response-watch", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._waiting.pop(token, None)

    def _run(self) -> None:
        while True:
            time.sleep(TICK_SECONDS)
            now = time.monotonic()
            with self._lock:
                overdue = [
                    (token, entry) for token, entry in self._waiting.items() if entry[1] <= now
                ]
                for token, (conn, _, timeout, what) in overdue:
                    # Under the lock: the guarded block cannot end (and its connection
                    # be closed, its descriptor reused) while the socket is shut.
                    del self._waiting[token]
                    if _shut(conn):
                        self.cut += 1
                        logger.warning(
                            "no answer from the database to %s within %gs: closing its "
                            "connection (half-open?) to reconnect",
                            what,
                            timeout,
                        )


def _shut(conn: psycopg.Connection[Any]) -> bool:
    """Shut ``conn``'s socket both ways, which wakes a call waiting on it with an error;
    False if it was closed already."""
    if conn.closed:
        return False
    try:
        fd = conn.pgconn.socket
        # A socket object over a duplicate of the descriptor: shutting it down acts on
        # the connection's socket itself; closing it closes only the duplicate.
        with socket.socket(fileno=socket.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, psycopg.Error):
        return False
    return True


#: The process's watch.
WATCH = ResponseWatch()


def guard(
    conn: psycopg.Connection[Any], timeout: float, what: str = "a statement"
) -> contextlib.AbstractContextManager[None]:
    """``WATCH.guard()``: bound the block's wait for ``conn``'s answers."""
    return WATCH.guard(conn, timeout, what)


@contextlib.contextmanager
def guarded_connection(
    conn: psycopg.Connection[Any], timeout: float, what: str
) -> Iterator[psycopg.Connection[Any]]:
    """``guard()`` as a block that gives ``conn``: ``with guarded_connection(...) as c:``."""
    with WATCH.guard(conn, timeout, what):
        yield conn


def statement_guard(timeout: float, what: str) -> Callable[..., Any]:
    """A Django ``execute_wrapper`` that runs each statement of a connection under
    ``guard()``: ``with connection.execute_wrapper(statement_guard(30, "heartbeats")):``."""

    def wrapper(
        execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        raw = context["connection"].connection
        if raw is None:
            return execute(sql, params, many, context)
        with WATCH.guard(raw, timeout, what):
            return execute(sql, params, many, context)

    return wrapper
