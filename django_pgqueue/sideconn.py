"""Autocommit side connections, for writes that must be visible before the caller's
transaction ends (progress updates from inside an atomic handler)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from django.db import connections

_local = threading.local()


def _open(alias: str) -> Any:
    wrapper = connections[alias]
    conn = wrapper.get_new_connection(wrapper.get_connection_params())
    conn.autocommit = True
    # A progress write that waits on a row lock held by the caller's own transaction
    # would wait forever: fail after a while instead.
    conn.execute("SET lock_timeout = '10s'")
    return conn


def execute_autocommit(alias: str, sql: str, params: tuple[Any, ...]) -> int:
    """Run one statement on this thread's side connection to ``alias``; return rowcount.

    The connection is opened on first use and reopened once if it was broken.
    """
    pool: dict[str, Any] = _local.__dict__.setdefault("connections", {})
    for attempt in (1, 2):
        conn = pool.get(alias)
        if conn is None or conn.closed:
            conn = pool[alias] = _open(alias)
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.rowcount
        except psycopg.OperationalError:
            pool.pop(alias, None)
            conn.close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def close_side_connections() -> None:
    """Close this thread's side connections (workers call it when a thread ends)."""
    pool: dict[str, Any] = _local.__dict__.get("connections", {})
    while pool:
        _, conn = pool.popitem()
        conn.close()
