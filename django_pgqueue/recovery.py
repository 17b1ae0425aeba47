"""Recovery: jobs held by a worker that stopped heartbeating, and pending jobs held back
by a per-key limit that nothing released."""

from __future__ import annotations

import logging
import math
import uuid
from typing import NamedTuple

from django.db import connections

from . import conf, held, logfields
from .schema import IN_FLIGHT, JobStatus, literal, status_in

logger = logging.getLogger("django_pgqueue.recovery")

__all__ = ["RecoveredJob", "recover_stale_jobs", "release_held_jobs"]

_RECOVER = "SELECT * FROM recover_stale_jobs(%s * interval '1 second')"

_PREVIEW_STALE = f"""
SELECT id, job_type, worker_id,
       CASE WHEN status = {literal(JobStatus.RUNNING)} AND attempts >= max_attempts
            THEN {literal(JobStatus.FAILED)} ELSE {literal(JobStatus.PENDING)} END,
       CASE WHEN status = {literal(JobStatus.CLAIMED)}
            THEN greatest(attempts - 1, 0) ELSE attempts END
  FROM pgqueue_jobs
 WHERE {status_in(IN_FLIGHT)}
   AND COALESCE(heartbeat_at, claimed_at, created_at) < now() - %s * interval '1 second'
 ORDER BY heartbeat_at
"""


class RecoveredJob(NamedTuple):
    """A job that ``recover_stale_jobs()`` released (or, with ``dry_run``, would)."""

    id: uuid.UUID
    """The job's id."""
    job_type: str
    """Its job type."""
    previous_worker_id: str | None
    """The worker that held it."""
    new_status: str
    """``"pending"``, or ``"failed"`` when its attempts are spent."""
    attempts: int
    """Its attempts, after recovery."""


def recover_stale_jobs(
    stale_after: float | None = None, *, dry_run: bool = False, using: str | None = None
) -> list[RecoveredJob]:
    """Return claimed/running jobs whose heartbeat is older than ``stale_after`` seconds
    (default ``PGQUEUE['STALE_AFTER']``) to pending, or to failed when their attempts are
    spent; return what was recovered.

    Safe to run from many processes at once: each stale job is recovered exactly once.
    With ``dry_run`` nothing changes and the jobs that would be recovered are returned.

    Calls the SQL function [`recover_stale_jobs`](sql.md#recover_stale_jobs). Each
    recovered job is logged at ``WARNING`` on the ``django_pgqueue.recovery`` logger.
    Workers call this every ``PGQUEUE["RECOVER_INTERVAL"]`` seconds; the
    [`pgqueue_recover`](commands.md#pgqueue_recover) command calls it once.

    Args:
        stale_after: Seconds without a heartbeat after which a job is stale. Default:
            ``PGQUEUE["STALE_AFTER"]``.
        dry_run: Change nothing; return the jobs that would be recovered now.
        using: Database alias. Default: ``PGQUEUE["DATABASE"]``.

    Raises:
        ValueError: If ``stale_after`` is not a positive number.
    """
    settings = conf.get_settings()
    seconds = settings.STALE_AFTER if stale_after is None else stale_after
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"stale_after must be a positive number of seconds, got {seconds!r}")
    with connections[conf.jobs_database(using)].cursor() as cursor:
        cursor.execute(_PREVIEW_STALE if dry_run else _RECOVER, [seconds])
        recovered = [RecoveredJob(*row) for row in cursor.fetchall()]
    if not dry_run:
        for job in recovered:
            logger.warning(
                "recovered stale job %s (%s) from worker %s: now %s after %s attempt(s)",
                job.id,
                job.job_type,
                job.previous_worker_id,
                job.new_status,
                job.attempts,
                # The worker the job leaves; its queue is not read back.
                extra=logfields.fields(
                    job.id, job.job_type, None, job.attempts, job.previous_worker_id
                ),
            )
    return recovered


def release_held_jobs(using: str | None = None) -> int:
    """Release the held jobs of every key that has room for them; return how many.

    A job of a key at its [per-key limit](../how-to/per-key-concurrency.md) waits
    ``held``, out of the claim's sight, and is released when a job of its key is claimed
    or cancelled. A job enqueued at the very moment its key's last visible job is claimed
    can miss that release, and a pending job deleted (or cancelled with SQL) releases
    nothing: this sweep catches both, and releases every held job of a job type whose
    per-key limit was removed. First it holds the excess of keys with more visible due
    jobs than their limit (delayed jobs that came due together). Workers call it with
    ``recover_stale_jobs()``, every
    ``PGQUEUE["RECOVER_INTERVAL"]`` seconds, and so does the
    [`pgqueue_recover`](commands.md#pgqueue_recover) command. Safe to run from many
    processes at once. Calls the SQL function ``pgqueue_release_held_jobs()``.
    """
    released = held.sweep(conf.jobs_database(using))
    if released:
        logger.info("released %d held job(s) whose key has room", released)
    return released
