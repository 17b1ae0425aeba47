"""Turning the rows of a claim into ``Job``s.

The claim has committed by the time its rows are read: each job is this worker's until
it records an outcome, and nothing else heartbeats it. So every row must become either
a ``Job`` the worker runs or an ``Outcome`` it records. A row whose values PostgreSQL
holds but Python cannot (a time outside ``datetime``'s years 1 to 9999, JSON with a
number of more digits than ``int`` accepts), written by SQL outside enqueue's
validation, fails alone with ``UndecodableJobError``; the rest of its batch runs.

The whole batch is decoded at once (the fast path); only when that fails is it read
again row by row.
"""

from __future__ import annotations

import functools
import logging
import traceback
import uuid
from typing import Any

import psycopg
from psycopg import pq, sql

from ..exceptions import UndecodableJobError
from ..logfields import fields
from ..models import Job
from .execution import FAILED, Outcome

logger = logging.getLogger("django_pgqueue.worker")

#: How much of an unreadable value the error quotes.
SHOWN_VALUE_LENGTH = 200
#: The columns of a row that its log record names (``logfields.fields``, after the id);
#: simple types, which decode whatever else in the row does not.
_FIELD_COLUMNS = ("job_type", "queue", "attempts", "worker_id")


def claimed_jobs(cursor: psycopg.Cursor[Any], using: str) -> tuple[list[Job], list[Outcome]]:
    """The jobs of the claim whose result ``cursor`` holds, in its order, and a failed
    outcome for each row that cannot be decoded."""
    columns = column_names(cursor)
    try:
        return Job.from_rows(columns, cursor.fetchall(), using), []
    except Exception:  # any value psycopg, a loader or the model cannot take
        return _row_by_row(cursor, columns, using)


def column_names(cursor: psycopg.Cursor[Any]) -> tuple[str, ...]:
    """The names of the columns of ``cursor``'s result, without building the
    ``Column`` objects of ``cursor.description``."""
    result = cursor.pgresult
    assert result is not None
    return _decoded_names(tuple(result.fname(i) or b"" for i in range(result.nfields)))


@functools.lru_cache(maxsize=16)
def _decoded_names(names: tuple[bytes, ...]) -> tuple[str, ...]:
    return tuple(name.decode() for name in names)


def _row_by_row(
    cursor: psycopg.Cursor[Any], columns: tuple[str, ...], using: str
) -> tuple[list[Job], list[Outcome]]:
    result = cursor.pgresult
    assert result is not None
    jobs: list[Job] = []
    outcomes: list[Outcome] = []
    for row in range(result.ntuples):
        cursor.scroll(row, mode="absolute")
        try:
            fetched = cursor.fetchone()
            assert fetched is not None  # the cursor stands on one of the result's rows
            jobs.extend(Job.from_rows(columns, [fetched], using))
        except Exception as exc:
            outcomes.append(_undecodable(cursor, columns, row, exc))
    return jobs, outcomes


def _undecodable(
    cursor: psycopg.Cursor[Any], columns: tuple[str, ...], row: int, exc: Exception
) -> Outcome:
    """The failed outcome of the job in ``row``, which ``exc`` kept from being decoded."""
    job_id = _load(cursor, row, columns.index("id"))
    assert isinstance(job_id, uuid.UUID)
    column = _first_unloadable(cursor, columns, row)
    reason = f"{type(exc).__name__}: {exc}"
    if column is None:
        what = f"a value the worker cannot read in Python ({reason})"
    else:
        what = (
            f"column {column} holds {_shown(cursor, job_id, column)}, which the worker "
            f"cannot read in Python ({reason})"
        )
    error = UndecodableJobError(
        f"{what}: it was written outside enqueue's validation (by SQL, say). Correct the "
        "value (or delete the job), then retry the job"
    )
    known = [_load(cursor, row, columns.index(name)) for name in _FIELD_COLUMNS]
    logger.error(
        "job %s cannot be decoded and fails: %s", job_id, error, extra=fields(job_id, *known)
    )
    return Outcome(
        job_id,
        FAILED,
        # Set by the claim itself (now()): always readable.
        _load(cursor, row, columns.index("claimed_at")),
        error=f"{type(error).__name__}: {error}",
        traceback="".join(traceback.format_exception(exc)),
    )


def _load(cursor: psycopg.Cursor[Any], row: int, column: int) -> Any:
    """The value of one cell, decoded by the loader the cursor would use."""
    result = cursor.pgresult
    assert result is not None
    data = result.get_value(row, column)
    if data is None:
        return None
    oid = result.ftype(column)
    loader = cursor.adapters.get_loader(oid, pq.Format(result.fformat(column)))
    if loader is None:
        return data
    return loader(oid, cursor).load(data)


def _first_unloadable(
    cursor: psycopg.Cursor[Any], columns: tuple[str, ...], row: int
) -> str | None:
    for index, name in enumerate(columns):
        try:
            _load(cursor, row, index)
        except Exception:
            return name
    return None


def _shown(cursor: psycopg.Cursor[Any], job_id: uuid.UUID, column: str) -> str:
    """The value of ``column`` of the job as PostgreSQL prints it, quoted and cut short."""
    query = sql.SQL("SELECT {}::text FROM pgqueue_jobs WHERE id = %s").format(
        sql.Identifier(column)
    )
    try:
        found = psycopg.Cursor(cursor.connection).execute(query, [job_id], prepare=False).fetchone()
    except psycopg.Error as exc:
        return f"a value that could not be read back ({exc})"
    text = "" if found is None or found[0] is None else found[0]
    if len(text) > SHOWN_VALUE_LENGTH:
        text = text[:SHOWN_VALUE_LENGTH] + "..."
    return repr(text)
