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
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from .. import conf
from ..exceptions import InvalidJobError
from ..inserts import (
    COLUMNS,
    COPY_ESCAPES,
    COPY_PART_ROWS,
    built,
    collector_paused,
    copy_line,
    notify_copied,
    run_at_of,
    send_enqueued,
    settle_held,
)
from ..jobrows import JobRow, new_job_id
from ..schema import JobStatus
from .plan import Step, check_size, internal_order, plan_step, plan_steps

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
_ONE_MICROSECOND = timedelta(microseconds=1)


def enqueue_graph(rows: list[JobRow], alias: str, field_of: Callable[[int], str]) -> list[Job]:
    """Insert ``rows`` (validated, some with ``depends_on``) as one workflow; return
    their jobs in order. ``field_of(i)``: how errors name row ``i``'s ``depends_on``."""
    for index, row in enumerate(rows):
        _check_row(row, index, alias, field_of)
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
        planned = _Planned(cursor, workflow_id)
        for row, step in zip(rows, steps, strict=True):
            planned.add(row, step)
        parts = (
            range(i, min(i + COPY_PART_ROWS, len(rows)))
            for i in range(0, len(rows), COPY_PART_ROWS)
        )
        jobs = planned.send(parts, alias)
    send_enqueued(jobs)
    return jobs


def enqueue_ordered_graph(
    rows: Iterable[JobRow], alias: str, field_of: Callable[[int], str]
) -> list[Job]:
    """``enqueue_graph`` for rows that depend only on rows before them, by index (the
    specs a chain, group or chord compiles to): each part of ``COPY_PART_ROWS`` rows is
    validated (as ``rows`` is consumed), planned and sent while the server inserts the
    part before, as ``enqueue_many`` streams plain jobs. An invalid row rolls back what
    was sent; the error names it."""
    source = iter(rows)
    with (
        transaction.atomic(using=alias),
        collector_paused(),
        connections[alias].cursor() as cursor,
    ):
        planned = _Planned(cursor, new_job_id())

        def parts() -> Iterator[range]:
            while part := list(itertools.islice(source, COPY_PART_ROWS)):
                start = len(planned.rows)
                for row in part:
                    index = len(planned.rows)
                    _check_row(row, index, alias, field_of)
                    _check_earlier(row, index, field_of)
                    planned.add(row, plan_step(planned.rows, planned.steps, row, {}))
                yield range(start, len(planned.rows))

        jobs = planned.send(parts(), alias)
    send_enqueued(jobs)
    return jobs


def _check_row(row: JobRow, index: int, alias: str, field_of: Callable[[int], str]) -> None:
    check_size(index)
    if row.unique_key is not None:
        raise InvalidJobError(
            field_of(index).replace("depends_on", "unique_key"),
            "jobs enqueued with dependencies among them cannot have unique keys",
        )
    _check_databases(row, alias, field_of(index))


def _check_earlier(row: JobRow, index: int, field_of: Callable[[int], str]) -> None:
    """``enqueue_ordered_graph``'s promise: ``row`` depends on earlier rows only."""
    for position, item in enumerate(row.depends_on or ()):
        if not isinstance(item.target, int) or not 0 <= item.target < index:
            raise InvalidJobError(
                f"{field_of(index)}[{position}]",
                f"must name an earlier spec of the call, got {item.target!r}",
            )


class _Planned:
    """The rows of one call as they will be written: each with its step, times and
    workflow columns, appended in order; ``send`` writes them."""

    def __init__(self, cursor: Any, workflow_id: uuid.UUID) -> None:
        self.cursor = cursor
        self.workflow_id = workflow_id
        cursor.execute(_NOW)
        self.clock, self.now = cursor.fetchone()
        #: The rows as inserted: a held row that does not start pending is not held.
        self.rows: list[JobRow] = []
        self.steps: list[Step] = []
        self.times: list[tuple[datetime, datetime]] = []
        #: Each row's workflow columns (``_step_values``) and the end of its COPY line
        #: with them: one of each, shared, for all rows that start alike.
        self.values: list[dict[str, Any]] = []
        self.suffixes: list[str] = []
        self._shared: dict[tuple[str, str], tuple[dict[str, Any], str]] = {}

    def add(self, row: JobRow, step: Step) -> None:
        if row.held and step.status != JobStatus.PENDING.value:
            row = row._replace(held=False)
        self.times.append(
            (self.clock + len(self.rows) * _ONE_MICROSECOND, run_at_of(row, self.now))
        )
        self.rows.append(row)
        self.steps.append(step)
        start = self._shared.get((step.status, step.reason))
        if start is None:
            values = _step_values(step, self.workflow_id, self.now)
            start = self._shared[(step.status, step.reason)] = (values, _line_end(values))
        self.values.append(start[0])
        self.suffixes.append(start[1])

    def send(self, parts: Iterable[range], alias: str) -> list[Job]:
        """Write the rows of each of ``parts`` (ranges of indexes, each filled in by the
        time it is reached), then the edges and counters; release held keys and notify
        the queues of the jobs due. Returns the jobs."""
        with connections[alias].wrap_database_errors:
            jobs = _send(self, parts, alias)
        settle_held(jobs, self.rows, alias)
        settings = conf.get_settings()
        if settings.NOTIFY:
            started = [
                (row, times)
                for row, times, step in zip(self.rows, self.times, self.steps, strict=True)
                if step.status == JobStatus.PENDING.value
            ]
            notify_copied(
                self.cursor,
                connections[alias],
                [row for row, _ in started],
                [times for _, times in started],
                self.now,
                settings.NOTIFY_CHANNEL,
            )
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


def _send(planned: _Planned, parts: Iterable[range], alias: str) -> list[Job]:
    """Send the jobs, their edges and their counters with ``COPY`` in its text format;
    return the jobs, built while the server inserts the edges.

    ``parts``: ranges of indexes of ``planned.rows``, each sent as one write as soon as
    it is reached (the lists may grow until then), so the server inserts one part while
    the next is prepared. A job's ``created_at`` is the clock read before, plus a
    microsecond a job (claim order is the order given); its line is a plain insert's
    (``copy_line``) and its workflow columns; ids go as 32 hex digits, as there.
    """
    raw = planned.cursor.cursor  # psycopg's cursor, for COPY
    rows, steps, times = planned.rows, planned.steps, planned.times
    now_text = planned.now.isoformat()
    with raw.copy(_COPY_JOBS) as copy:
        for part in parts:
            start, stop = part.start, part.stop
            copy.write(
                "".join(
                    f"{copy_line(row, row_times, now_text)[:-1]}{suffix}"
                    for row, row_times, suffix in zip(
                        rows[start:stop],
                        times[start:stop],
                        planned.suffixes[start:stop],
                        strict=True,
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
        jobs = built(rows, times, alias, planned.values)
    with raw.copy(_COPY_WAITS) as copy:
        copy.write(waits)
    return jobs


def _line_end(values: dict[str, Any]) -> str:
    """The end of a job's line of ``_COPY_JOBS``: its workflow columns (``_step_values``)."""
    return (
        f"\t{values['status']}\t{values['workflow_id'].int:032x}\t"
        f"{values['last_error'].translate(COPY_ESCAPES)}\t{_timestamp(values['completed_at'])}\n"
    )


def _timestamp(value: datetime | None) -> str:
    return "\\N" if value is None else value.isoformat()


def _uuid(value: uuid.UUID | None) -> str:
    return "\\N" if value is None else f"{value.int:032x}"
