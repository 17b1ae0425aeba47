"""Periodic jobs: cron schedules, each tick enqueued exactly once, paused and resumed.

Schedules come from ``@job(schedule="...")`` (named after the job type), from
``PGQUEUE["SCHEDULE"]`` (named by their keys) and from the database
(``StoredSchedule``, which ``stored_schedules`` writes). Workers call ``enqueue_due_ticks()``
from their heartbeat thread; so may ``manage.py pgqueue_schedule --run-due``.

Exactly once: a tick is enqueued by the caller whose conditional ``UPDATE`` of the
schedule's ``pgqueue_periodic`` row moved ``last_tick`` forward, in the transaction that
inserts the job. Concurrent callers wait for that row lock and then see the new
``last_tick``, so however many workers run, one job per tick is inserted, and none if
the transaction rolls back (the next caller then tries again).

Missed ticks: only the latest tick at or before now is ever enqueued, so a schedule that
was not followed for a while (no worker running) runs once, late, not once per missed
tick. A schedule seen for the first time, or whose expression or time zone changed,
records its latest tick without enqueuing it: deploying a daily 03:00 job at noon does
not run it at noon. A paused schedule enqueues nothing; resumed, it starts from its
next tick.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from . import conf, logfields, registry, validation
from .cron import Schedule, build_schedule
from .enqueue import enqueue
from .exceptions import (
    DuplicateJobError,
    InvalidArgumentError,
    PgQueueError,
    SettingsError,
)
from .models import PeriodicTick, StoredSchedule

if TYPE_CHECKING:
    from .models import Job

logger = logging.getLogger("django_pgqueue.periodic")

# Stored schedules left out, by name: the problem last logged (once, not per heartbeat).
_reported_problems: dict[str, str] = {}

__all__ = [
    "declared_schedules",
    "enqueue_due_ticks",
    "pause_schedule",
    "paused_schedules",
    "resume_schedule",
    "run_now",
    "schedules",
    "stored_schedule_problems",
]


def declared_schedules() -> list[Schedule]:
    """The schedules of code and settings, by name: ``@job(schedule=...)`` then
    ``PGQUEUE["SCHEDULE"]``. No query.

    Raises ``SettingsError`` when a ``SCHEDULE`` key is also the job type of an
    ``@job(schedule=...)`` (both would share one ``pgqueue_periodic`` row).
    """
    found: dict[str, Schedule] = {}
    for job_type in registry.registered_job_types():
        definition = registry.find_definition(job_type)
        if definition is not None and definition.schedule is not None:
            found[job_type] = Schedule(name=job_type, job_type=job_type, cron=definition.schedule)
    for name, entry in conf.get_settings().SCHEDULE.items():
        if name in found:
            raise SettingsError(
                f"PGQUEUE['SCHEDULE'][{name!r}] has the name of the schedule that "
                f"@job({name!r}, schedule=...) declares; rename the SCHEDULE entry"
            )
        found[name] = entry
    return [found[name] for name in sorted(found)]


def schedules(using: str | None = None) -> list[Schedule]:
    """Every schedule, by name: those of ``@job(schedule=...)``, of
    ``PGQUEUE["SCHEDULE"]``, and those stored in the database
    ([`StoredSchedule`][django_pgqueue.models.StoredSchedule], added in the admin).

    A stored schedule that is invalid (a row written past the admin's checks) or whose
    name the code or settings also declare is left out, and logged once at ``WARNING``;
    [`stored_schedule_problems()`][django_pgqueue.periodic.stored_schedule_problems]
    says why.

    Raises ``SettingsError`` when a ``SCHEDULE`` key is also the job type of an
    ``@job(schedule=...)``.
    """
    found = {schedule.name: schedule for schedule in declared_schedules()}
    stored, problems = _stored_schedules(conf.jobs_database(using), set(found))
    for name in set(_reported_problems) - set(problems):
        del _reported_problems[name]  # fixed: said again if it comes back
    for name, problem in problems.items():
        if _reported_problems.get(name) != problem:
            _reported_problems[name] = problem
            logger.warning("stored schedule %s is ignored: %s", name, problem)
    found.update((schedule.name, schedule) for schedule in stored)
    return [found[name] for name in sorted(found)]


def stored_schedule_problems(using: str | None = None) -> dict[str, str]:
    """Why each stored schedule that ``schedules()`` leaves out is left out, by name."""
    declared = {schedule.name for schedule in declared_schedules()}
    return _stored_schedules(conf.jobs_database(using), declared)[1]


def _stored_schedules(alias: str, declared: set[str]) -> tuple[list[Schedule], dict[str, str]]:
    found: list[Schedule] = []
    problems: dict[str, str] = {}
    max_bytes = conf.get_settings().MAX_PAYLOAD_BYTES
    for row in StoredSchedule.objects.using(alias).order_by("name"):
        if row.name in declared:
            problems[row.name] = (
                "the code or settings declare a schedule of the same name; rename or "
                "delete the stored one"
            )
            continue
        try:
            found.append(
                build_schedule(
                    row.name, stored_fields(row), max_payload_bytes=max_bytes, stored=True
                )
            )
        except InvalidArgumentError as exc:
            problems[row.name] = str(exc)
    return found, problems


def stored_fields(row: StoredSchedule) -> dict[str, Any]:
    """The fields of a stored schedule, as ``cron.build_schedule()`` takes them."""
    return {
        "job_type": row.job_type,
        "schedule": row.schedule,
        "timezone": row.timezone or None,
        "data": row.data,
        "queue": row.queue or None,
        "priority": row.priority,
        "max_attempts": row.max_attempts,
        "unique_key": row.unique_key or None,
    }


def declared_in_code(schedule: Schedule) -> bool:
    """Whether ``schedules()`` took ``schedule`` from an ``@job(schedule=...)``, not from
    ``PGQUEUE["SCHEDULE"]`` (whose names may not be those of the former)."""
    definition = registry.find_definition(schedule.name)
    return definition is not None and definition.schedule is not None


def next_tick(now: datetime | None = None, using: str | None = None) -> datetime | None:
    """The earliest tick after ``now`` (default: the jobs database's clock) over all
    schedules (``None``: no schedule)."""
    found = schedules(using)
    if not found:
        return None
    now = now or database_now(conf.jobs_database(using))
    return min(schedule.next_tick(now) for schedule in found)


def database_now(alias: str) -> datetime:
    """The time on the clock of the database ``alias``: ticks are due by it, not by the
    clock of the host that asks, which may run fast or slow."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        now: datetime = cursor.fetchone()[0]
    return now


_STORED = """
SELECT name, schedule, last_tick, paused_at IS NOT NULL
  FROM pgqueue_periodic
 WHERE name = ANY(%s)
"""

_FIRST_SIGHT = """
INSERT INTO pgqueue_periodic (name, schedule, last_tick)
VALUES (%s, %s, %s)
ON CONFLICT (name) DO NOTHING
RETURNING name
"""

_CHANGED = """
UPDATE pgqueue_periodic
   SET schedule = %s, last_tick = %s, last_job_id = NULL, updated_at = now()
 WHERE name = %s AND schedule <> %s
RETURNING name
"""

# The row lock makes this the arbiter: a concurrent caller waits for our commit, then
# re-evaluates the WHERE clause against the new row and updates nothing.
_CLAIM_TICK = """
UPDATE pgqueue_periodic
   SET last_tick = %s, updated_at = now()
 WHERE name = %s AND schedule = %s AND last_tick < %s AND paused_at IS NULL
RETURNING name
"""

_RECORD_JOB = "UPDATE pgqueue_periodic SET last_job_id = %s WHERE name = %s"

# (schedule name, tick) of the last failure logged at ERROR: a failing schedule is
# retried on every call, and says so once per tick rather than on every heartbeat.
_reported_failures: dict[str, datetime] = {}


def enqueue_due_ticks(*, now: datetime | None = None, using: str | None = None) -> list[Job]:
    """Enqueue the latest due tick of every schedule not enqueued yet; return the jobs.

    Safe to call from any number of processes at once: each tick is enqueued once. Each
    schedule is handled in its own transaction; a schedule whose job cannot be enqueued
    (say, its job type has no handler) is logged and retried on the next call, and does
    not stop the others. ``now`` (aware) defaults to the jobs database's clock, so that
    a host whose clock runs fast or slow enqueues no tick early or late. Database errors
    propagate.

    The schedules are those of ``@job(schedule=...)`` and
    [`PGQUEUE["SCHEDULE"]`](settings.md#schedule). Workers call it from their heartbeat
    thread, and [`pgqueue_schedule --run-due`](commands.md#pgqueue_schedule) once.

    - Each tick is enqueued exactly once: the caller whose conditional ``UPDATE`` of the
      schedule's ``pgqueue_periodic`` row moves ``last_tick`` forward inserts the job, in
      the same transaction.
    - A new schedule (or one whose expression or time zone changed) records its latest
      tick without enqueuing; after missed ticks only the latest is enqueued (see
      [downtime](../how-to/periodic-jobs.md#what-happens-after-downtime-and-on-deploys)).
    - The job's ``run_at`` is the tick.
    - A schedule whose job cannot be enqueued is logged at ``ERROR``. A tick whose
      ``unique_key`` is held by an active job is skipped (logged at ``INFO``).

    Args:
        now: A timezone-aware ``datetime``. Default: the current time of this host.
        using: Database alias. Default: ``PGQUEUE["DATABASE"]``.

    Returns:
        The jobs it inserted.

    Raises:
        InvalidJobError: When ``now`` is naive.
    """
    alias = conf.jobs_database(using)
    found = schedules(alias)
    if not found:
        return []
    now = validation.aware_datetime(now, "now") if now is not None else database_now(alias)
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(_STORED, [[schedule.name for schedule in found]])
        stored = {name: row for name, *row in cursor.fetchall()}
    jobs: list[Job] = []
    for schedule in found:
        tick = schedule.latest_tick(now)
        row = stored.get(schedule.name)
        if row is not None and row[2]:
            continue  # paused: resuming skips the ticks it missed
        if row is not None and row[0] == schedule.signature and row[1] >= tick:
            continue  # the usual case: nothing due, no transaction
        try:
            job = _handle(schedule, tick, row, now, alias)
        except PgQueueError as exc:
            _report_failure(schedule, tick, exc)
            continue
        _reported_failures.pop(schedule.name, None)
        if job is not None:
            jobs.append(job)
    return jobs


def _handle(
    schedule: Schedule,
    tick: datetime,
    row: Sequence[Any] | None,
    now: datetime,
    alias: str,
) -> Job | None:
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        if row is None:
            cursor.execute(_FIRST_SIGHT, [schedule.name, schedule.signature, tick])
            if cursor.fetchone():
                logger.info(
                    "periodic job %s (%s) registered; its first tick is %s",
                    schedule.name,
                    schedule.signature,
                    schedule.next_tick(now).isoformat(),
                )
            return None
        if row[0] != schedule.signature:
            cursor.execute(_CHANGED, [schedule.signature, tick, schedule.name, schedule.signature])
            if cursor.fetchone():
                logger.info(
                    "periodic job %s changed from %s to %s; its next tick is %s",
                    schedule.name,
                    row[0],
                    schedule.signature,
                    schedule.next_tick(now).isoformat(),
                )
            return None
        cursor.execute(_CLAIM_TICK, [tick, schedule.name, schedule.signature, tick])
        if cursor.fetchone() is None:
            return None  # another caller enqueued this tick first
        try:
            with transaction.atomic(using=alias):
                # The job's run_at tells its handler which tick it is for.
                job = _enqueue_for(schedule, tick, alias)
        except DuplicateJobError as exc:
            # The tick stays consumed: runs do not pile up behind a slow one.
            logger.info(
                "periodic job %s skipped its tick %s: job %s with unique key %r is still %s",
                schedule.name,
                tick.isoformat(),
                exc.job_id,
                exc.unique_key,
                exc.job.status,
            )
            return None
        cursor.execute(_RECORD_JOB, [job.id, schedule.name])
    late = (now - tick).total_seconds()
    logger.info(
        "enqueued periodic job %s for tick %s%s: job %s",
        schedule.name,
        tick.isoformat(),
        f" ({late:.0f}s late)" if late >= 60 else "",
        job.id,
        extra=logfields.job_fields(job),
    )
    return job


def run_now(name: str, *, using: str | None = None) -> Job:
    """Enqueue the job of the schedule ``name`` now, as its ticks do, outside its ticks:
    the schedule's next tick comes as planned.

    Raises ``LookupError`` for a name no schedule has, and ``DuplicateJobError`` when the
    schedule's unique key is held by an active job (nothing is enqueued).
    """
    alias = conf.jobs_database(using)
    job = _enqueue_for(_find(name, alias), None, alias)
    logger.info(
        "enqueued periodic job %s now, outside its ticks: job %s",
        name,
        job.id,
        extra=logfields.job_fields(job),
    )
    return job


_PAUSE = """
INSERT INTO pgqueue_periodic (name, schedule, last_tick, paused_at)
VALUES (%s, %s, %s, now())
ON CONFLICT (name) DO UPDATE
   SET paused_at = now(), updated_at = now()
 WHERE pgqueue_periodic.paused_at IS NULL
RETURNING name
"""

# The tick at or before now counts as done: a resumed schedule runs from its next tick.
_RESUME = """
UPDATE pgqueue_periodic
   SET paused_at = NULL, last_tick = GREATEST(last_tick, %s), updated_at = now()
 WHERE name = %s AND paused_at IS NOT NULL
RETURNING name
"""


def pause_schedule(name: str, *, using: str | None = None) -> bool:
    """Pause the schedule ``name``: no worker enqueues its ticks until it is resumed.

    Works for every schedule, from code, settings or the database; jobs its earlier
    ticks made are not touched. [`run_now()`][django_pgqueue.periodic.run_now] still
    enqueues its job. Logged at ``INFO``.

    Returns:
        Whether it changed anything (``False``: already paused).

    Raises:
        LookupError: No schedule is named ``name``.
    """
    _, _, changed = _set_paused(name, True, using)
    if changed:
        logger.info("periodic job %s paused", name)
    return changed


def resume_schedule(name: str, *, using: str | None = None) -> bool:
    """Resume the paused schedule ``name`` from its next tick: the ticks that fell while
    it was paused are skipped, not caught up. Logged at ``INFO``.

    Returns:
        Whether it changed anything (``False``: it was not paused).

    Raises:
        LookupError: No schedule is named ``name``.
    """
    schedule, tick, changed = _set_paused(name, False, using)
    if changed:
        logger.info("periodic job %s resumed; its next tick is %s", name, schedule.next_tick(tick))
    return changed


def _set_paused(name: str, paused: bool, using: str | None) -> tuple[Schedule, datetime, bool]:
    """Pause or resume ``name``, its latest tick (by the database's clock) counting as
    recorded; return the schedule, that tick and whether its row changed."""
    alias = conf.jobs_database(using)
    schedule = _find(name, alias)
    tick = schedule.latest_tick(database_now(alias))
    with connections[alias].cursor() as cursor:
        if paused:
            cursor.execute(_PAUSE, [name, schedule.signature, tick])
        else:
            cursor.execute(_RESUME, [tick, name])
        return schedule, tick, cursor.fetchone() is not None


def paused_schedules(using: str | None = None) -> dict[str, datetime]:
    """When each paused schedule was paused, by name."""
    alias = conf.jobs_database(using)
    paused = PeriodicTick.objects.using(alias).filter(paused_at__isnull=False)
    return {name: at for name, at in paused.values_list("name", "paused_at") if at is not None}


def _find(name: str, alias: str) -> Schedule:
    for schedule in schedules(alias):
        if schedule.name == name:
            return schedule
    raise LookupError(f"no periodic job is named {name!r}")


def _enqueue_for(schedule: Schedule, run_at: datetime | None, alias: str) -> Job:
    """The enqueue of ``schedule``'s job, due at ``run_at`` (``None``: now)."""
    return enqueue(
        schedule.job_type,
        schedule.data,
        queue=schedule.queue,
        priority=schedule.priority,
        max_attempts=schedule.max_attempts,
        run_at=run_at,
        unique_key=schedule.unique_key,
        on_duplicate="raise",
        using=alias,
    )


def _report_failure(schedule: Schedule, tick: datetime, exc: PgQueueError) -> None:
    level = logging.DEBUG if _reported_failures.get(schedule.name) == tick else logging.ERROR
    _reported_failures[schedule.name] = tick
    logger.log(
        level,
        "periodic job %s could not enqueue its tick %s (%s); it is retried until this is fixed",
        schedule.name,
        tick.isoformat(),
        exc,
    )
