"""The inserts of plain jobs, and the NOTIFY that wakes idle workers: one statement
for one job, ``COPY`` for many; the statements the unique inserts share with them.

Inserts run on the caller's connection, so inside ``transaction.atomic`` the jobs exist
only if that transaction commits; the NOTIFY is sent in the same statement (or, after a
``COPY``, the same transaction) and PostgreSQL delivers it only on commit.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import json
import logging
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from . import conf, signals
from .due import DUE
from .held import held_among, release_keys
from .jobrows import JobRow
from .logfields import job_fields

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .models import Job

logger = logging.getLogger("django_pgqueue.enqueue")

COLUMNS = (
    "id, job_type, queue, priority, data, run_at, max_attempts, concurrency_key, held, timeout, "
    "trace_context"
)

# The plain inserts return only what the database decides (the times, as exact integer
# microseconds since the epoch); the rest of each Job is what was sent. Decoding whole
# rows cost more than the insert itself.
_MICROS = "(extract(epoch FROM inserted.{0}) * 1000000)::int8"

# Without a NOTIFY the insert needs no CTE: a bare INSERT, the cheapest statement.
INSERT_ONE_QUIET = f"""
INSERT INTO pgqueue_jobs AS inserted ({COLUMNS})
VALUES (%s, %s, %s, %s, %s::jsonb,
        COALESCE(%s::timestamptz, now() + %s * interval '1 second'), %s, %s, %s, %s, %s::jsonb)
RETURNING {_MICROS.format("created_at")}, {_MICROS.format("run_at")}
"""

# The commonest case, an undelayed job (due at once) without a concurrency key and with
# no NOTIFY to send, in six parameters instead of nine (run_at is now(), as the general
# statement sets it): psycopg adapts every parameter of every call, and a loop of these
# is the W1 benchmark.
INSERT_ONE_DUE_QUIET = f"""
INSERT INTO pgqueue_jobs AS inserted (id, job_type, queue, priority, data, run_at, max_attempts)
VALUES (%s, %s, %s, %s, %s::jsonb, now(), %s)
RETURNING {_MICROS.format("created_at")}, {_MICROS.format("run_at")}
"""

# A batch of plain jobs is streamed with COPY: the server inserts rows while the rest of
# the batch is still being formatted, and writes them in multi-row heap inserts; an
# INSERT ... SELECT from one JSON document ran at less than half the speed. COPY cannot
# return the times, so they are read first: ``created_at`` is that clock reading plus one
# microsecond per row (input order is claim order among equal priorities) and an
# undelayed ``run_at`` is the transaction's ``now()``, as a single INSERT would set it.
_CLOCK = """
SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8,
       (extract(epoch FROM now()) * 1000000)::int8
"""
_COPY = f"COPY pgqueue_jobs ({COLUMNS}, created_at) FROM STDIN"
# Sent after the COPY, with each queue's earliest run_at: the server decides which are
# due, as it does in the other inserts' NOTIFY. In autocommit the jobs are committed by
# then, and inside a transaction PostgreSQL delivers the notification on commit.
_NOTIFY_QUEUES = f"""
SELECT count(pg_notify(%s, queue))
  FROM unnest(%s::text[], %s::timestamptz[]) AS earliest(queue, run_at)
 WHERE {DUE}
"""

INSERT_ONE = f"""
WITH inserted AS (
    INSERT INTO pgqueue_jobs ({COLUMNS})
    VALUES (%s, %s, %s, %s, %s::jsonb,
            COALESCE(%s::timestamptz, now() + %s * interval '1 second'), %s, %s, %s, %s,
            %s::jsonb)
    RETURNING queue, created_at, run_at  -- queue and run_at: for the NOTIFY
){{notify}}
SELECT {_MICROS.format("created_at")}, {_MICROS.format("run_at")}
  FROM inserted{{notify_join}}
"""


# pg_notify in a CTE joined to the result, so it runs in the same statement. PostgreSQL
# folds identical notifications of one transaction into one and delivers them on commit.
_NOTIFY = f""", notified AS (
    SELECT count(pg_notify(%s, due.queue)) AS sent
      FROM (SELECT DISTINCT queue FROM inserted WHERE {DUE}) AS due
)"""
_NOTIFY_JOIN = " CROSS JOIN notified"


#: An autocommit enqueue skips its NOTIFY when this process already sent one for each of
#: its queues this recently; workers claim again this long after every notification, so
#: no job waits for a poll. Each NOTIFY serialises commits on a database-wide lock: a loop
#: of single enqueues ran at half speed with one per job.
NOTIFY_COALESCE_SECONDS = 0.005

_last_notified: dict[tuple[str, str], float] = {}


def undelayed_queues(rows: Iterable[JobRow]) -> set[str]:
    """The queues of the undelayed ``rows``: the notifications that may be coalesced."""
    return {row.queue for row in rows if row.undelayed}


def has_run_at(rows: Iterable[JobRow]) -> bool:
    """Whether a row has an explicit ``run_at``: only the server can tell if it is due."""
    return any(row.run_at is not None for row in rows)


def wants_notify(
    db: BaseDatabaseWrapper,
    undelayed: set[str],
    *,
    scheduled: bool = False,
    record: bool = True,
) -> bool:
    """Whether an insert on ``db`` should send its NOTIFY; records it when it will.

    ``undelayed``: the queues of its undelayed jobs. ``scheduled``: whether it has jobs
    with an explicit ``run_at``, which the statement notifies for if the server finds
    them due; those are never coalesced. ``record=False`` for unique inserts, which may
    insert nothing: they call ``record_notified`` with what they did insert.
    """
    if db.in_atomic_block:
        # The commit time is unknown inside a transaction: always notify on commit.
        return True
    if not undelayed or scheduled:
        return True  # the server decides what is due: nothing to coalesce
    now = time.monotonic()
    alias = db.alias
    for queue in undelayed:
        if now - _last_notified.get((alias, queue), -math.inf) >= NOTIFY_COALESCE_SECONDS:
            break
    else:
        return False  # every queue was notified this recently
    if record:
        for queue in undelayed:
            _last_notified[(alias, queue)] = now
    return True


def record_notified(db: BaseDatabaseWrapper, undelayed: set[str]) -> None:
    """Note the NOTIFY an autocommit unique insert on ``db`` sent for the ``undelayed``
    queues of the jobs it inserted."""
    if db.in_atomic_block:
        return
    now = time.monotonic()
    for queue in undelayed:
        _last_notified[(db.alias, queue)] = now


def with_notify(template: str, channel_params: list[Any], notify: bool) -> str:
    settings = conf.get_settings()
    if settings.NOTIFY and notify:
        channel_params.append(settings.NOTIFY_CHANNEL)
        return template.format(notify=_NOTIFY, notify_join=_NOTIFY_JOIN)
    return template.format(notify="", notify_join="")


@functools.cache
def _job_model() -> type[Job]:
    # Imported on first use so that ``import django_pgqueue`` works before the app
    # registry is ready; cached, since a relative import costs more than the Job it builds.
    from .models import Job

    return Job


def returning_jobs(sql: str, params: list[Any], using: str) -> list[Job]:
    Job = _job_model()
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        columns = [column.name for column in cursor.description]
        return [Job.from_row(columns, row, using) for row in cursor.fetchall()]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def built(
    rows: Sequence[JobRow],
    times: Sequence[tuple[datetime, datetime]],
    using: str,
    extra: Sequence[dict[str, Any]] | None = None,
) -> list[Job]:
    """The ``Job``s inserts of ``rows`` created, without reading the rows back.

    ``times``: each row's ``created_at`` and ``run_at``; ``extra``: each row's values
    of the columns the plain inserts leave to their defaults (a workflow's status).
    """
    # One decode for the whole batch: each job gets its data as stored (JSON round trip).
    datas = json.loads("[" + ",".join(row.data for row in rows) + "]")
    values = [
        _inserted_values(row, data, created_at, run_at)
        for row, data, (created_at, run_at) in zip(rows, datas, times, strict=True)
    ]
    if extra is not None:
        for row_values, more in zip(values, extra, strict=True):
            row_values.update(more)
    return _job_model().from_new_rows(values, using)


def built_one(row: JobRow, created_us: int, run_us: int, using: str) -> Job:
    """``_built`` for one row, with its times as microseconds since the epoch."""
    created_at = _from_micros(created_us)
    # Equal unless delayed: one datetime serves both.
    run_at = created_at if run_us == created_us else _from_micros(run_us)
    values = _inserted_values(row, json.loads(row.data), created_at, run_at)
    return _job_model().from_new_row(values, using)


def _inserted_values(
    row: JobRow, data: Any, created_at: datetime, run_at: datetime
) -> dict[str, Any]:
    """What a plain insert of ``row`` stored besides the database defaults."""
    return {
        "id": row.id,
        "job_type": row.job_type,
        "queue": row.queue,
        "priority": row.priority,
        "data": data,
        "max_attempts": row.max_attempts,
        "concurrency_key": row.concurrency_key,
        "held": row.held,
        "timeout": row.timeout,
        "trace_context": None if row.trace_context is None else json.loads(row.trace_context),
        "created_at": created_at,
        "run_at": run_at,
    }


def _from_micros(micros: int) -> datetime:
    return _EPOCH + timedelta(0, 0, micros)  # positional: a third cheaper than microseconds=


#: Rows validated, formatted and sent per write to the COPY stream: the server inserts


#: one part while the next is prepared. A batch of at most this many is validated whole
#: before anything is sent.
COPY_PART_ROWS = 1000


class KeyedRowFound(Exception):
    """A spec with a unique key or dependencies came up while a batch was streamed as
    plain jobs: the stream is abandoned (rolled back) and the batch takes the unique
    insert, or the insert of a workflow, instead."""

    def __init__(self, rows: list[JobRow]) -> None:
        super().__init__("a spec with a unique_key needs the unique insert")
        self.rows = rows


def insert_plain_many(rows: list[JobRow], more: Iterator[JobRow], using: str) -> list[Job]:
    """Insert ``rows`` (validated) and then ``more`` (validated as they are taken)."""
    following = next(more, None)
    if following is None:
        if not any(row.held for row in rows):
            return _copy_rows(rows, more, using)
        # Held rows are released in the same transaction as their insert.
        with transaction.atomic(using=using):
            return _copy_rows(rows, more, using)
    # Rows are on their way before every spec is validated: a bad one must take them back.
    with transaction.atomic(using=using), collector_paused():
        return _copy_rows(rows, itertools.chain([following], more), using)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a large batch is built.

    A streamed batch creates several tracked objects per job (its row, ``Job``, the
    ``Job``'s state and payload), none of them in a reference cycle; each collection they
    trigger walks every object of the process, and those collections took a fifth of a
    5,000-job call. Reference counting still frees everything at once. The collector is
    only resumed if it was running when the batch began.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _copy_rows(first: list[JobRow], more: Iterator[JobRow], using: str) -> list[Job]:
    connection = connections[using]
    rows = list(first)
    times: list[tuple[datetime, datetime]] = []
    with connection.cursor() as cursor:
        cursor.execute(_CLOCK)
        clock_us, now_us = cursor.fetchone()
        clock, now = _from_micros(clock_us), _from_micros(now_us)
        now_text = now.isoformat()
        one_us = timedelta(microseconds=1)
        began = time.monotonic()
        with connection.wrap_database_errors, cursor.cursor.copy(_COPY) as copy:
            part = first
            while part:
                part_times = [
                    (clock + (len(times) + index) * one_us, run_at_of(row, now))
                    for index, row in enumerate(part)
                ]
                times.extend(part_times)
                copy.write("".join(map(copy_line, part, part_times, itertools.repeat(now_text))))
                # An InvalidJobError raised here leaves the block: psycopg ends the COPY
                # with an error, and the caller's transaction rolls back what was sent.
                part = list(itertools.islice(more, COPY_PART_ROWS))
                rows.extend(part)
                if any(row.unique_key is not None or row.depends_on is not None for row in part):
                    raise KeyedRowFound(rows)
            # Built while the server inserts the last part; returned only if the COPY ends well.
            jobs = built(rows, times, using)
        settle_held(jobs, rows, using)
        if connection.queries_logged:
            # What Django's debug cursor records for execute(): COPY bypasses it.
            connection.queries_log.append(
                {"sql": f"{_COPY} -- {len(rows)} rows", "time": f"{time.monotonic() - began:.3f}"}
            )
        settings = conf.get_settings()
        if settings.NOTIFY:
            notify_copied(cursor, connection, rows, times, now, settings.NOTIFY_CHANNEL)
    return jobs


def settle_held(jobs: list[Job], rows: Iterable[JobRow], using: str) -> None:
    """Release the keys of the ``rows`` inserted held, then give each of their ``jobs``
    its ``held`` as the database has it now (see ``held``); call it in the insert's
    transaction."""
    keys = [
        (row.job_type, row.concurrency_key)
        for row in rows
        if row.held and row.concurrency_key is not None
    ]
    if not keys:
        return
    release_keys(using, keys)
    inserted_held = [job for job in jobs if job.held]
    still_held = held_among(using, [job.id for job in inserted_held])
    for job in inserted_held:
        job.held = job.id in still_held


def notify_copied(
    cursor: Any,
    connection: BaseDatabaseWrapper,
    rows: list[JobRow],
    times: list[tuple[datetime, datetime]],
    now: datetime,
    channel: str,
) -> None:
    """Send the NOTIFY of a COPY for the queues the server finds due.

    Each queue goes with its earliest ``run_at``: ``now`` (the transaction's ``now()``)
    for undelayed rows, the given time for rows with a ``run_at``. Rows with a ``delay``
    cannot be due yet and are left out; a batch of only those sends nothing.
    """
    undelayed: set[str] = set()
    scheduled: dict[str, datetime] = {}
    for row, (_, run_at) in zip(rows, times, strict=True):
        if row.undelayed:
            undelayed.add(row.queue)
        elif row.run_at is not None and (
            row.queue not in scheduled or run_at < scheduled[row.queue]
        ):
            scheduled[row.queue] = run_at
    if not (undelayed or scheduled):
        return
    if wants_notify(connection, undelayed, scheduled=bool(scheduled)):
        earliest = {**scheduled, **dict.fromkeys(undelayed, now)}
        queues = sorted(earliest)
        cursor.execute(_NOTIFY_QUEUES, [channel, queues, [earliest[q] for q in queues]])


def copy_line(row: JobRow, times: tuple[datetime, datetime], now_text: str) -> str:
    """``row`` as a line of COPY's text format, in ``_COPY``'s column order.

    Job types and queue names are validated (no tab, newline or backslash), and JSON text
    escapes every control character: only its backslashes need COPY's escaping. Ids go
    as 32 hex digits, which PostgreSQL's uuid input reads as well as the hyphenated form.
    ``now_text``: the text of the ``run_at`` of jobs due at once, formatted once.
    """
    created_at, run_at = times
    data = row.data.replace("\\", "\\\\")
    run_text = now_text if row.undelayed else run_at.isoformat()
    key = row.concurrency_key
    key_text = "\\N" if key is None else key.translate(COPY_ESCAPES)
    timeout_text = "\\N" if row.timeout is None else repr(row.timeout)
    trace = row.trace_context
    trace_text = "\\N" if trace is None else trace.replace("\\", "\\\\")
    return (
        f"{row.id.int:032x}\t{row.job_type}\t{row.queue}\t{row.priority}\t{data}\t"
        f"{run_text}\t{row.max_attempts}\t{key_text}\t{'t' if row.held else 'f'}\t"
        f"{timeout_text}\t{trace_text}\t{created_at.isoformat()}\n"
    )


# COPY's text format: a backslash, tab, newline or carriage return in a value is escaped.
COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def run_at_of(row: JobRow, now: datetime) -> datetime:
    if row.run_at is not None:
        return row.run_at
    if not row.delay:
        return now
    # Whole microseconds, as PostgreSQL stores them.
    return now + timedelta(microseconds=round(row.delay * 1_000_000))


def send_enqueued(jobs: list[Job]) -> None:
    """Log (at DEBUG) and send ``job_enqueued`` for each inserted job; a receiver's
    error propagates."""
    if logger.isEnabledFor(logging.DEBUG):
        for job in jobs:
            logger.debug(
                "job %s (%s) enqueued on queue %s",
                job.id,
                job.job_type,
                job.queue,
                extra=job_fields(job),
            )
    if not signals.job_enqueued.receivers:
        return  # one list check instead of a send() call per job
    for job in jobs:
        signals.job_enqueued.send(sender=type(job), job=job)
