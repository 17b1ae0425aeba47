"""Concurrency limits: declared in code, written to ``pgqueue_limits`` by workers, and
overridden by staff.

A limit caps how many jobs of a queue, of a job type, or of each key of a job type are
claimed or running at once across all workers; ``claim_job_batch`` enforces the rows of
``pgqueue_limits``. Limits are declared in ``PGQUEUE["QUEUE_LIMITS"]``,
``PGQUEUE["JOB_TYPE_LIMITS"]`` and ``@job(concurrency=N)`` (per key with
``concurrency_key``); the setting wins over the decorator for the same job type
(``None`` in the setting lifts the decorator's limit), and never changes a per-key limit.
Every worker writes the declared limits when it starts (``sync_declared_limits()``), so
the last worker to start wins: all workers of a deployment must share the settings and
job modules.

Staff override a limit at run time (``override_limit()``, or the admin): the override
wins over the declared limit, takes effect at the next claim, and is never changed by
workers. The database computes the limit enforced, ``max_running``, from the two.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import connections, transaction

from . import conf, held, limit_sync, registry, validation
from .exceptions import InvalidArgumentError
from .models import LimitScope
from .schema import CONCURRENCY_LIMIT_MAX

logger = logging.getLogger("django_pgqueue.limits")

__all__ = [
    "LimitState",
    "declared_limits",
    "limit_states",
    "override_limit",
    "stored_limits",
    "sync_declared_limits",
]

#: ``(scope, name)``: scope is ``"queue"``, ``"job_type"`` or ``"key"`` (name: the job type).
LimitKey = tuple[str, str]

# Serialises the writers of pgqueue_limits (worker syncs, overrides), so that workers
# starting together cannot deadlock on each other's rows.
_LIMITS_TABLE: limit_sync.DeclaredTable[int] = limit_sync.DeclaredTable(
    table="pgqueue_limits",
    noun="concurrency limit",
    lock_key="pgqueue_limits:sync",
    override_column="override",
    declared_columns=[("declared", "integer")],
    columns_of=lambda limit: [limit],
)


@dataclass(frozen=True)
class LimitState:
    """One concurrency limit as stored: what is declared, overridden and enforced."""

    scope: str
    """``"queue"``, ``"job_type"`` or ``"key"`` (the limit applies to each key)."""
    name: str
    """The queue or job type."""
    declared: int | None
    """What the code and settings declare (``None``: nothing does)."""
    override: int | None
    """What staff set (``None``: no override)."""
    max_running: int
    """The limit enforced: the override if set, else the declared limit."""


def declared_limits() -> dict[LimitKey, int]:
    """The limits this process's settings and ``@job`` registrations declare.

    By ``(scope, name)``, with scope ``"queue"``, ``"job_type"`` or ``"key"``:
    ``PGQUEUE["QUEUE_LIMITS"]``, then ``@job(concurrency=...)`` (scope ``"key"`` with a
    ``concurrency_key``), then ``PGQUEUE["JOB_TYPE_LIMITS"]`` (which wins over a job type's
    own limit; ``None`` removes it).
    """
    settings = conf.get_settings()
    declared: dict[LimitKey, int] = {
        (LimitScope.QUEUE.value, name): limit for name, limit in settings.QUEUE_LIMITS.items()
    }
    for job_type in registry.registered_job_types():
        definition = registry.get_definition(job_type)
        if definition.concurrency is not None:
            scope = LimitScope.JOB_TYPE if definition.concurrency_key is None else LimitScope.KEY
            declared[(scope.value, job_type)] = definition.concurrency
    for job_type, limit in settings.JOB_TYPE_LIMITS.items():
        key = (LimitScope.JOB_TYPE.value, job_type)
        if limit is None:
            declared.pop(key, None)
        else:
            declared[key] = limit
    return dict(sorted(declared.items()))


def stored_limits(using: str | None = None) -> dict[LimitKey, int]:
    """The limits ``claim_job_batch`` enforces now (``max_running`` of each row of
    ``pgqueue_limits``: overrides included)."""
    return {(s.scope, s.name): s.max_running for s in limit_states(using)}


def limit_states(using: str | None = None) -> list[LimitState]:
    """Every stored limit, declared, overridden or both, sorted by scope and name."""
    alias = conf.jobs_database(using)
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT scope, name, declared, override, max_running FROM pgqueue_limits ORDER BY 1, 2"
        )
        return [LimitState(*row) for row in cursor.fetchall()]


def sync_declared_limits(using: str | None = None) -> None:
    """Make the declared limits of ``pgqueue_limits`` equal to ``declared_limits()``, in
    one transaction.

    Changed limits are updated, new ones inserted, undeclared ones removed (a row that
    has an override keeps it); nothing is written when the table already matches.
    Overrides are never changed. Workers call it when they start. Jobs already claimed
    or running are never stopped: a lowered limit takes effect as they finish.

    Concurrent calls are serialised by an advisory lock. Each change is logged
    (``django_pgqueue.limits``, ``INFO``).
    """
    alias = conf.jobs_database(using)
    declared = declared_limits()
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        limit_sync.lock(_LIMITS_TABLE, cursor)
        stored = {
            (state.scope, state.name): state.declared
            for state in limit_states(alias)
            if state.declared is not None
        }
        removed, changed = limit_sync.sync_declared(_LIMITS_TABLE, cursor, declared, stored)
        if any(scope == LimitScope.KEY for scope, _ in [*removed, *(k for k, _ in changed)]):
            held.sweep(alias)  # release what a raised or removed per-key limit makes room for
    limit_sync.log_changes(_LIMITS_TABLE, stored, removed, changed)


def override_limit(
    scope: str, name: str, max_running: int | None, *, using: str | None = None
) -> LimitState | None:
    """Set, or with ``None`` clear, the override of a queue's or job type's limit.

    The override wins over the declared limit from the next claim on, across all
    workers, until it is cleared; workers starting never change it. A queue or job type
    that declares no limit can be given one this way. Jobs already claimed or running
    are never stopped: a lowered limit takes effect as they finish. The change is logged
    (``django_pgqueue.limits``, ``INFO``).

    Args:
        scope: ``"queue"``, ``"job_type"`` or ``"key"`` (the limit of each key of a
            job type).
        name: The queue or job type.
        max_running: An integer from 1 to 1,000,000, or ``None`` to clear the override.
        using: Database alias. Default: ``PGQUEUE["DATABASE"]``.

    Returns:
        The limit as stored now, or ``None`` when none is left (no override and nothing
            declared).

    Raises:
        InvalidArgumentError: For an unknown scope, an invalid name or limit; nothing is
            written.
    """
    if scope not in LimitScope.values:
        raise InvalidArgumentError(
            "scope", f"must be one of {', '.join(map(repr, LimitScope.values))}, got {scope!r}"
        )
    if scope == LimitScope.QUEUE:
        validation.queue(name, "name")
    else:
        validation.job_type(name, "name")
    if max_running is not None and (
        not isinstance(max_running, int)
        or isinstance(max_running, bool)
        or not 1 <= max_running <= CONCURRENCY_LIMIT_MAX
    ):
        raise InvalidArgumentError(
            "max_running",
            f"must be an integer from 1 to {CONCURRENCY_LIMIT_MAX}, or None to clear the "
            f"override; got {max_running!r}",
        )
    alias = conf.jobs_database(using)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        limit_sync.lock(_LIMITS_TABLE, cursor)
        if max_running is None:
            # A row with nothing declared goes; the others keep their declared limit.
            cursor.execute(
                "DELETE FROM pgqueue_limits WHERE scope = %s AND name = %s AND declared IS NULL",
                [scope, name],
            )
            cursor.execute(
                "UPDATE pgqueue_limits SET override = NULL, updated_at = now() "
                "WHERE scope = %s AND name = %s",
                [scope, name],
            )
        else:
            cursor.execute(
                "INSERT INTO pgqueue_limits (scope, name, override, updated_at) "
                "VALUES (%s, %s, %s, now()) ON CONFLICT (scope, name) DO UPDATE "
                "SET override = EXCLUDED.override, updated_at = now()",
                [scope, name, max_running],
            )
        if scope == LimitScope.KEY:
            held.sweep(alias)
        state = next((s for s in limit_states(alias) if (s.scope, s.name) == (scope, name)), None)
    logger.info(
        "concurrency limit override %s: %s %s (enforced: %s)",
        "cleared" if max_running is None else f"set to {max_running}",
        scope,
        name,
        "none" if state is None else state.max_running,
    )
    return state
