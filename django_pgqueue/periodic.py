"""Periodic jobs: cron schedules declared in code, each tick enqueued exactly once.

Schedules come from ``@job(schedule="...")`` (named after the job type) and from
``PGQUEUE["SCHEDULE"]`` (named by their keys). Workers call :func:`enqueue_due_ticks`
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
not run it at noon.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter
from django.conf import settings as django_settings
from django.db import connections, transaction
from django.utils import timezone as django_timezone

from . import conf, registry, validation
from .enqueue import enqueue
from .exceptions import (
    DuplicateJobError,
    InvalidArgumentError,
    InvalidJobError,
    PgQueueError,
    SettingsError,
)

if TYPE_CHECKING:
    from .models import Job

logger = logging.getLogger("django_pgqueue.periodic")

#: Longest schedule name: the primary key of ``pgqueue_periodic``.
NAME_MAX_LENGTH = 255
#: Longest cron expression (the ``schedule`` column also holds the time zone).
CRON_MAX_LENGTH = 150
#: Keys of one ``PGQUEUE["SCHEDULE"]`` entry.
SETTING_KEYS = frozenset(
    {"job_type", "schedule", "data", "queue", "priority", "max_attempts", "unique_key", "timezone"}
)
_ALIASES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_CRON_HELP = (
    "use 5 fields (minute hour day-of-month month day-of-week, e.g. '*/15 * * * *'), "
    "6 with seconds last (e.g. '0 * * * * */10'), or one of " + ", ".join(sorted(_ALIASES))
)


def validate_cron(expression: Any, field: str = "schedule") -> str:
    """Return ``expression`` with its whitespace normalised, or raise
    :class:`InvalidJobError` (naming ``field``) saying what is wrong with it."""
    if not isinstance(expression, str):
        raise InvalidJobError(
            field, f"must be a cron expression string, got {type(expression).__name__}"
        )
    text = " ".join(expression.split())
    if not text:
        raise InvalidJobError(field, f"must not be empty; {_CRON_HELP}")
    if len(text) > CRON_MAX_LENGTH:
        raise InvalidJobError(
            field, f"must be at most {CRON_MAX_LENGTH} characters, got {len(text)}"
        )
    if text.startswith("@"):
        if text.lower() not in _ALIASES:
            raise InvalidJobError(field, f"{text!r} is not a supported alias; {_CRON_HELP}")
        text = text.lower()
    elif len(text.split()) not in (5, 6):
        raise InvalidJobError(field, f"{text!r} has {len(text.split())} fields; {_CRON_HELP}")
    try:
        croniter(text, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
    except CroniterBadDateError:
        raise InvalidJobError(
            field, f"{text!r} never matches a date (such as 30 February); check the day fields"
        ) from None
    except CroniterError as exc:
        raise InvalidJobError(
            field, f"{text!r} is not a valid cron expression ({exc}); {_CRON_HELP}"
        ) from None
    return text


def _zone(name: str | None) -> tzinfo:
    if name is None or name == "UTC":
        return UTC
    return ZoneInfo(name)


@dataclass(frozen=True)
class Schedule:
    """One periodic job: enqueue ``job_type`` on every tick of ``cron``.

    ``timezone`` is an IANA name; ``None`` means Django's ``TIME_ZONE``. ``data``,
    ``queue``, ``priority``, ``max_attempts`` and ``unique_key`` are passed to
    ``enqueue``; ``None`` takes the job type's defaults as usual. A tick whose unique key
    is held by an active job is skipped.
    """

    name: str
    job_type: str
    cron: str
    timezone: str | None = None
    data: dict[str, Any] | None = None
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    unique_key: str | None = None

    @property
    def zone_name(self) -> str:
        """The time zone the expression is evaluated in."""
        return self.timezone or getattr(django_settings, "TIME_ZONE", None) or "UTC"

    @property
    def signature(self) -> str:
        """What ``pgqueue_periodic.schedule`` records: a change resets the schedule."""
        return f"{self.cron} ({self.zone_name})"

    def latest_tick(self, now: datetime) -> datetime:
        """The last tick at or before ``now`` (aware, in UTC)."""
        # Ticks fall on whole seconds and get_prev() is strictly before its start, so
        # starting one second past ``now`` truncated includes a tick at exactly ``now``.
        start = now.replace(microsecond=0) + timedelta(seconds=1)
        tick = croniter(self.cron, start.astimezone(_zone(self.zone_name))).get_prev(datetime)
        return tick.astimezone(UTC)

    def next_tick(self, now: datetime) -> datetime:
        """The first tick after ``now`` (aware, in UTC)."""
        start = now.astimezone(_zone(self.zone_name))
        return croniter(self.cron, start).get_next(datetime).astimezone(UTC)


def parse_schedule_setting(value: Any, *, max_payload_bytes: int) -> dict[str, Schedule]:
    """Validate ``PGQUEUE["SCHEDULE"]`` into schedules; raise :class:`SettingsError`."""
    if not isinstance(value, dict):
        raise SettingsError(
            "PGQUEUE['SCHEDULE'] must be a dict of schedule names to dicts, e.g. "
            '{"nightly-report": {"job_type": "reports.nightly", "schedule": "0 3 * * *"}}; '
            f"got {type(value).__name__}"
        )
    return {
        name: _schedule_entry(name, entry, max_payload_bytes=max_payload_bytes)
        for name, entry in value.items()
    }


def _schedule_entry(name: Any, entry: Any, *, max_payload_bytes: int) -> Schedule:
    if not isinstance(name, str) or not name or len(name) > NAME_MAX_LENGTH:
        raise SettingsError(
            f"PGQUEUE['SCHEDULE'] keys are schedule names: strings of 1 to {NAME_MAX_LENGTH} "
            f"characters, got {name!r}"
        )
    key = f"PGQUEUE['SCHEDULE'][{name!r}]"
    if not isinstance(entry, dict):
        raise SettingsError(
            f"{key} must be a dict with at least 'job_type' and 'schedule', "
            f"got {type(entry).__name__}"
        )
    unknown = sorted(set(entry) - SETTING_KEYS)
    if unknown:
        raise SettingsError(
            f"{key} has unknown keys {unknown}; valid keys are {sorted(SETTING_KEYS)}"
        )
    missing = [k for k in ("job_type", "schedule") if k not in entry]
    if missing:
        raise SettingsError(f"{key} is missing {missing}: give the job type and a cron expression")
    try:
        job_type = validation.job_type(entry["job_type"], f"{key}['job_type']")
        cron = validate_cron(entry["schedule"], f"{key}['schedule']")
        queue = entry.get("queue")
        if queue is not None:
            validation.queue(queue, f"{key}['queue']")
        priority = entry.get("priority")
        if priority is not None:
            validation.priority(priority, f"{key}['priority']")
        max_attempts = entry.get("max_attempts")
        if max_attempts is not None:
            validation.max_attempts(max_attempts, f"{key}['max_attempts']")
        unique_key = entry.get("unique_key")
        if unique_key is not None:
            validation.unique_key(unique_key, f"{key}['unique_key']")
    except InvalidArgumentError as exc:
        raise SettingsError(str(exc)) from None
    data = entry.get("data")
    if data is not None:
        _check_data(data, f"{key}['data']", max_payload_bytes)
    zone = entry.get("timezone")
    if zone is not None:
        try:
            if not isinstance(zone, str):
                raise TypeError
            _zone(zone)
        except (TypeError, ValueError, ZoneInfoNotFoundError):
            raise SettingsError(
                f"{key}['timezone'] must be an IANA time zone name such as 'Europe/Paris' "
                f"or 'UTC', got {zone!r}"
            ) from None
    return Schedule(
        name=name,
        job_type=job_type,
        cron=cron,
        timezone=zone,
        data=data,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        unique_key=unique_key,
    )


def _check_data(data: Any, key: str, max_payload_bytes: int) -> None:
    try:
        validation.payload(data, key, max_bytes=max_payload_bytes)
    except InvalidJobError as exc:
        raise SettingsError(str(exc)) from None


def schedules() -> list[Schedule]:
    """Every declared schedule, by name: ``@job(schedule=...)`` then ``PGQUEUE["SCHEDULE"]``.

    Raises :class:`SettingsError` when a ``SCHEDULE`` key is also the job type of an
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


def next_tick(now: datetime | None = None) -> datetime | None:
    """The earliest tick after ``now`` over all schedules (``None``: no schedule)."""
    now = now or django_timezone.now()
    return min((schedule.next_tick(now) for schedule in schedules()), default=None)


_STORED = "SELECT name, schedule, last_tick FROM pgqueue_periodic WHERE name = ANY(%s)"

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
 WHERE name = %s AND schedule = %s AND last_tick < %s
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
    not stop the others. ``now`` (aware) defaults to this host's clock. Database errors
    propagate.
    """
    found = schedules()
    if not found:
        return []
    now = validation.aware_datetime(now, "now") if now is not None else django_timezone.now()
    alias = conf.jobs_database(using)
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(_STORED, [[schedule.name for schedule in found]])
        stored = {name: (signature, last_tick) for name, signature, last_tick in cursor.fetchall()}
    jobs: list[Job] = []
    for schedule in found:
        tick = schedule.latest_tick(now)
        row = stored.get(schedule.name)
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
    row: tuple[str, datetime] | None,
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
                job = enqueue(
                    schedule.job_type,
                    schedule.data,
                    queue=schedule.queue,
                    priority=schedule.priority,
                    max_attempts=schedule.max_attempts,
                    # The job's run_at tells its handler which tick it is for.
                    run_at=tick,
                    unique_key=schedule.unique_key,
                    on_duplicate="raise",
                    using=alias,
                )
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
    )
    return job


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
