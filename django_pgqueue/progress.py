"""Writing a running job's progress so it is visible immediately."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import connections

from . import conf
from .sideconn import execute_autocommit

if TYPE_CHECKING:
    from .models import Job

# Only while the job is held by the same worker: a handler whose job was recovered and
# handed to another worker must not overwrite the new attempt's progress.
_UPDATE_PROGRESS = """
UPDATE pgqueue_jobs
   SET progress = %s,
       current_stage = COALESCE(%s, current_stage),
       events_count = events_count + 1
 WHERE id = %s
   AND status IN ('claimed', 'running')
   AND worker_id IS NOT DISTINCT FROM %s
"""


def write_progress(job: Job, percent: int, stage: str | None) -> bool:
    """Commit the job's progress now, escaping the caller's transaction if it has one.

    Returns False (and writes nothing) when the job is no longer claimed or running by
    the worker recorded on ``job``.
    """
    alias = job._state.db or conf.get_settings().DATABASE
    params = (percent, stage, job.pk, job.worker_id)
    connection = connections[alias]
    if connection.in_atomic_block:
        return execute_autocommit(alias, _UPDATE_PROGRESS, params) > 0
    with connection.cursor() as cursor:
        cursor.execute(_UPDATE_PROGRESS, params)
        return cursor.rowcount > 0
