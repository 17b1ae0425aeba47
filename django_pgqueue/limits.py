"""Concurrency limits: declared in code, written to ``pgqueue_limits`` by workers.

A limit caps how many jobs of a queue, or of a job type, are claimed or running at once
across all workers; ``claim_job_batch`` enforces the rows of ``pgqueue_limits``. Limits
are declared in ``PGQUEUE["QUEUE_LIMITS"]``, ``PGQUEUE["JOB_TYPE_LIMITS"]`` and
``@job(concurrency=N)``; the setting wins over the decorator for the same job type
(``None`` in the setting lifts the decorator's limit). Every worker writes the declared
limits when it starts (``sync_declared_limits()``), so the last worker to start wins:
all workers of a deployment must share the settings and job modules.
"""

from __future__ import annotations

import logging

from django.db import connections, transaction

from . import conf, registry
from .models import LimitScope

logger = logging.getLogger("django_pgqueue.limits")

__all__ = ["declared_limits", "stored_limits", "sync_declared_limits"]

#: ``(scope, name)``: scope is ``"queue"`` or ``"job_type"``.
LimitKey = tuple[str, str]

# Serialises syncs, so workers starting together cannot deadlock on each other's rows.
_SYNC_LOCK_KEY = "pgqueue_limits:sync"


def declared_limits() -> dict[LimitKey, int]:
    """The limits this process's settings and ``@job`` registrations declare.

    By ``(scope, name)``, with scope ``"queue"`` or ``"job_type"``:
    ``PGQUEUE["QUEUE_LIMITS"]``, then ``@job(concurrency=...)``, then
    ``PGQUEUE["JOB_TYPE_LIMITS"]`` (which wins; ``None`` removes).
    """
    settings = conf.get_settings()
    declared: dict[LimitKey, int] = {
        (LimitScope.QUEUE.value, name): limit for name, limit in settings.QUEUE_LIMITS.items()
    }
    for job_type in registry.registered_job_types():
        concurrency = registry.get_definition(job_type).concurrency
        if concurrency is not None:
            declared[(LimitScope.JOB_TYPE.value, job_type)] = concurrency
    for job_type, limit in settings.JOB_TYPE_LIMITS.items():
        key = (LimitScope.JOB_TYPE.value, job_type)
        if limit is None:
            declared.pop(key, None)
        else:
            declared[key] = limit
    return dict(sorted(declared.items()))


def stored_limits(using: str | None = None) -> dict[LimitKey, int]:
    """The limits ``claim_job_batch`` enforces now (the rows of ``pgqueue_limits``)."""
    alias = conf.jobs_database(using)
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT scope, name, max_running FROM pgqueue_limits ORDER BY 1, 2")
        return {(scope, name): limit for scope, name, limit in cursor.fetchall()}


def sync_declared_limits(using: str | None = None) -> None:
    """Make ``pgqueue_limits`` equal to ``declared_limits()``, in one transaction.

    Changed limits are updated, new ones inserted, undeclared ones deleted; nothing is
    written when the table already matches. Workers call it when they start. Jobs already
    claimed or running are never stopped: a lowered limit takes effect as they finish.

    Concurrent calls are serialised by an advisory lock. Each change is logged
    (``django_pgqueue.limits``, ``INFO``).
    """
    alias = conf.jobs_database(using)
    declared = declared_limits()
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [_SYNC_LOCK_KEY])
        stored = stored_limits(alias)
        removed = sorted(set(stored) - set(declared))
        changed = sorted(
            (key, limit) for key, limit in declared.items() if stored.get(key) != limit
        )
        if removed:
            cursor.execute(
                "DELETE FROM pgqueue_limits WHERE (scope, name) IN "
                "(SELECT * FROM unnest(%s::text[], %s::text[]))",
                [[scope for scope, _ in removed], [name for _, name in removed]],
            )
        if changed:
            cursor.execute(
                "INSERT INTO pgqueue_limits (scope, name, max_running, updated_at) "
                "SELECT *, now() FROM unnest(%s::text[], %s::text[], %s::integer[]) "
                "ON CONFLICT (scope, name) DO UPDATE "
                "SET max_running = EXCLUDED.max_running, updated_at = now()",
                [
                    [scope for (scope, _), _ in changed],
                    [name for (_, name), _ in changed],
                    [limit for _, limit in changed],
                ],
            )
    for scope, name in removed:
        logger.info("concurrency limit removed: %s %s (was %d)", scope, name, stored[scope, name])
    for (scope, name), limit in changed:
        previous = stored.get((scope, name))
        logger.info(
            "concurrency limit set: %s %s = %d (was %s)",
            scope,
            name,
            limit,
            "none" if previous is None else previous,
        )
