"""Rate limits: declared in code or settings, written to ``pgqueue_rate_limits`` by
workers, overridden by staff, enforced by ``claim_job_batch``.

A rate limit caps how many jobs of a queue or of a job type are started in any window
of its period, across all workers. They are declared in ``PGQUEUE["QUEUE_RATE_LIMITS"]``,
``PGQUEUE["JOB_TYPE_RATE_LIMITS"]`` and ``@job(rate_limit=...)``; the setting wins over
the decorator for the same job type (``None`` in the setting lifts it). Every worker
writes the declared rates when it starts (``sync_declared_rate_limits()``): all workers
of a deployment must share the settings and job modules.

Staff override a rate at run time (``override_rate_limit()``, or the admin): the override
wins from the next claim on and is never changed by workers.

The claim logs what it starts under each limit in ``pgqueue_rate_starts``; workers'
recovery deletes the rows that left their window (``prune_rate_starts()``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import connections, transaction

from . import conf, limit_sync, registry, validation
from .exceptions import InvalidArgumentError
from .models import RateLimitScope
from .rates import Rate, parse_rate

logger = logging.getLogger("django_pgqueue.limits")

__all__ = [
    "RateLimitState",
    "declared_rate_limits",
    "override_rate_limit",
    "prune_rate_starts",
    "rate_limit_states",
    "sync_declared_rate_limits",
]

#: ``(scope, name)``: scope is ``"queue"``, ``"job_type"`` or ``"key"`` (name: the job type).
RateLimitKey = tuple[str, str]

# Serialises the writers of pgqueue_rate_limits (worker syncs, overrides).
_RATE_LIMITS_TABLE: limit_sync.DeclaredTable[Rate] = limit_sync.DeclaredTable(
    table="pgqueue_rate_limits",
    noun="rate limit",
    lock_key="pgqueue_rate_limits:sync",
    override_column="override_jobs",
    declared_columns=[("declared_jobs", "integer"), ("declared_seconds", "integer")],
    columns_of=lambda rate: [rate.jobs, rate.seconds],
)


def _window_sql(limits: str, name: str) -> str:
    """SQL: ``pgqueue_rate_window()`` (rate_window_v1.sql, the one definition of what a
    window holds, which the claim reads too) of the window named ``name`` of the rate
    limit row ``limits`` (a table or alias of ``pgqueue_rate_limits``), ending now.

    Now is the statement's time, a stable clock: a volatile one would keep the function
    from being inlined into the query.
    """
    return (
        f"pgqueue_rate_window({limits}.scope, {name}, {limits}.max_jobs, "
        f"{limits}.period_seconds, statement_timestamp())"
    )


def _names_of(limits: str) -> str:
    """SQL: the row ``s`` of ``pgqueue_rate_starts`` counts under the limit ``limits``
    (``pgqueue_rate_limit_name()``, rate_window_v1.sql)."""
    return f"pgqueue_rate_limit_name(s.scope, s.name) = {limits}.name"


def started_in_window_sql(limits: str) -> str:
    """SQL: how many jobs the rate limit row ``limits`` started in its window; for a
    per-key rate, in the windows of all its keys."""
    return (
        f"(SELECT COALESCE(sum(w.jobs), 0) FROM (SELECT DISTINCT s.name "
        f"FROM pgqueue_rate_starts AS s WHERE s.scope = {limits}.scope "
        f"AND {_names_of(limits)}) AS k "
        f"CROSS JOIN LATERAL {_window_sql(limits, 'k.name')} AS w)"
    )


def room_in_sql(limits: str) -> str:
    """SQL: seconds until the window of the rate limit row ``limits`` has room, or NULL
    when it has room now (or is a per-key rate): its oldest start leaves the window then."""
    return (
        f"(SELECT greatest(extract(epoch FROM w.room_at - statement_timestamp()), 0) "
        f"FROM {_window_sql(limits, f'{limits}.name')} AS w "
        f"WHERE {limits}.scope <> 'key' AND w.room_at IS NOT NULL)"
    )


# Each limit with what its window holds now, and when the window next has room.
_STATES = f"""
SELECT r.scope, r.name, r.declared_jobs, r.declared_seconds, r.override_jobs,
       r.override_seconds, r.max_jobs, r.period_seconds, {started_in_window_sql("r")},
       {room_in_sql("r")}
  FROM pgqueue_rate_limits AS r
 ORDER BY 1, 2
"""

# Rows that left their limit's window a minute ago, and those of limits that are gone.
# The minute: a claim counts the window that ends at the moment it took its locks, and
# may read the log a little later; a row must not vanish from under it in between, or
# the claim would see room that is not there (and a prune runs every RECOVER_INTERVAL).
_PRUNE = f"""
DELETE FROM pgqueue_rate_starts AS s
 WHERE NOT EXISTS (
    SELECT 1 FROM pgqueue_rate_limits AS r
     WHERE r.scope = s.scope AND {_names_of("r")}
       AND s.started_at > now() - r.period_seconds * interval '1 second' - interval '1 minute')
"""


@dataclass(frozen=True)
class RateLimitState:
    """One rate limit as stored, and how full its window is now."""

    scope: str
    """``"queue"``, ``"job_type"`` or ``"key"`` (the rate applies to each key)."""
    name: str
    """The queue or job type."""
    declared: Rate | None
    """What the code and settings declare (``None``: nothing does)."""
    override: Rate | None
    """What staff set (``None``: no override)."""
    rate: Rate
    """The rate enforced: the override if set, else the declared rate."""
    started_in_window: int
    """Jobs started in the window that ends now (of a per-key rate: of all its keys)."""
    room_in: float | None
    """Seconds until the window has room again when it is full; ``None`` when it has
    room now, and for a per-key rate."""


def declared_rate_limits() -> dict[RateLimitKey, Rate]:
    """The rate limits this process's settings and ``@job`` registrations declare.

    By ``(scope, name)``: ``PGQUEUE["QUEUE_RATE_LIMITS"]``, then
    ``@job(rate_limit=...)`` (scope ``"key"`` with a ``rate_key``), then
    ``PGQUEUE["JOB_TYPE_RATE_LIMITS"]`` (which wins over a job type's own rate; ``None``
    removes it; it never changes a per-key rate).
    """
    settings = conf.get_settings()
    declared: dict[RateLimitKey, Rate] = {
        (RateLimitScope.QUEUE.value, name): rate
        for name, rate in settings.QUEUE_RATE_LIMITS.items()
    }
    for job_type in registry.registered_job_types():
        definition = registry.get_definition(job_type)
        if definition.rate_limit is not None:
            scope = RateLimitScope.JOB_TYPE if definition.rate_key is None else RateLimitScope.KEY
            declared[(scope.value, job_type)] = definition.rate_limit
    for job_type, setting in settings.JOB_TYPE_RATE_LIMITS.items():
        key = (RateLimitScope.JOB_TYPE.value, job_type)
        if setting is None:
            declared.pop(key, None)
        else:
            declared[key] = setting
    return dict(sorted(declared.items()))


def rate_limit_states(using: str | None = None) -> list[RateLimitState]:
    """Every stored rate limit with its window now, sorted by scope and name."""
    alias = conf.jobs_database(using)
    with connections[alias].cursor() as cursor:
        cursor.execute(_STATES)
        rows = cursor.fetchall()
    return [
        RateLimitState(
            scope=scope,
            name=name,
            declared=Rate.from_columns(declared_jobs, declared_seconds),
            override=Rate.from_columns(override_jobs, override_seconds),
            rate=Rate(max_jobs, period_seconds),
            started_in_window=int(started),
            room_in=None if room_in is None else float(room_in),
        )
        for (
            scope,
            name,
            declared_jobs,
            declared_seconds,
            override_jobs,
            override_seconds,
            max_jobs,
            period_seconds,
            started,
            room_in,
        ) in rows
    ]


def sync_declared_rate_limits(using: str | None = None) -> None:
    """Make the declared rates of ``pgqueue_rate_limits`` equal to
    ``declared_rate_limits()``, in one transaction.

    Changed rates are updated, new ones inserted, undeclared ones removed (a row that has
    an override keeps it); nothing is written when the table already matches. Overrides
    are never changed. Workers call it when they start. Concurrent calls are serialised
    by an advisory lock; each change is logged (``django_pgqueue.limits``, ``INFO``).
    """
    alias = conf.jobs_database(using)
    declared = declared_rate_limits()
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        limit_sync.lock(_RATE_LIMITS_TABLE, cursor)
        stored = {
            (state.scope, state.name): state.declared
            for state in rate_limit_states(alias)
            if state.declared is not None
        }
        removed, changed = limit_sync.sync_declared(_RATE_LIMITS_TABLE, cursor, declared, stored)
    limit_sync.log_changes(_RATE_LIMITS_TABLE, stored, removed, changed)


def override_rate_limit(
    scope: str, name: str, rate: str | Rate | None, *, using: str | None = None
) -> RateLimitState | None:
    """Set, or with ``None`` clear, the override of a queue's or job type's rate limit.

    The override wins over the declared rate from the next claim on, across all workers,
    until it is cleared; workers starting never change it. A queue or job type that
    declares no rate can be given one this way. The change is logged
    (``django_pgqueue.limits``, ``INFO``).

    Args:
        scope: ``"queue"``, ``"job_type"`` or ``"key"`` (the rate of each key of a job
            type).
        name: The queue or job type.
        rate: A rate such as ``"100/m"`` (see [rates](#rates)), or ``None`` to clear the
            override.
        using: Database alias. Default: ``PGQUEUE["DATABASE"]``.

    Returns:
        The rate limit as stored now, or ``None`` when none is left (no override and
            nothing declared).

    Raises:
        InvalidArgumentError: For an unknown scope, an invalid name or a malformed rate;
            nothing is written.
    """
    if scope not in RateLimitScope.values:
        raise InvalidArgumentError(
            "scope",
            f"must be one of {', '.join(map(repr, RateLimitScope.values))}, got {scope!r}",
        )
    if scope == RateLimitScope.QUEUE:
        validation.queue(name, "name")
    else:
        validation.job_type(name, "name")
    parsed = None if rate is None else parse_rate(rate, "rate")
    alias = conf.jobs_database(using)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        limit_sync.lock(_RATE_LIMITS_TABLE, cursor)
        if parsed is None:
            cursor.execute(
                "DELETE FROM pgqueue_rate_limits "
                "WHERE scope = %s AND name = %s AND declared_jobs IS NULL",
                [scope, name],
            )
            cursor.execute(
                "UPDATE pgqueue_rate_limits "
                "SET override_jobs = NULL, override_seconds = NULL, updated_at = now() "
                "WHERE scope = %s AND name = %s",
                [scope, name],
            )
        else:
            cursor.execute(
                "INSERT INTO pgqueue_rate_limits "
                "(scope, name, override_jobs, override_seconds, updated_at) "
                "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (scope, name) DO UPDATE "
                "SET override_jobs = EXCLUDED.override_jobs, "
                "override_seconds = EXCLUDED.override_seconds, updated_at = now()",
                [scope, name, parsed.jobs, parsed.seconds],
            )
        state = next(
            (s for s in rate_limit_states(alias) if (s.scope, s.name) == (scope, name)), None
        )
    logger.info(
        "rate limit override %s: %s %s (enforced: %s)",
        "cleared" if parsed is None else f"set to {parsed}",
        scope,
        name,
        "none" if state is None else state.rate,
    )
    return state


def prune_rate_starts(using: str | None = None) -> int:
    """Delete the logged starts that left their rate limit's window more than a minute
    ago, and those of rate limits that are gone; return how many rows went. Workers'
    recovery calls it."""
    with connections[conf.jobs_database(using)].cursor() as cursor:
        cursor.execute(_PRUNE)
        return int(cursor.rowcount)
