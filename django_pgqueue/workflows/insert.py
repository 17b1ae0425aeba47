"""The insert of jobs with dependencies: the jobs, their edges and counters, in one
transaction on the caller's connection (a savepoint inside ``transaction.atomic``).

The jobs depended on that already exist are locked first (``FOR NO KEY UPDATE``, in id
order) and stay locked until the caller's transaction ends: a worker finishing one of
them meanwhile waits, then sees the new edges and settles them (its finish sees the
``workflow_id`` this call gave the job). Without the lock, a dependency finishing
between the read of its status and the commit would never release its new dependent.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from .. import conf
from ..due import DUE
from ..exceptions import InvalidJobError
from ..inserts import COLUMNS, returning_jobs, run_at_of, send_enqueued, settle_held
from ..jobrows import JobRow, new_job_id
from ..schema import JobStatus
from .plan import Step, internal_order, plan_steps

if TYPE_CHECKING:
    from ..models import Job

_LOCK_DEPENDENCIES = """
SELECT id, status, workflow_id FROM pgqueue_jobs
 WHERE id = ANY(%s)
 ORDER BY id
   FOR NO KEY UPDATE
"""
_JOIN_WORKFLOW = """
UPDATE pgqueue_jobs SET workflow_id = %s WHERE id = ANY(%s) AND workflow_id IS NULL
"""
_NOW = "SELECT clock_timestamp(), now()"
_COPY_JOBS = (
    f"COPY pgqueue_jobs ({COLUMNS}, created_at, status, workflow_id, last_error, "
    "completed_at) FROM STDIN"
)
_COPY_EDGES = (
    "COPY pgqueue_job_dependencies (job_id, dependency_id, on_failure, resolved) FROM STDIN"
)
_COPY_WAITS = "COPY pgqueue_job_waits (job_id, unresolved, cancelled_by_id) FROM STDIN"
_NOTIFY_DUE = f"""
SELECT count(pg_notify(%s, queue))
  FROM (SELECT DISTINCT queue FROM pgqueue_jobs WHERE id = ANY(%s) AND {DUE}) AS due
"""
_READ_BACK = "SELECT * FROM pgqueue_jobs WHERE id = ANY(%s)"
_ONE_MICROSECOND = timedelta(microseconds=1)


def enqueue_graph(rows: list[JobRow], alias: str, field_of: Callable[[int], str]) -> list[Job]:
    """Insert ``rows`` (validated, some with ``depends_on``) as one workflow; return
    their jobs in order. ``field_of(i)``: how errors name row ``i``'s ``depends_on``."""
    for index, row in enumerate(rows):
        if row.unique_key is not None:
            raise InvalidJobError(
                field_of(index).replace("depends_on", "unique_key"),
                "jobs enqueued with dependencies among them cannot have unique keys",
            )
        _check_databases(row, alias, field_of(index))
    order = internal_order(rows, field_of)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        existing_ids = sorted(
            {
                item.target
                for row in rows
                for item in row.depends_on or ()
                if isinstance(item.target, uuid.UUID)
            }
        )
        existing: dict[uuid.UUID, str] = {}
        workflow_id: uuid.UUID | None = None
        if existing_ids:
            cursor.execute(_LOCK_DEPENDENCIES, [existing_ids])
            found = {job_id: (status, workflow) for job_id, status, workflow in cursor.fetchall()}
            _check_found(rows, found, alias, field_of)
            existing = {job_id: status for job_id, (status, _) in found.items()}
            workflow_id = _first_workflow(rows, found)
        if workflow_id is None:
            workflow_id = new_job_id()
        if existing_ids:
            cursor.execute(_JOIN_WORKFLOW, [workflow_id, existing_ids])
        steps = plan_steps(rows, order, existing)
        pending = [
            row._replace(held=row.held and step.status == JobStatus.PENDING.value)
            for row, step in zip(rows, steps, strict=True)
        ]
        with connections[alias].wrap_database_errors:
            _copy(cursor, pending, steps, workflow_id)
        ids = [row.id for row in rows]
        by_id = {job.id: job for job in returning_jobs(_READ_BACK, [ids], alias)}
        jobs = [by_id[job_id] for job_id in ids]
        settle_held(jobs, pending, alias)
        settings = conf.get_settings()
        due_ids = [
            row.id
            for row, step in zip(rows, steps, strict=True)
            if step.status == JobStatus.PENDING.value
        ]
        if settings.NOTIFY and due_ids:
            cursor.execute(_NOTIFY_DUE, [settings.NOTIFY_CHANNEL, due_ids])
    send_enqueued(jobs)
    return jobs


def _check_databases(row: JobRow, alias: str, field: str) -> None:
    for position, item in enumerate(row.depends_on or ()):
        if item.database is not None and conf.jobs_database(item.database) != alias:
            raise InvalidJobError(
                f"{field}[{position}]",
                f"is a job of the database {item.database!r}; this enqueue writes to "
                f"{alias!r}, and a job can only depend on jobs of its own database",
            )


def _check_found(
    rows: Sequence[JobRow],
    found: dict[uuid.UUID, Any],
    alias: str,
    field_of: Callable[[int], str],
) -> None:
    for index, row in enumerate(rows):
        for position, item in enumerate(row.depends_on or ()):
            if isinstance(item.target, uuid.UUID) and item.target not in found:
                raise InvalidJobError(
                    f"{field_of(index)}[{position}]",
                    f"no job {item.target} in the jobs database {alias!r}: it was never "
                    "committed, or it was pruned",
                )


def _first_workflow(rows: Sequence[JobRow], found: dict[uuid.UUID, Any]) -> uuid.UUID | None:
    """The workflow of the first dependency, in the order given, that is in one."""
    for row in rows:
        for item in row.depends_on or ():
            if isinstance(item.target, uuid.UUID):
                workflow = found[item.target][1]
                if workflow is not None:
                    return workflow  # type: ignore[no-any-return]
    return None


def _copy(
    cursor: Any, rows: Sequence[JobRow], steps: Sequence[Step], workflow_id: uuid.UUID
) -> None:
    """Send the jobs, their edges and their counters, with ``COPY``."""
    cursor.execute(_NOW)
    clock, now = cursor.fetchone()
    raw = cursor.cursor  # psycopg's cursor, for COPY
    with raw.copy(_COPY_JOBS) as copy:
        for index, (row, step) in enumerate(zip(rows, steps, strict=True)):
            cancelled = step.status == JobStatus.CANCELLED.value
            copy.write_row(
                (
                    row.id,
                    row.job_type,
                    row.queue,
                    row.priority,
                    row.data,
                    run_at_of(row, now),
                    row.max_attempts,
                    row.concurrency_key,
                    row.held,
                    clock + index * _ONE_MICROSECOND,  # claim order: the order given
                    step.status,
                    workflow_id,
                    step.reason,
                    now if cancelled else None,
                )
            )
    with raw.copy(_COPY_EDGES) as copy:
        for step in steps:
            for edge in step.edges:
                copy.write_row((edge.job, edge.dependency, edge.on_failure, edge.resolved))
    with raw.copy(_COPY_WAITS) as copy:
        for row, step in zip(rows, steps, strict=True):
            if step.unresolved:
                copy.write_row((row.id, step.unresolved, step.cancelled_by))
