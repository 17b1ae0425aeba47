"""``enqueue`` and ``enqueue_many``: validate, serialise, insert on the caller's connection.

The insert runs on the caller's connection, so inside ``transaction.atomic`` the job
exists only if that transaction commits; the NOTIFY that wakes idle workers is sent in
the same statement and PostgreSQL delivers it only on commit.

Unique jobs: a job with a ``unique_key`` is inserted with ``ON CONFLICT DO NOTHING`` on
the partial unique index ``pgqueue_jobs_unique_key_active``, so at most one pending,
claimed or running job holds a key, whatever the concurrency. The same statement reads
the active job that holds the key; when that job was committed by another session while
the insert waited for it, the statement's snapshot cannot see it, and the statement runs
again (a new snapshot) until it either inserts or finds the holder.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Unpack

from django.db import connections, transaction

from . import conf, registry, reused_cursor, signals, validation
from .due import DUE
from .exceptions import DuplicateJobError, InvalidJobError, PgQueueError
from .options import ENQUEUE_KEYS, SPEC_KEYS, EnqueueOptions, JobSpec, check_keys
from .schema import ACTIVE, MAX_DELAY_SECONDS, status_in

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .models import Job

logger = logging.getLogger("django_pgqueue.enqueue")

__all__ = ["enqueue", "enqueue_many"]

OnDuplicate = Literal["return", "raise"]
_ON_DUPLICATE = ("return", "raise")

_COLUMNS = "id, job_type, queue, priority, data, run_at, max_attempts"

# The plain inserts return only what the database decides (the times, as exact integer
# microseconds since the epoch); the rest of each Job is what was sent. Decoding whole
# rows cost more than the insert itself.
_MICROS = "(extract(epoch FROM inserted.{0}) * 1000000)::int8"

# Without a NOTIFY the insert needs no CTE: a bare INSERT, the cheapest statement.
_INSERT_ONE_QUIET = f"""
INSERT INTO pgqueue_jobs AS inserted ({_COLUMNS})
VALUES (%s, %s, %s, %s, %s::jsonb,
        COALESCE(%s::timestamptz, now() + %s * interval '1 second'), %s)
RETURNING {_MICROS.format("created_at")}, {_MICROS.format("run_at")}
"""

# The commonest case, an undelayed job (due at once) with no NOTIFY to send, in six
# parameters instead of eight (run_at is now(), as the general statement sets it): psycopg
# adapts every parameter of every call, and a loop of these is the W1 benchmark.
_INSERT_ONE_DUE_QUIET = f"""
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
_COPY = f"COPY pgqueue_jobs ({_COLUMNS}, created_at) FROM STDIN"
# Sent after the COPY, with each queue's earliest run_at: the server decides which are
# due, as it does in the other inserts' NOTIFY. In autocommit the jobs are committed by
# then, and inside a transaction PostgreSQL delivers the notification on commit.
_NOTIFY_QUEUES = f"""
SELECT count(pg_notify(%s, queue))
  FROM unnest(%s::text[], %s::timestamptz[]) AS earliest(queue, run_at)
 WHERE {DUE}
"""

_INSERT_ONE = f"""
WITH inserted AS (
    INSERT INTO pgqueue_jobs ({_COLUMNS})
    VALUES (%s, %s, %s, %s, %s::jsonb,
            COALESCE(%s::timestamptz, now() + %s * interval '1 second'), %s)
    RETURNING queue, created_at, run_at  -- queue and run_at: for the NOTIFY
){{notify}}
SELECT {_MICROS.format("created_at")}, {_MICROS.format("run_at")}
  FROM inserted{{notify_join}}
"""

# The predicate of the partial unique index pgqueue_jobs_unique_key_active (migration 0006).
_ACTIVE = status_in(ACTIVE)
_ON_CONFLICT = f"ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND {_ACTIVE} DO NOTHING"

# ``existing`` reads with the statement's snapshot: it sees an active job committed before
# the statement started or written earlier in this transaction, never the rows inserted
# here. The result is the inserted row, or else the holder of the key, or else nothing
# (the holder committed while the insert waited for it: the caller runs it again).
_INSERT_ONE_UNIQUE = f"""
WITH inserted AS (
    INSERT INTO pgqueue_jobs ({_COLUMNS}, unique_key)
    VALUES (%s, %s, %s, %s, %s::jsonb,
            COALESCE(%s::timestamptz, now() + %s * interval '1 second'), %s, %s)
    {_ON_CONFLICT}
    RETURNING *
), existing AS (
    SELECT * FROM pgqueue_jobs WHERE unique_key = %s AND {_ACTIVE}
){{notify}}
SELECT inserted.* FROM inserted{{notify_join}}
UNION ALL
SELECT existing.* FROM existing WHERE NOT EXISTS (SELECT FROM inserted)
"""

# Rows are inserted in key order, so that two batches sharing keys wait for each other
# in one order and cannot deadlock; created_at still follows the input order (one
# microsecond apart from a single clock reading): FIFO within one call.
_INSERT_MANY_UNIQUE = f"""
WITH inserted AS (
    INSERT INTO pgqueue_jobs ({_COLUMNS}, unique_key, created_at)
    SELECT t.id, t.job_type, t.queue, t.priority, t.data::jsonb,
           COALESCE(t.run_at, now() + t.delay * interval '1 second'), t.max_attempts,
           t.unique_key, (SELECT clock_timestamp()) + t.position * interval '1 microsecond'
      FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::int[], %s::text[],
                  %s::timestamptz[], %s::float8[], %s::int[], %s::text[])
           WITH ORDINALITY
           AS t(id, job_type, queue, priority, data, run_at, delay, max_attempts, unique_key,
                position)
     ORDER BY t.unique_key
    {_ON_CONFLICT}
    RETURNING *
), existing AS (
    SELECT * FROM pgqueue_jobs WHERE unique_key = ANY(%s::text[]) AND {_ACTIVE}
){{notify}}
SELECT inserted.* FROM inserted{{notify_join}}
UNION ALL
SELECT existing.* FROM existing
 WHERE existing.unique_key NOT IN (
       SELECT inserted.unique_key FROM inserted WHERE inserted.unique_key IS NOT NULL)
"""

#: A unique enqueue runs its statement again at most this many times when the holder of
#: a key keeps changing under it (each run follows a commit by another session).
UNIQUE_ROUNDS = 50

# pg_notify in a CTE joined to the result, so it runs in the same statement. PostgreSQL
# folds identical notifications of one transaction into one and delivers them on commit.
_NOTIFY = f""", notified AS (
    SELECT count(pg_notify(%s, due.queue)) AS sent
      FROM (SELECT DISTINCT queue FROM inserted WHERE {DUE}) AS due
)"""
_NOTIFY_JOIN = " CROSS JOIN notified"


def _new_job_id() -> uuid.UUID:
    """A UUID version 7 (RFC 9562): milliseconds since the epoch, then 74 random bits.

    Ids that grow with time land at the right-hand end of the primary key's B-tree
    instead of on a random page: bulk inserts measured 15-40 % faster on the server than
    with random (version 4) ids. The random part keeps them unguessable and unique.
    """
    millis = time.time_ns() // 1_000_000
    random_bits = int.from_bytes(os.urandom(10), "big")
    value = (
        (millis & 0xFFFF_FFFF_FFFF) << 80
        | 0x7 << 76  # version 7
        | (random_bits >> 62 & 0xFFF) << 64
        | 0b10 << 62  # RFC 9562 variant
        | random_bits & 0x3FFF_FFFF_FFFF_FFFF
    )
    return uuid.UUID(int=value)


class _Row(NamedTuple):
    id: uuid.UUID
    job_type: str
    queue: str
    priority: int
    data: str
    run_at: datetime | None
    delay: float
    max_attempts: int
    # Last, so that the plain inserts take the fields before it.
    unique_key: str | None

    @property
    def undelayed(self) -> bool:
        """Neither a ``run_at`` nor a ``delay``: stored with ``run_at = now()``.

        Such a job is due by construction; whether any other job is due the server
        decides (:data:`django_pgqueue.due.DUE`) in the statement that notifies.
        """
        return self.run_at is None and not self.delay


# The fields the plain inserts (_INSERT_ONE, _INSERT_MANY) take.
_PLAIN = len(_Row._fields) - 1


class _Resolved(NamedTuple):
    """A job type's handler and the validated queue, priority and attempts of a job."""

    name: str
    definition: registry.JobDefinition | None
    queue: str
    priority: int
    max_attempts: int


def _resolve(job_type: Any, queue: Any, priority: Any, max_attempts: Any, prefix: str) -> _Resolved:
    settings = conf.get_settings()
    name = validation.job_type(job_type, f"{prefix}job_type")
    definition = registry.find_definition(name)
    if definition is None and settings.VALIDATE_JOB_TYPES:
        known = ", ".join(registry.registered_job_types()) or "none"
        raise InvalidJobError(
            f"{prefix}job_type",
            f"no handler is registered for {name!r} (registered: {known}); define it with "
            "@django_pgqueue.job, or set PGQUEUE['VALIDATE_JOB_TYPES'] = False when "
            "another service runs the workers",
        )
    if queue is None:
        queue = (definition and definition.queue) or settings.DEFAULT_QUEUE
    if priority is None:
        priority = (
            definition.priority
            if definition and definition.priority is not None
            else (settings.DEFAULT_PRIORITY)
        )
    if max_attempts is None:
        max_attempts = (definition and definition.max_attempts) or settings.DEFAULT_MAX_ATTEMPTS
    return _Resolved(  # positional: a NamedTuple's keywords cost a call of their own
        name,
        definition,
        validation.queue(queue, f"{prefix}queue"),
        validation.priority(priority, f"{prefix}priority"),
        validation.max_attempts(max_attempts, f"{prefix}max_attempts"),
    )


def _resolve_memo(
    memo: dict[tuple[Any, ...], _Resolved],
    job_type: Any,
    queue: Any,
    priority: Any,
    max_attempts: Any,
    prefix: str,
) -> _Resolved:
    """``_resolve``, once per distinct combination of arguments in a batch.

    The key holds each argument's type too: ``True == 1`` and ``1.0 == 1``, but neither
    is a valid priority.
    """
    key = (
        type(job_type),
        type(queue),
        type(priority),
        type(max_attempts),
        job_type,
        queue,
        priority,
        max_attempts,
    )
    try:
        resolved = memo.get(key)
    except TypeError:  # an unhashable argument: _resolve rejects it
        return _resolve(job_type, queue, priority, max_attempts, prefix)
    if resolved is None:
        resolved = memo[key] = _resolve(job_type, queue, priority, max_attempts, prefix)
    return resolved


def _prepare(
    job_type: Any,
    data: Any,
    options: Mapping[str, Any],
    *,
    prefix: str = "",
    memo: dict[tuple[Any, ...], _Resolved] | None = None,
) -> _Row:
    """Validate one job: ``options`` are its :class:`EnqueueOptions` (an enqueue's
    keywords, or a spec of ``enqueue_many``, whose other keys are ignored here)."""
    get = options.get
    queue, priority, max_attempts = get("queue"), get("priority"), get("max_attempts")
    run_at, delay, unique_key = get("run_at"), get("delay"), get("unique_key")
    if memo is None:
        resolved = _resolve(job_type, queue, priority, max_attempts, prefix)
    else:
        resolved = _resolve_memo(memo, job_type, queue, priority, max_attempts, prefix)
    if run_at is not None and delay is not None:
        raise InvalidJobError(f"{prefix}run_at", "give run_at or delay, not both")
    row = _Row(  # in field order, positional: cheaper than keywords
        _new_job_id(),
        resolved.name,
        resolved.queue,
        resolved.priority,
        validation.payload(data, f"{prefix}data", max_bytes=conf.get_settings().MAX_PAYLOAD_BYTES),
        None if run_at is None else validation.aware_datetime(run_at, f"{prefix}run_at"),
        0.0 if delay is None else _delay(delay, f"{prefix}delay"),
        resolved.max_attempts,
        None,
    )
    definition = resolved.definition
    if unique_key is None and definition is not None and definition.unique_key is not None:
        unique_key = _default_key(definition, data, f"{prefix}unique_key")
    if unique_key is None:
        return row
    return row._replace(unique_key=validation.unique_key(unique_key, f"{prefix}unique_key"))


def _delay(value: Any, field: str) -> float:
    seconds = validation.seconds(value, field)
    if seconds > MAX_DELAY_SECONDS:
        raise InvalidJobError(
            field, f"must be at most 1,000 years ({MAX_DELAY_SECONDS:.0f} seconds), got {value!r}"
        )
    return seconds


def _default_key(definition: registry.JobDefinition, data: Any, field: str) -> Any:
    """The ``@job(unique_key=...)`` of the job type: the string, or what its callable says."""
    default = definition.unique_key
    if not callable(default):
        return default
    try:
        key = default(data if data is not None else {})
    except Exception as exc:
        raise InvalidJobError(
            field,
            f"the unique_key function of job type {definition.job_type!r} raised {exc!r}; "
            "make it return a string (or None for no key) for every payload",
        ) from exc
    if key is not None and not isinstance(key, str):
        raise InvalidJobError(
            field,
            f"the unique_key function of job type {definition.job_type!r} returned "
            f"{type(key).__name__}; it must return a string, or None for no key",
        )
    return key


def _check_on_duplicate(value: Any) -> None:
    if value not in _ON_DUPLICATE:
        raise InvalidJobError("on_duplicate", f"must be 'return' or 'raise', got {value!r}")


#: An autocommit enqueue skips its NOTIFY when this process already sent one for each of
#: its queues this recently; workers claim again this long after every notification, so
#: no job waits for a poll. Each NOTIFY serialises commits on a database-wide lock: a loop
#: of single enqueues ran at half speed with one per job.
NOTIFY_COALESCE_SECONDS = 0.005

_last_notified: dict[tuple[str, str], float] = {}


def _undelayed_queues(rows: Iterable[_Row]) -> set[str]:
    """The queues of the undelayed ``rows``: the notifications that may be coalesced."""
    return {row.queue for row in rows if row.undelayed}


def _has_run_at(rows: Iterable[_Row]) -> bool:
    """Whether a row has an explicit ``run_at``: only the server can tell if it is due."""
    return any(row.run_at is not None for row in rows)


def _wants_notify(
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
    insert nothing: they call ``_record_notified`` with what they did insert.
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


def _record_notified(db: BaseDatabaseWrapper, undelayed: set[str]) -> None:
    """Note the NOTIFY an autocommit unique insert on ``db`` sent for the ``undelayed``
    queues of the jobs it inserted."""
    if db.in_atomic_block:
        return
    now = time.monotonic()
    for queue in undelayed:
        _last_notified[(db.alias, queue)] = now


def _sql(template: str, channel_params: list[Any], notify: bool) -> str:
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


def _run(sql: str, params: list[Any], using: str) -> list[Job]:
    Job = _job_model()
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        columns = [column.name for column in cursor.description]
        return [Job.from_row(columns, row, using) for row in cursor.fetchall()]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _built(rows: list[_Row], times: list[tuple[datetime, datetime]], using: str) -> list[Job]:
    """The ``Job``s plain inserts of ``rows`` created, without reading the rows back.

    ``times``: each row's ``created_at`` and ``run_at``.
    """
    # One decode for the whole batch: each job gets its data as stored (JSON round trip).
    datas = json.loads("[" + ",".join(row.data for row in rows) + "]")
    return _job_model().from_new_rows(
        [
            _inserted_values(row, data, created_at, run_at)
            for row, data, (created_at, run_at) in zip(rows, datas, times, strict=True)
        ],
        using,
    )


def _built_one(row: _Row, created_us: int, run_us: int, using: str) -> Job:
    """``_built`` for one row, with its times as microseconds since the epoch."""
    created_at = _from_micros(created_us)
    # Equal unless delayed: one datetime serves both.
    run_at = created_at if run_us == created_us else _from_micros(run_us)
    values = _inserted_values(row, json.loads(row.data), created_at, run_at)
    return _job_model().from_new_row(values, using)


def _inserted_values(
    row: _Row, data: Any, created_at: datetime, run_at: datetime
) -> dict[str, Any]:
    """What a plain insert of ``row`` stored besides the database defaults."""
    return {
        "id": row.id,
        "job_type": row.job_type,
        "queue": row.queue,
        "priority": row.priority,
        "data": data,
        "max_attempts": row.max_attempts,
        "created_at": created_at,
        "run_at": run_at,
    }


def _from_micros(micros: int) -> datetime:
    return _EPOCH + timedelta(0, 0, micros)  # positional: a third cheaper than microseconds=


#: Rows validated, formatted and sent per write to the COPY stream: the server inserts
#: one part while the next is prepared. A batch of at most this many is validated whole
#: before anything is sent.
COPY_PART_ROWS = 1000


class _KeyedRowFound(Exception):
    """A spec with a unique key came up while a batch was streamed as plain jobs: the
    stream is abandoned (rolled back) and the batch takes the unique insert instead."""

    def __init__(self, rows: list[_Row]) -> None:
        super().__init__("a spec with a unique_key needs the unique insert")
        self.rows = rows


def _insert_plain_many(rows: list[_Row], more: Iterator[_Row], using: str) -> list[Job]:
    """Insert ``rows`` (validated) and then ``more`` (validated as they are taken)."""
    following = next(more, None)
    if following is None:
        return _copy_rows(rows, more, using)
    # Rows are on their way before every spec is validated: a bad one must take them back.
    with transaction.atomic(using=using), _collector_paused():
        return _copy_rows(rows, itertools.chain([following], more), using)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
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


def _copy_rows(first: list[_Row], more: Iterator[_Row], using: str) -> list[Job]:
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
                    (clock + (len(times) + index) * one_us, _run_at(row, now))
                    for index, row in enumerate(part)
                ]
                times.extend(part_times)
                copy.write("".join(map(_copy_line, part, part_times, itertools.repeat(now_text))))
                # An InvalidJobError raised here leaves the block: psycopg ends the COPY
                # with an error, and the caller's transaction rolls back what was sent.
                part = list(itertools.islice(more, COPY_PART_ROWS))
                rows.extend(part)
                if any(row.unique_key is not None for row in part):
                    raise _KeyedRowFound(rows)
            # Built while the server inserts the last part; returned only if the COPY ends well.
            jobs = _built(rows, times, using)
        if connection.queries_logged:
            # What Django's debug cursor records for execute(): COPY bypasses it.
            connection.queries_log.append(
                {"sql": f"{_COPY} -- {len(rows)} rows", "time": f"{time.monotonic() - began:.3f}"}
            )
        settings = conf.get_settings()
        if settings.NOTIFY:
            _notify_copied(cursor, connection, rows, times, now, settings.NOTIFY_CHANNEL)
    return jobs


def _notify_copied(
    cursor: Any,
    connection: BaseDatabaseWrapper,
    rows: list[_Row],
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
    if _wants_notify(connection, undelayed, scheduled=bool(scheduled)):
        earliest = {**scheduled, **dict.fromkeys(undelayed, now)}
        queues = sorted(earliest)
        cursor.execute(_NOTIFY_QUEUES, [channel, queues, [earliest[q] for q in queues]])


def _copy_line(row: _Row, times: tuple[datetime, datetime], now_text: str) -> str:
    """``row`` as a line of COPY's text format, in ``_COPY``'s column order.

    Job types and queue names are validated (no tab, newline or backslash), and JSON text
    escapes every control character: only its backslashes need COPY's escaping. Ids go
    as 32 hex digits, which PostgreSQL's uuid input reads as well as the hyphenated form.
    ``now_text``: the text of the ``run_at`` of jobs due at once, formatted once.
    """
    created_at, run_at = times
    data = row.data.replace("\\", "\\\\")
    run_text = now_text if row.undelayed else run_at.isoformat()
    return (
        f"{row.id.int:032x}\t{row.job_type}\t{row.queue}\t{row.priority}\t{data}\t"
        f"{run_text}\t{row.max_attempts}\t{created_at.isoformat()}\n"
    )


def _run_at(row: _Row, now: datetime) -> datetime:
    if row.run_at is not None:
        return row.run_at
    if not row.delay:
        return now
    # Whole microseconds, as PostgreSQL stores them.
    return now + timedelta(microseconds=round(row.delay * 1_000_000))


def _send_enqueued(jobs: list[Job]) -> None:
    """Send ``job_enqueued`` for each inserted job; a receiver's error propagates."""
    if not signals.job_enqueued.receivers:
        return  # one list check instead of a send() call per job
    for job in jobs:
        signals.job_enqueued.send(sender=type(job), job=job)


def _unresolved(key: str) -> PgQueueError:
    return PgQueueError(
        f"could not enqueue with unique_key {key!r}: the active job holding it changed "
        f"{UNIQUE_ROUNDS} times during the call; try again"
    )


def enqueue(
    job_type: str,
    data: dict[str, Any] | None = None,
    *,
    on_duplicate: OnDuplicate = "return",
    using: str | None = None,
    **options: Unpack[EnqueueOptions],
) -> Job:
    """Insert one job and return it.

    With a ``unique_key`` (or the job type's default key) held by an active job, nothing
    is inserted and that job is returned instead. Sends
    [`job_enqueued`](#signals) for the job it inserted (not for an existing
    unique job), before returning. Do not create jobs with ``Job.objects.create()``: it
    skips validation and does not wake workers.

    Args:
        job_type: Name of a registered job type: 1 to 200 characters, letters, digits and
            ``_ . : / -``, not starting with ``.``, ``:``, ``/`` or ``-``. Must be
            registered with [`@job`][django_pgqueue.job] in this process unless
            ``PGQUEUE["VALIDATE_JOB_TYPES"]`` is ``False``.
        data: The payload: a ``dict`` that can be serialised to JSON, or ``None`` for
            ``{}``. Its compact UTF-8 JSON must fit in ``PGQUEUE["MAX_PAYLOAD_BYTES"]``
            (64 KiB by default). What is accepted reaches the handler unchanged as
            ``job.data`` (tuples become lists); what PostgreSQL's ``jsonb`` or Python
            could not give back unchanged is rejected: NaN and infinities, floats of
            magnitude 1e16 or more (``jsonb`` returns them as integers: pass an ``int`` or
            a string), integers of more than 4,300 digits, keys that are not strings,
            nesting deeper than 100 levels (``django_pgqueue.validation.MAX_NESTING``),
            NUL characters and lone surrogates.
        on_duplicate: What to do when an active job holds ``unique_key``: ``"return"``
            (the default) returns it, ``"raise"`` raises
            [`DuplicateJobError`][django_pgqueue.DuplicateJobError]. Nothing is inserted
            either way.
        using: Database alias to write to. Default: ``PGQUEUE["DATABASE"]``.
        **options: The keys of
            [`EnqueueOptions`][django_pgqueue.options.EnqueueOptions]: ``queue``,
            ``priority``, ``max_attempts``, ``run_at``, ``delay``, ``unique_key``. Type
            checkers see each key's type; an undeclared keyword raises ``TypeError``.

    Returns:
        The new [`Job`][django_pgqueue.Job], as inserted (status ``pending``, defaults
            filled in), or the active job that holds ``unique_key``, as it is in the
            database.

    Raises:
        InvalidJobError: Before writing anything, when an argument is invalid; its
            ``field`` attribute names the argument.
        DuplicateJobError: With ``on_duplicate="raise"``, when an active job holds the
            key.
        PgQueueError: When the holder of the key kept changing during the call (see
            below).

    Database errors propagate as usual.

    The job is inserted with one statement on the connection of ``using``, so inside
    ``transaction.atomic`` on that database it exists only if the transaction commits.
    When ``PGQUEUE["NOTIFY"]`` is ``True`` and the job is due (its ``run_at``, given or
    not, is at or before the database's ``now()``: the same test the claim makes), the
    same statement sends a ``NOTIFY`` on ``PGQUEUE["NOTIFY_CHANNEL"]`` with the queue name
    as payload; PostgreSQL delivers it only on commit.

    The statement runs through a Django cursor of that connection, so
    [`connection.execute_wrapper()`](https://docs.djangoproject.com/en/stable/topics/db/instrumentation/)
    hooks, Django's database exceptions and tools that instrument Django's cursors see it
    as any other query. A job without a ``unique_key`` reuses one cursor per thread and
    connection instead of opening a new one per call (opening one costs the client about
    as much as the insert); a new cursor is opened whenever ``connection.cursor()`` would
    do more than hand one out: after a reconnect, while queries are logged (``DEBUG``,
    ``assertNumQueries``, ``CaptureQueriesContext``), before the health check of a
    request (``CONN_HEALTH_CHECKS``), inside a running event loop (Django then raises
    ``SynchronousOnlyOperation``, as for any query) and while the connection is shared
    between threads.

    With a ``unique_key`` the statement is ``INSERT ... ON CONFLICT (unique_key) WHERE
    status IN ('pending', 'claimed', 'running') DO NOTHING``, on the partial unique index
    ``pgqueue_jobs_unique_key_active``, and reads the job holding the key in the same
    statement: still one statement, and no ``NOTIFY`` when nothing was inserted. When the
    holder was committed by another session while the insert waited for it, the
    statement runs again (up to 50 times, then ``PgQueueError``). Concurrent enqueues of
    one key from any number of processes get one job.
    """
    _check_on_duplicate(on_duplicate)
    if options:
        check_keys(options, ENQUEUE_KEYS, "enqueue()")
    row = _prepare(job_type, data, options)
    settings = conf.get_settings()
    alias = conf.jobs_database(using)
    if row.unique_key is not None:
        return _enqueue_unique(row, on_duplicate, alias)
    db = connections[alias]
    undelayed = row.undelayed
    if _wants_notify(db, {row.queue} if undelayed else set()) and settings.NOTIFY:
        params: list[Any] = list(row[:_PLAIN])
        sql = _sql(_INSERT_ONE, params, True)
    elif undelayed:
        params = [row.id, row.job_type, row.queue, row.priority, row.data, row.max_attempts]
        sql = _INSERT_ONE_DUE_QUIET
    else:
        params = list(row[:_PLAIN])
        sql = _INSERT_ONE_QUIET
    created_us, run_us = reused_cursor.execute_fetchone(db, sql, params)
    job = _built_one(row, created_us, run_us, alias)
    _send_enqueued([job])
    return job


def _enqueue_unique(row: _Row, on_duplicate: OnDuplicate, alias: str) -> Job:
    assert row.unique_key is not None
    for _ in range(UNIQUE_ROUNDS):
        params: list[Any] = [*row, row.unique_key]
        notify = _wants_notify(connections[alias], _undelayed_queues([row]), record=False)
        jobs = _run(_sql(_INSERT_ONE_UNIQUE, params, notify), params, alias)
        if not jobs:
            continue  # the holder committed while the insert waited: look again
        job = jobs[0]
        if job.id == row.id:
            if notify:
                _record_notified(connections[alias], _undelayed_queues([row]))
            _send_enqueued([job])
            return job
        logger.debug("unique_key %r is held by job %s: not enqueued", row.unique_key, job.id)
        if on_duplicate == "raise":
            raise DuplicateJobError(row.unique_key, job)
        return job
    raise _unresolved(row.unique_key)


def enqueue_many(
    specs: Iterable[JobSpec | Mapping[str, Any]],
    *,
    on_duplicate: OnDuplicate = "return",
    using: str | None = None,
) -> list[Job]:
    """Insert many jobs and return them in the order given; all of them or none.

    An empty iterable returns ``[]`` without a query. One ``NOTIFY`` is sent per queue
    that received a due job, after the rows.
    [`job_enqueued`](#signals) is sent for each inserted job, in the order
    of ``specs``.

    Args:
        specs: Mappings with the keys of [`JobSpec`][django_pgqueue.JobSpec]:
            ``job_type`` is required, every other key is optional and defaults as in
            [`enqueue()`][django_pgqueue.enqueue.enqueue].
        on_duplicate: As in ``enqueue()``; see the unique keys below.
        using: Database alias to write to. Default: ``PGQUEUE["DATABASE"]``.

    Returns:
        The jobs, one per spec, in the order of ``specs``.

    Raises:
        InvalidJobError: For the whole call, with ``field`` naming the spec (for example
            ``specs[3].priority``), for an invalid spec, a spec that is not a mapping, a
            missing ``job_type`` or an unknown key; nothing of the batch is inserted.
        DuplicateJobError: With ``on_duplicate="raise"``, for the first spec whose key is
            held by an active job; nothing of the batch is inserted (the call uses a
            savepoint of its own).

    Plain jobs (no unique key) are sent with ``COPY``, after one query that reads the
    database's clock: ``created_at`` is that reading plus one microsecond per spec, so
    among equal priorities the jobs are claimed in the order of ``specs``, and ``run_at``
    is the transaction's ``now()`` plus any ``delay``, as ``enqueue()`` sets it. Up to
    ``COPY_PART_ROWS`` (1,000) specs are validated before anything is sent. A larger batch
    is streamed: each part goes to the server while the next is validated, inside a
    transaction of its own (a savepoint inside ``transaction.atomic``), so a bad spec late
    in the batch rolls back what was sent and leaves the caller's transaction usable.
    While a streamed batch is built, Python's cyclic garbage collector is paused
    (``gc.disable()``, resumed at the end if it was running): the call creates several
    objects per job and no cycles, and the collections they triggered took a fifth of its
    time. Django's query log (``connection.queries``, ``assertNumQueries``) shows the
    ``COPY`` as one query; execute wrappers (``connection.execute_wrapper``) do not see
    it.

    Unique keys: a spec whose ``unique_key`` is held by an active job gets that job; the
    first spec with a key inserts a job when the key is free, and every later spec with
    the same key gets that job (the same ``Job`` object). With ``on_duplicate="raise"``,
    two specs with one key raise ``InvalidJobError`` (``field`` ``specs[<i>].unique_key``)
    before anything is written. A batch with keys inserts its rows in key order, so
    concurrent batches sharing keys cannot deadlock on each other; ``created_at`` still
    follows the order of ``specs``.
    """
    _check_on_duplicate(on_duplicate)
    prepared = _prepared_rows(specs)
    rows = list(itertools.islice(prepared, COPY_PART_ROWS))
    if not rows:
        return []
    alias = conf.jobs_database(using)
    if not any(row.unique_key is not None for row in rows):
        try:
            jobs = _insert_plain_many(rows, prepared, alias)
        except _KeyedRowFound as found:
            rows = found.rows  # everything validated so far; the rest follows below
        else:
            _send_enqueued(jobs)
            return jobs
    rows.extend(prepared)
    return _enqueue_many_unique(rows, on_duplicate, alias)


def _prepared_rows(specs: Iterable[JobSpec | Mapping[str, Any]]) -> Iterator[_Row]:
    """Validate ``specs`` one by one, as they are consumed."""
    memo: dict[tuple[Any, ...], _Resolved] = {}
    for index, spec in enumerate(specs):
        prefix = f"specs[{index}]."
        if type(spec) is not dict and not isinstance(spec, Mapping):
            raise InvalidJobError(f"specs[{index}]", f"must be a mapping, got {spec!r}")
        if not SPEC_KEYS.issuperset(spec):
            unknown = sorted(set(spec) - SPEC_KEYS)
            raise InvalidJobError(
                f"specs[{index}]", f"unknown keys {unknown}; allowed: {sorted(SPEC_KEYS)}"
            )
        if "job_type" not in spec:
            raise InvalidJobError(f"{prefix}job_type", "is required")
        yield _prepare(spec["job_type"], spec.get("data"), spec, prefix=prefix, memo=memo)


def _enqueue_many_unique(rows: list[_Row], on_duplicate: OnDuplicate, alias: str) -> list[Job]:
    # Only the first spec of each key is sent; later ones get its job.
    first: dict[str, int] = {}
    candidates: list[_Row] = []
    for index, row in enumerate(rows):
        if row.unique_key is not None:
            if row.unique_key in first:
                if on_duplicate == "raise":
                    raise InvalidJobError(
                        f"specs[{index}].unique_key",
                        f"{row.unique_key!r} is also the key of specs[{first[row.unique_key]}]; "
                        "give each spec its own key, or pass on_duplicate='return' to "
                        "enqueue the first one only",
                    )
                continue
            first[row.unique_key] = index
        candidates.append(row)
    if on_duplicate == "raise":
        # A savepoint: raising rolls back the jobs this call inserted (and their NOTIFY).
        with transaction.atomic(using=alias):
            inserted, holders = _insert_unique(candidates, alias)
            duplicate = next((row for row in rows if row.unique_key in holders), None)
            if duplicate is not None:
                assert duplicate.unique_key is not None
                raise DuplicateJobError(duplicate.unique_key, holders[duplicate.unique_key])
    else:
        inserted, holders = _insert_unique(candidates, alias)
    by_key = {**holders, **{job.unique_key: job for job in inserted.values() if job.unique_key}}
    jobs = [inserted.get(row.id) or by_key[row.unique_key or ""] for row in rows]
    _send_enqueued([inserted[row.id] for row in candidates if row.id in inserted])
    return jobs


def _insert_unique(rows: list[_Row], alias: str) -> tuple[dict[uuid.UUID, Job], dict[str, Job]]:
    """Insert ``rows`` (one per key at most); return the inserted jobs by id, and the
    active jobs that hold the keys of the others, by key."""
    inserted: dict[uuid.UUID, Job] = {}
    holders: dict[str, Job] = {}
    todo = rows
    for _ in range(UNIQUE_ROUNDS):
        params: list[Any] = [list(column) for column in zip(*todo, strict=True)]
        params.append([row.unique_key for row in todo if row.unique_key is not None])
        notify = _wants_notify(
            connections[alias],
            _undelayed_queues(todo),
            scheduled=_has_run_at(todo),
            record=False,
        )
        sent = {row.id: row for row in todo}
        for job in _run(_sql(_INSERT_MANY_UNIQUE, params, notify), params, alias):
            if job.id in sent:
                inserted[job.id] = job
            else:
                assert job.unique_key is not None
                holders[job.unique_key] = job
        if notify:
            _record_notified(
                connections[alias], _undelayed_queues(row for row in todo if row.id in inserted)
            )
        # Left: keys whose holder committed while the insert waited for it.
        todo = [row for row in todo if row.id not in inserted and row.unique_key not in holders]
        if not todo:
            if holders:
                logger.debug("unique keys held by active jobs, not enqueued: %s", sorted(holders))
            return inserted, holders
    raise _unresolved(str(todo[0].unique_key))
