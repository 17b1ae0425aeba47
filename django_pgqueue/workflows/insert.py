"""The insert of jobs with dependencies: the jobs, their edges and counters, in one
transaction on the caller's connection (a savepoint inside ``transaction.atomic``).

The jobs depended on that already exist are locked first (``FOR NO KEY UPDATE``, in id
order) and stay locked until the caller's transaction ends: a worker finishing one of
them meanwhile waits, then sees the new edges and settles them (its finish sees the
``workflow_id`` this call gave the job). Without the lock, a dependency finishing
between the read of its status and the commit would never release its new dependent.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from .. import conf
from ..due import DUE
from ..exceptions import InvalidJobError
from ..inserts import (
    COLUMNS,
    COPY_ESCAPES,
    COPY_PART_ROWS,
    built,
    collector_paused,
    copy_line,
    run_at_of,
    send_enqueued,
    settle_held,
)
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
_COPY_EDGES = "COPY pgqueue_job_dependencies (job_id, dependency_id, on_failure) FROM STDIN"
_COPY_WAITS = "COPY pgqueue_job_waits (job_id, unresolved, cancelled_by_id) FROM STDIN"
_NOTIFY_DUE = f"""
SELECT count(pg_notify(%s, queue))
  FROM (SELECT DISTINCT queue FROM pgqueue_jobs WHERE id = ANY(%s) AND {DUE}) AS due
"""
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
    with (
        transaction.atomic(using=alias),
        collector_paused(),
        connections[alias].cursor() as cursor,
    ):
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
        cursor.execute(_NOW)
        clock, now = cursor.fetchone()
        times = [
            (clock + index * _ONE_MICROSECOND, run_at_of(row, now))
            for index, row in enumerate(pending)
        ]
        values = [_step_values(step, workflow_id, now) for step in steps]
        with connections[alias].wrap_database_errors:
            jobs = _send(cursor, pending, steps, times, values, now, alias)
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


def _step_values(step: Step, workflow_id: uuid.UUID, now: datetime) -> dict[str, Any]:
    """What a job of a workflow starts with besides a plain job's values."""
    cancelled = step.status == JobStatus.CANCELLED.value
    return {
        "status": step.status,
        "workflow_id": workflow_id,
        "last_error": step.reason,
        "completed_at": now if cancelled else None,
    }


def _send(
    cursor: Any,
    rows: Sequence[JobRow],
    steps: Sequence[Step],
    times: Sequence[tuple[datetime, datetime]],
    values: Sequence[dict[str, Any]],
    now: datetime,
    alias: str,
) -> list[Job]:
    """Send the jobs, their edges and their counters with ``COPY`` in its text format;
    return the jobs, built while the server inserts the edges.

    ``times``: each job's ``created_at`` (the clock read before, plus a microsecond a
    job: claim order is the order given) and ``run_at``; ``values``: its workflow
    columns (``_step_values``). A job's line is a plain insert's (``copy_line``) and
    its workflow columns; ids go as 32 hex digits, as there. The jobs go in parts of
    ``COPY_PART_ROWS``, and each part's insert overlaps the formatting of the next: the
    server inserts while Python formats, as in ``enqueue_many``.
    """
    raw = cursor.cursor  # psycopg's cursor, for COPY
    now_text = now.isoformat()
    with raw.copy(_COPY_JOBS) as copy:
        for start in range(0, len(rows), COPY_PART_ROWS):
            end = start + COPY_PART_ROWS
            copy.write(
                "".join(
                    map(
                        _job_line,
                        rows[start:end],
                        times[start:end],
                        values[start:end],
                        itertools.repeat(now_text),
                    )
                )
            )
        edges = "".join(
            f"{edge.job.int:032x}\t{edge.dependency.int:032x}\t{edge.on_failure}\n"
            for step in steps
            for edge in step.edges
        )
    with raw.copy(_COPY_EDGES) as copy:
        copy.write(edges)
        waits = "".join(
            f"{row.id.int:032x}\t{step.unresolved}\t{_uuid(step.cancelled_by)}\n"
            for row, step in zip(rows, steps, strict=True)
            if step.unresolved
        )
        jobs = built(rows, times, alias, values)
    with raw.copy(_COPY_WAITS) as copy:
        copy.write(waits)
    return jobs


def _job_line(
    row: JobRow, times: tuple[datetime, datetime], more: dict[str, Any], now_text: str
) -> str:
    """``row``'s line of ``_COPY_JOBS``: a plain insert's, then its workflow columns."""
    return (
        f"{copy_line(row, times, now_text)[:-1]}\t{more['status']}\t"
        f"{more['workflow_id'].int:032x}\t{more['last_error'].translate(COPY_ESCAPES)}"
        f"\t{_timestamp(more['completed_at'])}\n"
    )


def _timestamp(value: datetime | None) -> str:
    return "\\N" if value is None else value.isoformat()


def _uuid(value: uuid.UUID | None) -> str:
    return "\\N" if value is None else f"{value.int:032x}"
