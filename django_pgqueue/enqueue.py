"""``enqueue`` and ``enqueue_many``: validate, serialise, insert on the caller's connection.

The insert runs on the caller's connection, so inside ``transaction.atomic`` the job
exists only if that transaction commits; the NOTIFY that wakes idle workers is sent in
the same statement and PostgreSQL delivers it only on commit.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from django.db import connections

from . import conf, registry, validation
from .exceptions import InvalidJobError

if TYPE_CHECKING:
    from .models import Job

_COLUMNS = "id, job_type, queue, priority, data, run_at, max_attempts"

_INSERT_MANY = f"""
WITH inserted AS (
    INSERT INTO pgqueue_jobs ({_COLUMNS}, created_at)
    SELECT t.id, t.job_type, t.queue, t.priority, t.data::jsonb,
           COALESCE(t.run_at, now() + t.delay * interval '1 second'), t.max_attempts,
           -- Rows get increasing times in input order: FIFO within one call too.
           clock_timestamp()
      FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::int[], %s::text[],
                  %s::timestamptz[], %s::float8[], %s::int[])
           AS t(id, job_type, queue, priority, data, run_at, delay, max_attempts)
    RETURNING *
){{notify}}
SELECT inserted.* FROM inserted{{notify_join}}
"""

_INSERT_ONE = f"""
WITH inserted AS (
    INSERT INTO pgqueue_jobs ({_COLUMNS})
    VALUES (%s, %s, %s, %s, %s::jsonb,
            COALESCE(%s::timestamptz, now() + %s * interval '1 second'), %s)
    RETURNING *
){{notify}}
SELECT inserted.* FROM inserted{{notify_join}}
"""

# pg_notify in a CTE joined to the result, so it runs in the same statement. PostgreSQL
# folds identical notifications of one transaction into one and delivers them on commit.
_NOTIFY = """, notified AS (
    SELECT count(pg_notify(%s, due.queue)) AS sent
      FROM (SELECT DISTINCT queue FROM inserted WHERE run_at <= now()) AS due
)"""
_NOTIFY_JOIN = " CROSS JOIN notified"


class JobSpec(TypedDict, total=False):
    """One job for :func:`enqueue_many`; keys mirror :func:`enqueue`'s arguments."""

    job_type: str
    data: dict[str, Any] | None
    queue: str | None
    priority: int | None
    run_at: datetime | None
    delay: float | timedelta | None
    max_attempts: int | None


class _Row(NamedTuple):
    id: uuid.UUID
    job_type: str
    queue: str
    priority: int
    data: str
    run_at: datetime | None
    delay: float
    max_attempts: int


_SPEC_KEYS = frozenset(JobSpec.__annotations__)


def _prepare(
    job_type: Any,
    data: Any,
    *,
    queue: Any,
    priority: Any,
    run_at: Any,
    delay: Any,
    max_attempts: Any,
    prefix: str = "",
) -> _Row:
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
    if run_at is not None and delay is not None:
        raise InvalidJobError(f"{prefix}run_at", "give run_at or delay, not both")
    return _Row(
        id=uuid.uuid4(),
        job_type=name,
        queue=validation.queue(queue, f"{prefix}queue"),
        priority=validation.priority(priority, f"{prefix}priority"),
        data=validation.payload(data, f"{prefix}data"),
        run_at=None if run_at is None else validation.aware_datetime(run_at, f"{prefix}run_at"),
        delay=0.0 if delay is None else validation.seconds(delay, f"{prefix}delay"),
        max_attempts=validation.max_attempts(max_attempts, f"{prefix}max_attempts"),
    )


#: An autocommit enqueue skips its NOTIFY when this process already sent one for each of
#: its queues this recently; workers claim again this long after every notification, so
#: no job waits for a poll. Each NOTIFY serialises commits on a database-wide lock: a loop
#: of single enqueues ran at half speed with one per job.
NOTIFY_COALESCE_SECONDS = 0.005

_last_notified: dict[tuple[str, str], float] = {}


def _wants_notify(using: str, rows: list[_Row]) -> bool:
    """Whether this insert should notify; records the notification when it will."""
    if connections[using].in_atomic_block:
        # The commit time is unknown inside a transaction: always notify on commit.
        return True
    due = {row.queue for row in rows if row.run_at is None and row.delay == 0}
    if not due:
        return True  # the statement notifies only for due jobs: nothing to coalesce
    now = time.monotonic()
    keys = [(using, queue) for queue in due]
    if all(now - _last_notified.get(key, -math.inf) < NOTIFY_COALESCE_SECONDS for key in keys):
        return False
    for key in keys:
        _last_notified[key] = now
    return True


def _sql(template: str, channel_params: list[Any], notify: bool) -> str:
    settings = conf.get_settings()
    if settings.NOTIFY and notify:
        channel_params.append(settings.NOTIFY_CHANNEL)
        return template.format(notify=_NOTIFY, notify_join=_NOTIFY_JOIN)
    return template.format(notify="", notify_join="")


def _run(sql: str, params: list[Any], using: str) -> list[Job]:
    # Imported here so that ``import django_pgqueue`` works before the app registry is ready.
    from .models import Job

    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        columns = [column.name for column in cursor.description]
        return [Job.from_row(columns, row, using) for row in cursor.fetchall()]


def enqueue(
    job_type: str,
    data: dict[str, Any] | None = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int | None = None,
    using: str | None = None,
) -> Job:
    """Insert one job and return it.

    Runs on the caller's connection: inside ``transaction.atomic`` the job exists only if
    the transaction commits. Unset options come from the job type's ``@job`` registration,
    then from ``PGQUEUE`` (queue ``"default"``, priority 100, 3 attempts). Priorities run
    from 0 to 1000, higher first. ``run_at`` (aware datetime) or ``delay`` (seconds or
    ``timedelta``) postpone the job. Raises :class:`InvalidJobError` before writing
    anything when an argument is invalid.
    """
    row = _prepare(
        job_type,
        data,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
    )
    alias = using or conf.get_settings().DATABASE
    params: list[Any] = list(row)
    sql = _sql(_INSERT_ONE, params, _wants_notify(alias, [row]))
    return _run(sql, params, alias)[0]


def enqueue_many(
    specs: Iterable[JobSpec | Mapping[str, Any]], *, using: str | None = None
) -> list[Job]:
    """Insert many jobs in one statement and return them in the order given.

    Each spec is a mapping with :func:`enqueue`'s arguments as keys (``job_type`` is
    required). Every spec is validated first: one bad spec rejects the whole call, and
    the error names it (``specs[3].priority: ...``).
    """
    rows: list[_Row] = []
    for index, spec in enumerate(specs):
        prefix = f"specs[{index}]."
        if not isinstance(spec, Mapping):
            raise InvalidJobError(f"specs[{index}]", f"must be a mapping, got {spec!r}")
        unknown = sorted(set(spec) - _SPEC_KEYS)
        if unknown:
            raise InvalidJobError(
                f"specs[{index}]", f"unknown keys {unknown}; allowed: {sorted(_SPEC_KEYS)}"
            )
        if "job_type" not in spec:
            raise InvalidJobError(f"{prefix}job_type", "is required")
        rows.append(
            _prepare(
                spec["job_type"],
                spec.get("data"),
                queue=spec.get("queue"),
                priority=spec.get("priority"),
                run_at=spec.get("run_at"),
                delay=spec.get("delay"),
                max_attempts=spec.get("max_attempts"),
                prefix=prefix,
            )
        )
    if not rows:
        return []
    alias = using or conf.get_settings().DATABASE
    params: list[Any] = [list(column) for column in zip(*rows, strict=True)]
    sql = _sql(_INSERT_MANY, params, _wants_notify(alias, rows))
    jobs = _run(sql, params, alias)
    position = {row.id: index for index, row in enumerate(rows)}
    jobs.sort(key=lambda job: position[job.id])
    return jobs
