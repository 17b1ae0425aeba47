"""Recovery of stale jobs: jobs held by a worker that stopped heartbeating."""

from __future__ import annotations

import logging
import math
import uuid
from typing import NamedTuple

from django.db import connections

from . import conf
from .schema import IN_FLIGHT, JobStatus, literal, status_in

logger = logging.getLogger("django_pgqueue.recovery")

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
    id: uuid.UUID
    job_type: str
    previous_worker_id: str | None
    new_status: str
    attempts: int


def recover_stale_jobs(
    stale_after: float | None = None, *, dry_run: bool = False, using: str | None = None
) -> list[RecoveredJob]:
    """Return claimed/running jobs whose heartbeat is older than ``stale_after`` seconds
    (default ``PGQUEUE['STALE_AFTER']``) to pending, or to failed when their attempts are
    spent; return what was recovered.

    Safe to run from many processes at once: each stale job is recovered exactly once.
    With ``dry_run`` nothing changes and the jobs that would be recovered are returned.
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
            )
    return recovered
