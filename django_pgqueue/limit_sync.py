"""Writing what the code and settings declare into a table of limits that staff may
override: ``pgqueue_limits`` (concurrency) and ``pgqueue_rate_limits`` (rates).

Both tables hold a row per ``(scope, name)`` with the declared value and an override.
Every worker writes the declared values when it starts; overrides are never changed by
it. :func:`sync_declared` is that write, for either table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

logger = logging.getLogger("django_pgqueue.limits")

#: ``(scope, name)``.
Key = tuple[str, str]
Value = TypeVar("Value")


@dataclass(frozen=True)
class DeclaredTable(Generic[Value]):
    """A table of declared and overridden limits."""

    #: The table, e.g. ``pgqueue_limits``.
    table: str
    #: What a row is called in the log, e.g. ``"concurrency limit"``.
    noun: str
    #: The advisory lock that serialises the writers of the table.
    lock_key: str
    #: A column that is NULL when no override is set.
    override_column: str
    #: The declared value's columns and their SQL types.
    declared_columns: Sequence[tuple[str, str]]
    #: A declared value as the values of ``declared_columns``, in order.
    columns_of: Callable[[Value], Sequence[Any]]


def sync_declared(
    table: DeclaredTable[Value],
    cursor: Any,
    declared: Mapping[Key, Value],
    stored: Mapping[Key, Value],
) -> tuple[list[Key], list[tuple[Key, Value]]]:
    """Make the declared values of ``table`` (``stored``: those it holds now) equal to
    ``declared``, with ``cursor`` inside the caller's transaction; return what was
    removed and what was changed or added, each sorted.

    Undeclared rows are removed, but a row with an override keeps it (without its
    declared value); nothing is written when the table already matches. Call it under
    :func:`lock`.
    """
    removed = sorted(set(stored) - set(declared))
    changed = sorted(
        ((key, value) for key, value in declared.items() if stored.get(key) != value),
        key=lambda pair: pair[0],
    )
    if removed:
        keys = [[scope for scope, _ in removed], [name for _, name in removed]]
        cursor.execute(
            f"DELETE FROM {table.table} WHERE {table.override_column} IS NULL "
            "AND (scope, name) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
            keys,
        )
        cleared = ", ".join(f"{column} = NULL" for column, _ in table.declared_columns)
        cursor.execute(
            f"UPDATE {table.table} SET {cleared}, updated_at = now() "
            "WHERE (scope, name) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
            keys,
        )
    if changed:
        columns = [column for column, _ in table.declared_columns]
        arrays = ", ".join(f"%s::{sql_type}[]" for _, sql_type in table.declared_columns)
        values = [table.columns_of(value) for _, value in changed]
        cursor.execute(
            f"INSERT INTO {table.table} (scope, name, {', '.join(columns)}, updated_at) "
            f"SELECT *, now() FROM unnest(%s::text[], %s::text[], {arrays}) "
            "ON CONFLICT (scope, name) DO UPDATE SET "
            + ", ".join(f"{column} = EXCLUDED.{column}" for column in columns)
            + ", updated_at = now()",
            [
                [scope for (scope, _), _ in changed],
                [name for (_, name), _ in changed],
                *([row[i] for row in values] for i in range(len(columns))),
            ],
        )
    return removed, changed


def lock(table: DeclaredTable[Any], cursor: Any) -> None:
    """Take the lock that serialises the writers of ``table`` (until the transaction
    ends)."""
    cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [table.lock_key])


def log_changes(
    table: DeclaredTable[Value],
    stored: Mapping[Key, Value],
    removed: Sequence[Key],
    changed: Sequence[tuple[Key, Value]],
) -> None:
    """Log each change :func:`sync_declared` made (``django_pgqueue.limits``, INFO)."""
    for scope, name in removed:
        logger.info("%s removed: %s %s (was %s)", table.noun, scope, name, stored[scope, name])
    for (scope, name), value in changed:
        previous = stored.get((scope, name))
        logger.info(
            "%s set: %s %s = %s (was %s)",
            table.noun,
            scope,
            name,
            value,
            "none" if previous is None else previous,
        )
