"""Deleting finished jobs past their retention, in bounded batches, so the jobs table
and its indexes stay small under constant load.

A job of a workflow is deleted only with its whole workflow, once every job of it has
finished and is past the retention: never while a step still runs or waits. A workflow
with a failed job counts as failed (``FAILED_RETENTION``, ``statuses=["failed"]``); one
without as completed. Its edges and counters go with its jobs.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import connections

from . import conf
from .jobrows import version7_id
from .schema import FINISHED, JobStatus, status_in, values

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
     WHERE status = ANY(%(statuses)s::varchar[])
       AND completed_at < now() - %(age)s * interval '1 second'
       AND workflow_id IS NULL
     ORDER BY completed_at, id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM pgqueue_jobs AS jobs USING batch WHERE jobs.id = batch.id
"""

# Workflows past the retention, at most %(batch)s of them, oldest first after a given id:
# a loose index scan of idx_jobs_workflow (one probe per workflow). A workflow's id is a
# version 7 UUID of its creation time, so those created after the cutoff (%(before)s, an
# id of that time) cannot be past it and are not read. The pruner resumes after the last
# workflow it read, so workflows kept for long (still running, or failed while failed
# jobs are kept) never hide the ones behind them.
_OLD_WORKFLOWS = """
WITH RECURSIVE walk(workflow_id) AS (
    (SELECT workflow_id FROM pgqueue_jobs
      WHERE workflow_id > %(after)s AND workflow_id < %(before)s
      ORDER BY workflow_id LIMIT 1)
    UNION ALL
    SELECT (SELECT workflow_id FROM pgqueue_jobs
             WHERE workflow_id > walk.workflow_id AND workflow_id < %(before)s
             ORDER BY workflow_id LIMIT 1)
      FROM walk
     WHERE walk.workflow_id IS NOT NULL
)
SELECT workflow_id FROM walk WHERE workflow_id IS NOT NULL LIMIT %(batch)s
"""

# Of those workflows, the ones to delete: every job finished and past the retention,
# and either a failed job while failed jobs are pruned, or no failed job and every
# job's status among those pruned.
_WHOLE_WORKFLOWS = f"""
SELECT candidates.workflow_id
  FROM unnest(%(workflows)s::uuid[]) AS candidates(workflow_id)
 CROSS JOIN LATERAL (
    SELECT bool_and({status_in(FINISHED, "jobs.status")}
                    AND jobs.completed_at < now() - %(age)s * interval '1 second') AS old,
           bool_or({status_in(JobStatus.FAILED, "jobs.status")}) AS failed,
           bool_and(jobs.status = ANY(%(statuses)s::varchar[])) AS listed
      FROM pgqueue_jobs AS jobs
     WHERE jobs.workflow_id = candidates.workflow_id
 ) AS workflow
 WHERE workflow.old
   AND CASE WHEN workflow.failed THEN %(failed)s = ANY(%(statuses)s::varchar[])
            ELSE workflow.listed END
"""

_DELETE_WORKFLOWS = """
WITH jobs AS (
    DELETE FROM pgqueue_jobs WHERE workflow_id = ANY(%(workflows)s) RETURNING id
), edges AS (
    DELETE FROM pgqueue_job_dependencies AS edges USING jobs WHERE edges.job_id = jobs.id
), waits AS (
    DELETE FROM pgqueue_job_waits AS waits USING jobs WHERE waits.job_id = jobs.id
)
SELECT count(*) FROM jobs
"""

_COUNT = """
SELECT count(*)
  FROM pgqueue_jobs
 WHERE status = ANY(%(statuses)s::varchar[])
   AND completed_at < now() - %(age)s * interval '1 second'
   AND workflow_id IS NULL
"""

_COUNT_WORKFLOW_JOBS = "SELECT count(*) FROM pgqueue_jobs WHERE workflow_id = ANY(%(workflows)s)"

#: Where the next pass over old workflows starts, per database and retention: after the
#: last workflow the previous pass read (None: from the oldest).
_resume_after: dict[tuple[str, float, tuple[str, ...]], uuid.UUID | None] = {}
_FIRST_ID = uuid.UUID(int=0)


def _id_of_time(seconds: float) -> uuid.UUID:
    """The smallest version 7 UUID of a time: ids of later jobs and workflows sort after."""
    return version7_id(max(int(seconds * 1000), 0))


def _prunable_workflows(
    cursor: Any, params: dict[str, Any], key: Any, dry_run: bool
) -> list[uuid.UUID]:
    """The next workflows to delete whole (see ``_OLD_WORKFLOWS``)."""
    after = _resume_after.get(key) or _FIRST_ID
    before = _id_of_time(time.time() - params["age"])
    cursor.execute(_OLD_WORKFLOWS, {**params, "after": after, "before": before})
    candidates = [row[0] for row in cursor.fetchall()]
    if not dry_run:
        full = params["batch"] is not None and len(candidates) == params["batch"]
        _resume_after[key] = candidates[-1] if full else None
    if not candidates:
        return []
    cursor.execute(_WHOLE_WORKFLOWS, {**params, "workflows": candidates})
    return [row[0] for row in cursor.fetchall()]


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

    A job of a [workflow](../how-to/workflows.md) goes only with its whole workflow,
    once all its jobs are finished and older than that: a workflow with a failed job
    when ``statuses`` includes ``failed``, else when ``statuses`` names the status of
    each of its jobs. A workflow is deleted in one statement, however many jobs it has.

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
    params: dict[str, Any] = {
        "statuses": list(statuses),
        "age": older_than,
        "batch": batch_size,
        "failed": JobStatus.FAILED.value,
    }
    with connections[alias].cursor() as cursor:
        key = (alias, older_than, tuple(sorted(statuses)))
        if dry_run:
            cursor.execute(_COUNT, params)
            plain = int(cursor.fetchone()[0])
            workflows = _prunable_workflows(cursor, {**params, "batch": None}, key, True)
            cursor.execute(_COUNT_WORKFLOW_JOBS, {"workflows": workflows})
            return plain + int(cursor.fetchone()[0])
        deleted = batches = 0
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while max_batches is None or batches < max_batches:
            if deadline is not None and batches and time.monotonic() >= deadline:
                break
            cursor.execute(_DELETE_BATCH, params)
            batches += 1
            deleted += cursor.rowcount
            more = cursor.rowcount == batch_size
            workflows = _prunable_workflows(cursor, params, key, False)
            if workflows:
                cursor.execute(_DELETE_WORKFLOWS, {"workflows": workflows})
                deleted += int(cursor.fetchone()[0])
                more = True
            if not more:
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


_PRUNE_EVENTS = """
DELETE FROM pgqueue_emitted_events
 WHERE name IN (SELECT name FROM pgqueue_emitted_events
                 WHERE emitted_at < now() - %s * interval '1 second'
                 LIMIT %s)
"""


def prune_events_by_settings(*, using: str | None = None) -> int:
    """Apply ``PGQUEUE['EVENT_RETENTION']`` (workers call this with recovery)."""
    retention = conf.get_settings().EVENT_RETENTION
    return 0 if retention is None else prune_events(retention, using=using)


def prune_events(older_than: float, *, using: str | None = None, batch_size: int = 1000) -> int:
    """Delete emitted events (``emit_event()``) last emitted more than ``older_than``
    seconds ago, at most ``batch_size`` of them; return how many. Jobs still waiting for
    such an event go on waiting (for another emit, or their timeout)."""
    with connections[conf.jobs_database(using)].cursor() as cursor:
        cursor.execute(_PRUNE_EVENTS, [older_than, batch_size])
        deleted: int = cursor.rowcount
    if deleted:
        logger.info("pruned %d emitted event(s) older than %gs", deleted, older_than)
    return deleted
