"""The one place that reads the ``PGQUEUE`` setting: defaults, validation, caching."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field, fields, replace
from functools import cache
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from . import validation
from .cron import parse_schedule_setting
from .exceptions import InvalidArgumentError, SettingsError
from .rates import Rate, parse_rate
from .schema import (
    CONCURRENCY_LIMIT_MAX,
    MAX_ATTEMPTS_LIMIT,
    MAX_SNOOZES_LIMIT,
    PRIORITY_MAX,
    PRIORITY_MIN,
)

_CHANNEL_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class PgQueueSettings:
    """Validated settings; durations are in seconds."""

    DATABASE: str = "default"
    DEFAULT_QUEUE: str = "default"
    DEFAULT_PRIORITY: int = 100
    DEFAULT_MAX_ATTEMPTS: int = 3
    MAX_PAYLOAD_BYTES: int = 65536
    VALIDATE_JOB_TYPES: bool = True
    NOTIFY: bool = True
    NOTIFY_CHANNEL: str = "pgqueue_jobs"
    #: Alias of the connection workers LISTEN on (``None``: the worker's own database).
    #: Point it at a direct connection when ``DATABASE`` goes through a transaction pooler.
    LISTEN_DATABASE: str | None = None
    POLL_INTERVAL: float = 1.0
    #: Seconds between claims of an idle worker while the leader's wake-up calls reach it
    #: (NOTIFY): only for jobs made due without a notification (a delayed job committed
    #: after its time, say). Workers that cannot hear them poll every ``POLL_INTERVAL``.
    IDLE_POLL_INTERVAL: float = 60.0
    HEARTBEAT_INTERVAL: float = 10.0
    STALE_AFTER: float = 60.0
    RECOVER_INTERVAL: float = 30.0
    SHUTDOWN_GRACE: float = 30.0
    #: Longest a worker waits for the database's answer to one of its own statements
    #: before it deems the connection half-open, closes it and reconnects (0: forever).
    RESPONSE_TIMEOUT: float = 30.0
    #: Most claimed jobs a worker holds beyond its running ones, for fast jobs (0: none).
    PREFETCH: int = 400
    #: Most async handlers a worker runs at once on its event loop (0: none).
    ASYNC_CONCURRENCY: int = 100
    #: Most process-isolated jobs a worker runs at once, each in a child process.
    PROCESS_CONCURRENCY: int = 2
    RETRY_BACKOFF_BASE: float = 5.0
    RETRY_BACKOFF_MAX: float = 3600.0
    #: Most times a job may snooze (``raise Snooze(...)``); once more fails it (0: never).
    MAX_SNOOZES: int = 100
    #: Completed and cancelled jobs older than this are deleted by workers (None: kept).
    RETENTION: float | None = None
    #: Failed jobs older than this are deleted by workers (None: kept until handled).
    FAILED_RETENTION: float | None = None
    #: Store the traceback of a failed attempt with the job and in its attempt history
    #: (False: only the error line is stored; logs still have the traceback).
    STORE_TRACEBACKS: bool = True
    #: A session holding the xmin horizon longer than this is named by a worker's
    #: warning, ``pgqueue_status`` and the metrics (None: never).
    HORIZON_WARNING_AFTER: float | None = 300.0
    #: Emitted events (``emit_event()``) older than this are deleted by workers (None:
    #: kept); a job that starts waiting for one within it still receives it.
    EVENT_RETENTION: float | None = 7 * 86400.0
    #: The per-minute rollups the admin's charts draw are deleted past this (None: kept).
    ROLLUP_RETENTION: float | None = 8 * 86400.0
    #: At most this many jobs of a queue claimed or running at once, across all workers.
    QUEUE_LIMITS: dict[str, int] = field(default_factory=dict)
    #: The same per job type; wins over ``@job(concurrency=...)`` (``None`` lifts it).
    JOB_TYPE_LIMITS: dict[str, int | None] = field(default_factory=dict)
    #: At most so many jobs of a queue started per period (``{"emails": "100/m"}``),
    #: across all workers; the values are parsed into ``Rate``.
    QUEUE_RATE_LIMITS: dict[str, Rate] = field(default_factory=dict)
    #: The same per job type; wins over ``@job(rate_limit=...)`` (``None`` lifts it).
    JOB_TYPE_RATE_LIMITS: dict[str, Rate | None] = field(default_factory=dict)
    #: Periodic jobs by name (``cron.Schedule``), enqueued by workers on each cron tick.
    SCHEDULE: dict[str, Any] = field(default_factory=dict)
    #: OpenTelemetry spans for enqueues and runs (needs ``django-pgqueue[otel]``).
    OPENTELEMETRY: bool = False


# Durations that may also be None, meaning "never".
_OPTIONAL_DURATIONS = {
    "RETENTION",
    "FAILED_RETENTION",
    "EVENT_RETENTION",
    "ROLLUP_RETENTION",
    "HORIZON_WARNING_AFTER",
}

_DURATIONS = {
    "POLL_INTERVAL",
    "IDLE_POLL_INTERVAL",
    "HEARTBEAT_INTERVAL",
    "STALE_AFTER",
    "RECOVER_INTERVAL",
    "SHUTDOWN_GRACE",
    "RESPONSE_TIMEOUT",
    "RETRY_BACKOFF_BASE",
    "RETRY_BACKOFF_MAX",
}
# Durations that pace a worker's loops: zero would make them spin without pausing.
_POSITIVE_DURATIONS = {
    "POLL_INTERVAL",
    "IDLE_POLL_INTERVAL",
    "HEARTBEAT_INTERVAL",
    "STALE_AFTER",
    "RECOVER_INTERVAL",
}


def to_seconds(name: str, value: Any, *, allow_zero: bool = True) -> float:
    """Return ``value`` (seconds as a number, or a ``timedelta``) as float seconds."""

    try:
        return validation.seconds(value, name, allow_zero=allow_zero)
    except InvalidArgumentError as exc:
        raise SettingsError(f"{name} {exc.message}") from None


def concurrency_limit(value: Any, what: str) -> int:
    """A concurrency limit: an integer from 1 to ``CONCURRENCY_LIMIT_MAX``."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not 1 <= value <= CONCURRENCY_LIMIT_MAX
    ):
        raise SettingsError(
            f"{what} must be an integer from 1 to {CONCURRENCY_LIMIT_MAX} (the most jobs "
            f"claimed or running at once, across all workers), got {value!r}"
        )
    return value


def _limits(key: str, value: Any, *, queues: bool) -> dict[str, Any]:
    if not isinstance(value, dict):
        example = '{"video": 2}' if queues else '{"media.transcode": 2}'
        raise SettingsError(
            f"{key} must be a dict of {'queue names' if queues else 'job types'} to "
            f"integers, e.g. {example}; got {type(value).__name__}"
        )
    for name, limit in value.items():
        try:
            (validation.queue if queues else validation.job_type)(name, f"{key} key")
        except InvalidArgumentError as exc:
            raise SettingsError(str(exc)) from None
        # None in JOB_TYPE_LIMITS lifts a limit that @job(concurrency=...) declares.
        if limit is not None or queues:
            concurrency_limit(limit, f"{key}[{name!r}]")
    return dict(value)


def _rate_limits(key: str, value: Any, *, queues: bool) -> dict[str, Any]:
    if not isinstance(value, dict):
        example = '{"emails": "100/m"}' if queues else '{"crm.sync_contact": "10/s"}'
        raise SettingsError(
            f"{key} must be a dict of {'queue names' if queues else 'job types'} to "
            f"rates, e.g. {example}; got {type(value).__name__}"
        )
    parsed: dict[str, Rate | None] = {}
    for name, rate in value.items():
        try:
            (validation.queue if queues else validation.job_type)(name, f"{key} key")
            # None in JOB_TYPE_RATE_LIMITS lifts a rate that @job(rate_limit=...) declares.
            lifted = rate is None and not queues
            parsed[name] = None if lifted else parse_rate(rate, f"{key}[{name!r}]")
        except InvalidArgumentError as exc:
            raise SettingsError(str(exc)) from None
    return parsed


def _validate(raw: dict[str, Any]) -> PgQueueSettings:
    known = {f.name: f for f in fields(PgQueueSettings)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise SettingsError(f"PGQUEUE has unknown keys {unknown}; valid keys are {sorted(known)}")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        key = f"PGQUEUE[{name!r}]"
        if name == "SCHEDULE":
            continue  # validated below, once MAX_PAYLOAD_BYTES is known
        if name in ("QUEUE_LIMITS", "JOB_TYPE_LIMITS"):
            values[name] = _limits(key, value, queues=name == "QUEUE_LIMITS")
        elif name in ("QUEUE_RATE_LIMITS", "JOB_TYPE_RATE_LIMITS"):
            values[name] = _rate_limits(key, value, queues=name == "QUEUE_RATE_LIMITS")
        elif name in _OPTIONAL_DURATIONS:
            values[name] = None if value is None else to_seconds(key, value, allow_zero=False)
        elif name in _DURATIONS:
            values[name] = to_seconds(key, value, allow_zero=name not in _POSITIVE_DURATIONS)
        elif known[name].type in ("bool",):
            if not isinstance(value, bool):
                raise SettingsError(f"{key} must be True or False, got {value!r}")
            values[name] = value
        elif known[name].type in ("int",):
            if not isinstance(value, int) or isinstance(value, bool):
                raise SettingsError(f"{key} must be an integer, got {value!r}")
            values[name] = value
        else:
            if not isinstance(value, str) or not value:
                raise SettingsError(f"{key} must be a non-empty string, got {value!r}")
            values[name] = value
    result = PgQueueSettings(**values)
    if not PRIORITY_MIN <= result.DEFAULT_PRIORITY <= PRIORITY_MAX:
        raise SettingsError(
            f"PGQUEUE['DEFAULT_PRIORITY'] must be between {PRIORITY_MIN} and {PRIORITY_MAX}"
        )
    if not 1 <= result.DEFAULT_MAX_ATTEMPTS <= MAX_ATTEMPTS_LIMIT:
        raise SettingsError(
            f"PGQUEUE['DEFAULT_MAX_ATTEMPTS'] must be between 1 and {MAX_ATTEMPTS_LIMIT}"
        )
    if not 0 <= result.MAX_SNOOZES <= MAX_SNOOZES_LIMIT:
        raise SettingsError(
            f"PGQUEUE['MAX_SNOOZES'] must be between 0 and {MAX_SNOOZES_LIMIT} (0: a job "
            f"may not snooze), got {result.MAX_SNOOZES}"
        )
    if result.MAX_PAYLOAD_BYTES < 2:
        raise SettingsError("PGQUEUE['MAX_PAYLOAD_BYTES'] must be at least 2 (the size of {})")
    if not 0 <= result.PREFETCH <= 10000:
        raise SettingsError("PGQUEUE['PREFETCH'] must be between 0 and 10000 (0: no prefetch)")
    if not 0 <= result.ASYNC_CONCURRENCY <= 10000:
        raise SettingsError(
            "PGQUEUE['ASYNC_CONCURRENCY'] must be between 0 and 10000 (0: no async handlers), "
            f"got {result.ASYNC_CONCURRENCY}"
        )
    if not 0 <= result.PROCESS_CONCURRENCY <= 1000:
        raise SettingsError(
            "PGQUEUE['PROCESS_CONCURRENCY'] must be between 0 and 1000 (0: no process "
            f"isolation), got {result.PROCESS_CONCURRENCY}"
        )

    try:
        validation.queue(result.DEFAULT_QUEUE, "PGQUEUE['DEFAULT_QUEUE']")
    except InvalidArgumentError as exc:
        raise SettingsError(str(exc)) from None
    if result.LISTEN_DATABASE is not None and result.LISTEN_DATABASE not in getattr(
        django_settings, "DATABASES", {}
    ):
        raise SettingsError(
            f"PGQUEUE['LISTEN_DATABASE'] is {result.LISTEN_DATABASE!r}, which is not a key "
            "of DATABASES: name the alias of a direct (or session-pooled) connection"
        )
    if not _CHANNEL_RE.fullmatch(result.NOTIFY_CHANNEL):
        raise SettingsError(
            "PGQUEUE['NOTIFY_CHANNEL'] must be a lower-case SQL identifier "
            f"(letters, digits, underscores), got {result.NOTIFY_CHANNEL!r}"
        )
    if result.HEARTBEAT_INTERVAL >= result.STALE_AFTER:
        raise SettingsError(
            "PGQUEUE['HEARTBEAT_INTERVAL'] must be shorter than PGQUEUE['STALE_AFTER'] "
            f"({result.HEARTBEAT_INTERVAL:g}s >= {result.STALE_AFTER:g}s): otherwise healthy "
            "jobs would be recovered as stale"
        )
    if result.OPENTELEMETRY and importlib.util.find_spec("opentelemetry") is None:
        raise SettingsError(
            "PGQUEUE['OPENTELEMETRY'] is True, but opentelemetry-api is not installed: "
            "pip install 'django-pgqueue[otel]', and configure a tracer provider (the "
            "OpenTelemetry SDK) as for the rest of the project"
        )
    if "SCHEDULE" in raw:
        schedule = parse_schedule_setting(
            raw["SCHEDULE"], max_payload_bytes=result.MAX_PAYLOAD_BYTES
        )
        result = replace(result, SCHEDULE=schedule)
    return result


@cache
def get_settings() -> PgQueueSettings:
    """Return the validated ``PGQUEUE`` setting (cached until settings change)."""
    raw = getattr(django_settings, "PGQUEUE", None) or {}
    if not isinstance(raw, dict):
        raise SettingsError(f"PGQUEUE must be a dict, got {type(raw).__name__}")
    return _validate(raw)


def jobs_database(using: str | None = None) -> str:
    """The alias of the database that holds the jobs: ``using`` when the caller chose
    one, else ``PGQUEUE["DATABASE"]``.

    The one rule for it: the models' managers and instance methods, enqueue, the
    worker, stats, the admin, the commands and the Tasks backend all ask here, never
    the database router (``routers.JobsRouter`` makes the router agree). Cheap enough
    for ``enqueue``: the settings are cached.
    """
    return using or get_settings().DATABASE


@receiver(setting_changed)
def _reset_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "PGQUEUE":
        get_settings.cache_clear()
