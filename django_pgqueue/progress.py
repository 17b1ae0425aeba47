"""Writing a running job's progress so it is visible immediately."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import connections

from . import conf
from .schema import EVENTS_KEPT, IN_FLIGHT, status_in
from .sideconn import execute_autocommit

if TYPE_CHECKING:
    from .models import Job

# Only while the same attempt holds the job: a handler whose job was recovered (and
# handed to another worker, or to this one again) must not overwrite a newer attempt.
# The event is inserted by the same statement, from the UPDATE's RETURNING: no extra
# round trip, and no event when the job is not held. Every EVENTS_KEPT-th event trims
# the history to the newest EVENTS_KEPT events, itself included (the DELETE sees the
# rows as they were before this statement: it keeps EVENTS_KEPT - 1 of them).
_UPDATE_PROGRESS = f"""
WITH updated AS (
    UPDATE pgqueue_jobs
       SET progress = %s,
           current_stage = COALESCE(%s, current_stage),
           events_count = events_count + 1
     WHERE id = %s
       AND {status_in(IN_FLIGHT)}
       AND worker_id IS NOT DISTINCT FROM %s
       AND attempts = %s
    RETURNING id, progress, current_stage, events_count, attempts
), trimmed AS (
    DELETE FROM pgqueue_job_events AS events
     USING updated
     WHERE events.job_id = updated.id
       AND mod(updated.events_count, {EVENTS_KEPT}) = 0
       AND events.id < (SELECT kept.id
                          FROM pgqueue_job_events AS kept
                         WHERE kept.job_id = updated.id
                         ORDER BY kept.id DESC
                        OFFSET {EVENTS_KEPT - 2} LIMIT 1)
)
INSERT INTO pgqueue_job_events (job_id, created_at, progress, stage, attempt)
SELECT id, now(), progress, current_stage, attempts FROM updated
"""


def write_progress(job: Job, percent: int, stage: str | None) -> bool:
    """Commit the job's progress, and a ``JobEvent`` for it, now, in one statement that
    escapes the caller's transaction if it has one.

    Returns False (and writes nothing) when the job is no longer claimed or running by
    the worker recorded on ``job``.
    """
    alias = conf.jobs_database(job._state.db)
    params = (percent, stage, job.pk, job.worker_id, job.attempts)
    connection = connections[alias]
    if connection.in_atomic_block:
        return execute_autocommit(alias, _UPDATE_PROGRESS, params) > 0
    with connection.cursor() as cursor:
        cursor.execute(_UPDATE_PROGRESS, params)
        updated: int = cursor.rowcount
        return updated > 0
