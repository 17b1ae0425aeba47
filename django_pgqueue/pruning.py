"""Deleting finished jobs past their retention, in bounded batches, so the jobs table
and its indexes stay small under constant load."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from django.db import connections

from . import conf
from .schema import FINISHED, JobStatus, values

logger = logging.getLogger("django_pgqueue.pruning")

FINISHED_STATUSES = tuple(values(FINISHED))
#: What is pruned unless asked otherwise: failed jobs wait to be handled.
PRUNED_BY_DEFAULT = (JobStatus.COMPLETED.value, JobStatus.CANCELLED.value)

# One batch: the oldest finished rows first, through idx_jobs_finished; SKIP LOCKED so
# concurrent pruners (every worker) split the work instead of waiting on each other.
# Their progress events go with them (ON DELETE CASCADE). The batch is chosen once, in a
# locking CTE, which PostgreSQL evaluates once: the DELETE removes only the rows it
# locked. Written as "WHERE id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)" one
# statement once deleted 3 rows with a batch of 2 (the Django 6 test run); the IN form
# leaves the planner free to evaluate the subquery again.
_DELETE_BATCH = """
WITH batch AS (
    SELECT id
      FROM pgqueue_jobs
     WHERE status = ANY(%s::varchar[])
       AND completed_at < now() - %s * interval '1 second'
     ORDER BY completed_at, id
     LIMIT %s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM pgqueue_jobs AS jobs USING batch WHERE jobs.id = batch.id
"""

_COUNT = """
SELECT count(*)
  FROM pgqueue_jobs
 WHERE status = ANY(%s::varchar[])
   AND completed_at < now() - %s * interval '1 second'
"""


def prune_jobs(
    older_than: float,
    *,
    statuses: Sequence[str] = PRUNED_BY_DEFAULT,
    batch_size: int = 1000,
    max_batches: int | None = None,
    max_seconds: float | None = None,
    dry_run: bool = False,
    using: str | None = None,
) -> int:
    """Delete finished jobs whose ``completed_at`` is older than ``older_than`` seconds.

    Deletes ``batch_size`` rows per statement (each its own transaction, so locks and WAL
    stay small) until none is left, ``max_batches`` ran or ``max_seconds`` passed;
    returns how many were deleted.
    ``statuses`` may name ``completed``, ``cancelled`` and ``failed``. With ``dry_run``
    nothing is deleted and the number that would be is returned.
    """
    if not math.isfinite(older_than) or older_than <= 0:
        raise ValueError(f"older_than must be a positive number of seconds, got {older_than!r}")
    unknown = sorted(set(statuses) - set(FINISHED_STATUSES))
    if unknown or not statuses:
        raise ValueError(f"statuses must be among {list(FINISHED_STATUSES)}, got {statuses!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
    alias = conf.jobs_database(using)
    statuses = list(statuses)
    with connections[alias].cursor() as cursor:
        if dry_run:
            cursor.execute(_COUNT, [statuses, older_than])
            return int(cursor.fetchone()[0])
        deleted = batches = 0
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while max_batches is None or batches < max_batches:
            if deadline is not None and batches and time.monotonic() >= deadline:
                break
            cursor.execute(_DELETE_BATCH, [statuses, older_than, batch_size])
            batches += 1
            deleted += cursor.rowcount
            if cursor.rowcount < batch_size:
                break
    if deleted:
        logger.info("pruned %d finished job(s) older than %gs", deleted, older_than)
    return deleted


def prune_by_settings(*, max_seconds: float, using: str | None = None) -> int:
    """Apply ``PGQUEUE['RETENTION']`` and ``['FAILED_RETENTION']`` for at most about
    ``max_seconds`` (workers call this on every heartbeat)."""
    settings = conf.get_settings()
    deleted = 0
    if settings.RETENTION is not None:
        deleted += prune_jobs(
            settings.RETENTION,
            statuses=PRUNED_BY_DEFAULT,
            max_seconds=max_seconds,
            using=using,
        )
    if settings.FAILED_RETENTION is not None:
        deleted += prune_jobs(
            settings.FAILED_RETENTION,
            statuses=(JobStatus.FAILED.value,),
            max_seconds=max_seconds,
            using=using,
        )
    return deleted
