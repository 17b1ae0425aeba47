"""One Django cursor per live database connection, reused by single enqueues.

``connection.cursor()`` costs the client about as much as the INSERT it is opened for:
Django's async-safety and health checks, a new driver cursor with its own copy of the
type adapters, a new wrapper, and closing it all again. A loop of single ``enqueue()``
calls paid that for every job: measured in instructions, 84,000 per call against 93,000
for a whole bare INSERT through psycopg.

The reused cursor is a Django ``CursorWrapper`` obtained from ``connection.cursor()``, so
statements still go through Django's ``execute`` (error translation, the broken
transaction check, ``connection.execute_wrapper()`` hooks, and whatever instrumentation
wraps ``cursor()`` or ``CursorWrapper``). It is used only when a fresh ``cursor()`` call
would do nothing the cached one misses:

- the same driver connection is still open (a reconnect, ``close_old_connections()`` or a
  connection pool hand-back makes a new cursor);
- queries are not being logged (``DEBUG``, ``assertNumQueries``, ``CaptureQueriesContext``
  and the debug toolbar each get their own logging cursor);
- the per-request health check has run or is off (``CONN_HEALTH_CHECKS``);
- no event loop runs in this thread (``cursor()`` raises ``SynchronousOnlyOperation``);
- the connection is not shared between threads (a cursor must not be).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper


# Per thread, like Django's connections, and outside them: kept on the DatabaseWrapper, the
# cursor (which refers back to it) would make a reference cycle, and a finished thread's
# connection would stay open until the cyclic garbage collector ran.
class _Kept(threading.local):
    def __init__(self) -> None:
        #: By database alias: the driver connection and the cursor made on it.
        self.cursors: dict[str, tuple[Any, CursorWrapper]] = {}


_kept = _Kept()


def execute_fetchone(db: BaseDatabaseWrapper, sql: str, params: list[Any]) -> tuple[Any, ...]:
    """Run ``sql`` on ``db`` through a Django cursor and return its first row."""
    cursor = _reusable_cursor(db)
    if cursor is None:
        with db.cursor() as fresh:
            fresh.execute(sql, params)
            row: tuple[Any, ...] = fresh.cursor.fetchone()
            return row
    cursor.execute(sql, params)
    # The driver's cursor: the result is already read, and Django's wrapper would build
    # an error-translating closure for this one call.
    row = cursor.cursor.fetchone()
    return row


def _reusable_cursor(db: BaseDatabaseWrapper) -> CursorWrapper | None:
    """The cursor kept for ``db``, made on first use; None when one must not be reused."""
    if not _may_reuse(db):
        return None
    kept = _kept.cursors
    connection, cursor = kept.get(db.alias, (None, None))
    if cursor is not None and connection is db.connection and cursor.db is db:
        return cursor
    cursor = db.cursor()  # connects, and runs every check of a first use
    if _may_reuse(db):
        kept[db.alias] = (db.connection, cursor)
        return cursor
    cursor.close()
    return None


def _may_reuse(db: BaseDatabaseWrapper) -> bool:
    # Both are set in BaseDatabaseWrapper.__init__ (Django 4.1+); django-stubs omits them.
    if db.health_check_enabled and not db.health_check_done:  # type: ignore[attr-defined]
        return False
    if db.queries_logged or db.allow_thread_sharing:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False
