"""Cron expressions and the schedules of periodic jobs, parsed and validated.

A leaf below the settings (``conf`` parses ``PGQUEUE["SCHEDULE"]`` with it, ``@job``
checks its ``schedule=``): it knows croniter, time zones and the validation rules, and
nothing of the queue. ``periodic`` enqueues the ticks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter
from django.conf import settings as django_settings

from . import validation
from .exceptions import InvalidArgumentError, InvalidJobError, SettingsError

__all__ = ["Schedule", "validate_cron"]

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
    ``InvalidJobError`` (naming ``field``) saying what is wrong with it.

    Checks a cron expression the way ``@job(schedule=...)`` does.

    ```python
    from django_pgqueue.cron import validate_cron

    validate_cron("0  3 * * *")  # "0 3 * * *"
    ```

    Raises:
        InvalidJobError: Naming ``field`` and what is wrong: the field count, a value out
            of range, a date that never occurs, ``@reboot``.
    """
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

    What [`schedules()`][django_pgqueue.periodic.schedules] returns, one per schedule.
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
    #: Stored in the database (staff add, edit and delete it in the admin), not declared
    #: in code or settings.
    stored: bool = False

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
        return build_schedule(
            name,
            entry,
            max_payload_bytes=max_payload_bytes,
            label=lambda field: f"{key}[{field!r}]",
        )
    except InvalidArgumentError as exc:
        raise SettingsError(str(exc)) from None


def build_schedule(
    name: str,
    fields: Mapping[str, Any],
    *,
    max_payload_bytes: int,
    stored: bool = False,
    label: Callable[[str], str] = str,
) -> Schedule:
    """The ``Schedule`` named ``name`` from ``fields`` (the keys of a
    ``PGQUEUE["SCHEDULE"]`` entry: ``job_type`` and ``schedule`` required, the rest
    optional, ``None`` for a default), validated.

    The one check of a schedule's fields, for settings and for schedules stored in the
    database. Raises ``InvalidJobError`` whose ``field`` is ``label(key)``.
    """
    job_type = validation.job_type(fields.get("job_type"), label("job_type"))
    cron = validate_cron(fields.get("schedule"), label("schedule"))
    optional: tuple[tuple[str, Callable[[Any, str], Any]], ...] = (
        ("queue", validation.queue),
        ("priority", validation.priority),
        ("max_attempts", validation.max_attempts),
        ("unique_key", validation.unique_key),
    )
    for key, check in optional:
        if fields.get(key) is not None:
            check(fields[key], label(key))
    data = fields.get("data")
    if data is not None:
        validation.payload(data, label("data"), max_bytes=max_payload_bytes)
    zone = fields.get("timezone")
    if zone is not None:
        try:
            if not isinstance(zone, str):
                raise TypeError
            _zone(zone)
        except (TypeError, ValueError, ZoneInfoNotFoundError):
            raise InvalidJobError(
                label("timezone"),
                f"must be an IANA time zone name such as 'Europe/Paris' or 'UTC', got {zone!r}",
            ) from None
    return Schedule(
        name=name,
        job_type=job_type,
        cron=cron,
        timezone=zone,
        data=data,
        queue=fields.get("queue"),
        priority=fields.get("priority"),
        max_attempts=fields.get("max_attempts"),
        unique_key=fields.get("unique_key"),
        stored=stored,
    )
