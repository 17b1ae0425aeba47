"""Writing a running job's progress so it is visible immediately."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import connections

from . import conf
from .sideconn import execute_autocommit

if TYPE_CHECKING:
    from .models import Job

_UPDATE_PROGRESS = """
UPDATE pgqueue_jobs
   SET progress = %s,
       current_stage = COALESCE(%s, current_stage),
       events_count = events_count + 1
 WHERE id = %s
"""


def write_progress(job: Job, percent: int, stage: str | None) -> None:
    """Commit the job's progress now, escaping the caller's transaction if it has one."""
    alias = job._state.db or conf.get_settings().DATABASE
    params = (percent, stage, job.pk)
    connection = connections[alias]
    if connection.in_atomic_block:
        execute_autocommit(alias, _UPDATE_PROGRESS, params)
    else:
        with connection.cursor() as cursor:
            cursor.execute(_UPDATE_PROGRESS, params)
