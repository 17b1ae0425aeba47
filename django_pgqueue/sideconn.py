"""Connections of our own, outside Django's per-thread connection handling: autocommit
side connections for writes that must be visible before the caller's transaction ends
(progress updates from inside an atomic handler), and the worker's LISTEN connection."""

from __future__ import annotations

import math
import threading
from typing import Any

import psycopg
from django.db import DatabaseError, OperationalError, connections

_local = threading.local()


def open_raw_connection(
    alias: str, *, default_connect_timeout: float | None = None, **overrides: Any
) -> psycopg.Connection[Any]:
    """A new autocommit psycopg connection with the settings of database ``alias``,
    and ``overrides`` of its connection parameters (``connect_timeout=2``, say).
    ``default_connect_timeout``: seconds to wait for the connection when the settings
    name no ``connect_timeout`` (libpq's default is to wait as long as the network
    does).

    Opened directly, never taken from Django's connection pool (``OPTIONS["pool"]``):
    these connections live outside the pool's accounting.
    """
    params = {**connections[alias].get_connection_params(), **overrides}
    if default_connect_timeout and "connect_timeout" not in params:
        params["connect_timeout"] = max(math.ceil(default_connect_timeout), 2)
    conn = psycopg.Connection.connect(**params)
    conn.autocommit = True
    return conn


def execute_autocommit(alias: str, sql: str, params: tuple[Any, ...]) -> int:
    """Run one statement on this thread's side connection to ``alias``; return rowcount.

    The connection is opened on first use and reopened once if it was broken. Errors are
    raised as Django's ``DatabaseError`` subclasses, like any other query's.
    """
    rowcount, _ = _run(alias, sql, params, fetch=False)
    return rowcount


def fetch_autocommit(alias: str, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Run one statement on this thread's side connection to ``alias``, as
    ``execute_autocommit()`` does; return its first row (None: no row)."""
    _, row = _run(alias, sql, params, fetch=True)
    return row


def _run(
    alias: str, sql: str, params: tuple[Any, ...], *, fetch: bool
) -> tuple[int, tuple[Any, ...] | None]:
    pool: dict[str, Any] = _local.__dict__.setdefault("connections", {})
    for attempt in (1, 2):
        conn = pool.get(alias)
        try:
            if conn is None or conn.closed:
                conn = pool[alias] = open_raw_connection(alias)
                # A write that waits on a row lock held by the caller's own transaction
                # would wait forever: fail after a while instead.
                conn.execute("SET lock_timeout = '10s'")
            with conn.cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.rowcount, cursor.fetchone() if fetch else None
        except psycopg.OperationalError as exc:
            broken = conn is None or conn.broken or conn.closed
            if broken:
                pool.pop(alias, None)
            if not broken or attempt == 2:
                raise OperationalError(str(exc)) from exc
        except psycopg.Error as exc:
            raise DatabaseError(str(exc)) from exc
    raise AssertionError("unreachable")


def close_side_connections(**kwargs: Any) -> None:
    """Close this thread's side connections.

    Worker threads call it when they end; it is also connected to ``request_finished``,
    so a ``set_progress`` from a view does not leave a connection behind.
    """
    pool: dict[str, Any] = _local.__dict__.get("connections", {})
    while pool:
        _, conn = pool.popitem()
        conn.close()
