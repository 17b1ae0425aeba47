"""Per-minute rollups: what the admin's charts draw, kept for a week after the jobs
themselves are pruned.

Once a minute, one worker (whichever claims the minute first) writes:

- a row of ``pgqueue_minutes`` for the minute that just began: the depth of each queue
  at that moment, from the read model (``stats.snapshot()``, so the charts and the
  overview count alike); the row's primary key is the minute, which makes this happen
  once however many workers run;
- rows of ``pgqueue_minute_jobs`` for the minutes that ended, one per minute, queue and
  job type: how many jobs completed, failed and were cancelled in it, with histograms of
  their waiting times (due to start) and run times. The last ``REROLL_MINUTES`` minutes
  are counted again each time, so that a job whose finishing transaction commits a
  little late is still counted.

Histograms, not percentiles, are stored, so that the percentiles of an hour or a week
are exact over the stored buckets: bucket ``k`` counts the durations from
``2^((k-1)/2)`` to ``2^(k/2)`` milliseconds (bucket 0 up to 1 ms, the last one all
longer), each bucket about 41% wider than the one before. A percentile is read as its
bucket's geometric middle: within about 19% of the true value.

Rollups count the jobs in the table: jobs pruned before their minute is rolled up
(``RETENTION`` shorter than a few minutes) are not counted, and minutes when no worker
ran have no row (the charts show a gap, not a zero).
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from . import conf, stats, validation
from .schema import FINISHED, JobStatus, status_in

logger = logging.getLogger("django_pgqueue.rollups")

__all__ = [
    "BUCKETS",
    "SPANS",
    "Series",
    "bucket_bounds",
    "percentile",
    "recount",
    "rolled_up_names",
    "series",
    "write_rollups",
]

BUCKETS = 48
"""Histogram buckets: 0 (up to 1 ms) to ``BUCKETS - 1`` (longer than about 2.3 hours)."""
#: Minutes counted again on each pass (the one that just ended and the one before).
REROLL_MINUTES = 2

# Serialises the writers (every worker tries once a minute): the others skip the pass.
_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('pgqueue_rollups'))"

_CLAIM_MINUTE = """
INSERT INTO pgqueue_minutes (minute, depths)
VALUES (date_trunc('minute', statement_timestamp()), '{}')
ON CONFLICT (minute) DO NOTHING
RETURNING minute
"""

_DEPTHS = "UPDATE pgqueue_minutes SET depths = %s::jsonb WHERE minute = %s"

_TAKEN = "SELECT 1 FROM pgqueue_minutes WHERE minute = date_trunc('minute', statement_timestamp())"


def _bucket_sql(seconds: str) -> str:
    """The bucket of a duration in seconds, in SQL (``NULL`` stays ``NULL``)."""
    ms = f"GREATEST(EXTRACT(EPOCH FROM {seconds}) * 1000, 1)"
    return f"LEAST(ceil(2 * ln({ms}) / ln(2))::int, {BUCKETS - 1})"


# Served by idx_jobs_finished (its predicate is the status filter): a range of
# completed_at, the jobs that finished in the minutes being rolled up.
_FINISHED = f"""
SELECT date_trunc('minute', completed_at), queue, job_type, status,
       {_bucket_sql("started_at - run_at")},
       {_bucket_sql("completed_at - started_at")},
       count(*)
  FROM pgqueue_jobs
 WHERE {status_in(FINISHED)}
   AND completed_at >= %(start)s AND completed_at < %(end)s
 GROUP BY 1, 2, 3, 4, 5, 6
"""

_CLEAR = "DELETE FROM pgqueue_minute_jobs WHERE minute >= %(start)s AND minute < %(end)s"

_INSERT = """
INSERT INTO pgqueue_minute_jobs
    (minute, queue, job_type, completed, failed, cancelled, wait_ms, run_ms)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
"""

_PRUNE = (
    "DELETE FROM pgqueue_minute_jobs"
    " WHERE minute < statement_timestamp() - %(age)s * interval '1 second'",
    "DELETE FROM pgqueue_minutes"
    " WHERE minute < statement_timestamp() - %(age)s * interval '1 second'",
    "DELETE FROM pgqueue_hour_jobs"
    " WHERE hour < statement_timestamp() - %(age)s * interval '1 second'",
)


@dataclass
class _Minute:
    """One minute, queue and job type being counted."""

    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    wait: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    run: list[int] = field(default_factory=lambda: [0] * BUCKETS)


def write_rollups(*, using: str | None = None) -> bool:
    """Write the rollups of the minute that just began, unless another worker did;
    return whether this call wrote them. Workers call it from their heartbeat.

    Safe from any number of processes at once: one writes each minute, the others
    return ``False`` at the cost of one indexed lookup.
    """
    alias = conf.jobs_database(using)
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(_TAKEN)
        if cursor.fetchone() is not None:
            return False
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(_LOCK)
        if not cursor.fetchone()[0]:
            return False
        cursor.execute(_CLAIM_MINUTE)
        row = cursor.fetchone()
        if row is None:
            return False
        minute: datetime = row[0]
        # Sampled by the writer only, once it holds the minute.
        cursor.execute(_DEPTHS, [_json(_depths(alias)), minute])
        _recount(cursor, minute - timedelta(minutes=REROLL_MINUTES), minute)
        retention = conf.get_settings().ROLLUP_RETENTION
        for statement in _PRUNE if retention is not None else ():
            cursor.execute(statement, {"age": retention})
    return True


def recount(since: datetime, *, using: str | None = None) -> int:
    """Count again the jobs finished from ``since`` (aware; its minute) to the minute
    that began last, from the jobs still in the table, replacing those minutes' and
    hours' rollups; return how many rows of minutes it wrote.

    Workers count each minute as it ends; this fills the charts with the past after an
    upgrade (``recount(timezone.now() - timedelta(days=7))``), or after a time when
    ``RETENTION`` was shorter than a minute or two. It reads the finished jobs of the span
    through ``idx_jobs_finished``: a day of a busy queue takes seconds.
    """
    aware = validation.aware_datetime(since, "since")
    alias = conf.jobs_database(using)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute("SELECT date_trunc('minute', %s::timestamptz), " + _NOW_MINUTE, [aware])
        start, end = cursor.fetchone()
        return _recount(cursor, start, end)


_NOW_MINUTE = "date_trunc('minute', statement_timestamp())"


def _recount(cursor: Any, start: datetime, end: datetime) -> int:
    """Replace the rollups of the minutes from ``start`` to ``end`` and of their hours."""
    span = {"start": start, "end": end}
    cursor.execute(_FINISHED, span)
    rows = _rows(_count(cursor.fetchall()))
    cursor.execute(_CLEAR, span)
    cursor.executemany(_INSERT, rows)
    _roll_hours(cursor, start, end)
    return len(rows)


# The hours that the minutes just rolled up belong to, summed from their minutes (the
# current hour so far, and the one before when those minutes reach into it).
_HOUR_COUNTS = """
SELECT date_trunc('hour', minute), queue, job_type, sum(completed), sum(failed), sum(cancelled)
  FROM pgqueue_minute_jobs
 WHERE minute >= %(start)s AND minute < %(end)s
 GROUP BY 1, 2, 3
"""

_HOUR_BUCKETS = """
SELECT date_trunc('hour', minute), queue, job_type, k::int - 1, sum(n)
  FROM pgqueue_minute_jobs, unnest({column}) WITH ORDINALITY AS u(n, k)
 WHERE minute >= %(start)s AND minute < %(end)s AND n > 0
 GROUP BY 1, 2, 3, 4
"""

_CLEAR_HOURS = "DELETE FROM pgqueue_hour_jobs WHERE hour >= %(start)s AND hour < %(end)s"

_INSERT_HOUR = """
INSERT INTO pgqueue_hour_jobs
    (hour, queue, job_type, completed, failed, cancelled, wait_ms, run_ms)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
"""


def _roll_hours(cursor: Any, since: datetime, until: datetime) -> None:
    """Rewrite the rows of ``pgqueue_hour_jobs`` of the hours from ``since``'s to
    ``until`` from their minutes."""
    span = {"start": since.replace(minute=0, second=0, microsecond=0), "end": until}
    cursor.execute(_HOUR_COUNTS, span)
    hours: dict[tuple[datetime, str, str], _Minute] = {}
    for at, queue, job_type, completed, failed, cancelled in cursor.fetchall():
        summed = hours[(at, queue, job_type)] = _Minute()
        summed.counts.update(
            {
                JobStatus.COMPLETED.value: completed,
                JobStatus.FAILED.value: failed,
                JobStatus.CANCELLED.value: cancelled,
            }
        )
    for column in ("wait_ms", "run_ms"):
        cursor.execute(_HOUR_BUCKETS.format(column=column), span)
        for at, queue, job_type, k, n in cursor.fetchall():
            summed = hours.setdefault((at, queue, job_type), _Minute())
            (summed.wait if column == "wait_ms" else summed.run)[min(k, BUCKETS - 1)] += n
    cursor.execute(_CLEAR_HOURS, span)
    cursor.executemany(_INSERT_HOUR, _rows(hours))


def _rows(found: dict[tuple[datetime, str, str], _Minute]) -> list[tuple[Any, ...]]:
    """The rows of a rollup table, from what was counted."""
    return [
        (
            at,
            queue,
            job_type,
            counted.counts[JobStatus.COMPLETED.value],
            counted.counts[JobStatus.FAILED.value],
            counted.counts[JobStatus.CANCELLED.value],
            _trimmed(counted.wait),
            _trimmed(counted.run),
        )
        for (at, queue, job_type), counted in sorted(found.items())
    ]


def _depths(alias: str) -> dict[str, dict[str, int]]:
    """Each queue's depth now, from the read model the overview shows."""
    return {
        queue.name: {
            "pending": queue.pending,
            "scheduled": queue.scheduled,
            "running": queue.claimed + queue.running,
            "waiting": queue.waiting,
        }
        for queue in stats.snapshot(using=alias).queues
    }


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _count(rows: Sequence[Sequence[Any]]) -> dict[tuple[datetime, str, str], _Minute]:
    found: dict[tuple[datetime, str, str], _Minute] = defaultdict(_Minute)
    for at, queue, job_type, status, wait, run, jobs in rows:
        counted = found[(at, queue, job_type)]
        counted.counts[status] += jobs
        if wait is not None:
            counted.wait[max(wait, 0)] += jobs
        if run is not None:
            counted.run[max(run, 0)] += jobs
    return found


def _trimmed(histogram: list[int]) -> list[int]:
    """Without its trailing empty buckets (most durations fill a few low ones)."""
    end = len(histogram)
    while end and not histogram[end - 1]:
        end -= 1
    return histogram[:end]


def bucket_bounds(k: int) -> tuple[float, float]:
    """The durations, in seconds, that bucket ``k`` counts (the last one has no upper
    bound: ``math.inf``)."""
    low = 0.0 if k == 0 else 2 ** ((k - 1) / 2) / 1000
    high = math.inf if k >= BUCKETS - 1 else 2 ** (k / 2) / 1000
    return low, high


def percentile(histogram: Sequence[int], fraction: float) -> float | None:
    """The ``fraction`` (0 to 1) percentile of a histogram, in seconds: the geometric
    middle of the bucket it falls in; ``None`` for an empty one."""
    total = sum(histogram)
    if not total:
        return None
    rank = fraction * total
    seen = 0
    for k, count in enumerate(histogram):
        seen += count
        if count and seen >= rank:
            low, high = bucket_bounds(k)
            if k == 0:
                return high / 2
            if math.isinf(high):
                return low
            return math.sqrt(low * high)
    return None  # pragma: no cover - the loop always reaches the total


SPANS: dict[str, tuple[timedelta, timedelta]] = {
    "hour": (timedelta(hours=1), timedelta(minutes=1)),
    "day": (timedelta(days=1), timedelta(minutes=15)),
    "week": (timedelta(days=7), timedelta(hours=2)),
}
"""The spans the charts offer, by name: how far back, and the width of each point."""


@dataclass(frozen=True)
class Series:
    """The charts' figures over a span, one value per point (``None``: no worker wrote
    rollups then). Times are the start of each point; durations are in seconds.

    ``completed``, ``failed`` and ``cancelled`` count jobs per point; ``wait`` and
    ``run`` map 0.5, 0.95 and 0.99 to their percentiles; ``pending``, ``scheduled`` and
    ``running`` are the largest depth sampled at the end of a minute of each point
    (``None`` throughout when filtered by job type: depths are per queue). The last point
    is the minute that just ended.
    """

    span: str
    step: timedelta
    times: list[datetime]
    completed: list[int | None]
    failed: list[int | None]
    cancelled: list[int | None]
    wait: dict[float, list[float | None]]
    run: dict[float, list[float | None]]
    pending: list[int | None]
    scheduled: list[int | None]
    running: list[int | None]


PERCENTILES = (0.5, 0.95, 0.99)

# Where each span's counts come from: the week's points add up hours, not minutes.
_SOURCES = {
    "hour": ("pgqueue_minute_jobs", "minute"),
    "day": ("pgqueue_minute_jobs", "minute"),
    "week": ("pgqueue_hour_jobs", "hour"),
}

_END = "SELECT date_trunc('minute', statement_timestamp())"


def _filters(queue: str | None, job_type: str | None, table: str = "") -> tuple[str, list[Any]]:
    sql, params = "", []
    if queue is not None:
        sql += f" AND {table}queue = %s"
        params.append(queue)
    if job_type is not None:
        sql += f" AND {table}job_type = %s"
        params.append(job_type)
    return sql, params


def series(
    span: str = "hour",
    *,
    queue: str | None = None,
    job_type: str | None = None,
    using: str | None = None,
) -> Series:
    """The figures of the charts over ``span`` (a key of ``SPANS``), for one queue and
    job type or all of them, read from the rollups (three indexed queries)."""
    length, step = SPANS[span]
    table, column = _SOURCES[span]
    alias = conf.jobs_database(using)
    with connections[alias].cursor() as cursor:
        cursor.execute(_END)
        end: datetime = cursor.fetchone()[0]
        if column == "hour":  # points of whole hours, the last one the current hour
            end = end.replace(minute=0) + timedelta(hours=1)
        start = end - length
        bins = [start + step * k for k in range(int(length / step))]
        where, params = _filters(queue, job_type)
        base = [step.total_seconds(), end, start, end, *params]
        cursor.execute(
            f"SELECT date_bin(%s * interval '1 second', {column}, %s),"
            " sum(completed), sum(failed), sum(cancelled)"
            f" FROM {table} WHERE {column} >= %s AND {column} < %s"
            f"{where} GROUP BY 1",
            base,
        )
        counts = {at: row for at, *row in cursor.fetchall()}
        histograms: dict[str, dict[datetime, list[int]]] = {"wait": {}, "run": {}}
        for histogram in ("wait", "run"):
            cursor.execute(
                f"SELECT date_bin(%s * interval '1 second', {column}, %s), i::int - 1, sum(n)"
                f" FROM {table}, unnest({histogram}_ms) WITH ORDINALITY AS u(n, i)"
                f" WHERE {column} >= %s AND {column} < %s{where} AND n > 0 GROUP BY 1, 2",
                base,
            )
            for at, k, n in cursor.fetchall():
                histograms[histogram].setdefault(at, [0] * BUCKETS)[min(k, BUCKETS - 1)] += n
        # A sample taken as a minute began is the depth as the minute before ended: it
        # goes to that minute's point. Every sample counts, with 0 for a queue it did not
        # list (it had no job).
        of_queue, of_params = ("true", []) if queue is None else ("key = %s", [queue])
        cursor.execute(
            "SELECT at, max(pending), max(scheduled), max(running) FROM ("
            " SELECT date_bin(%s * interval '1 second', minute - interval '1 minute', %s) AS at,"
            " minute,"
            f"  coalesce(sum((value->>'pending')::bigint) FILTER (WHERE {of_queue}), 0),"
            f"  coalesce(sum((value->>'scheduled')::bigint) FILTER (WHERE {of_queue}), 0),"
            f"  coalesce(sum((value->>'running')::bigint) FILTER (WHERE {of_queue}), 0)"
            " FROM pgqueue_minutes LEFT JOIN LATERAL jsonb_each(depths) ON true"
            " WHERE minute > %s AND minute <= %s GROUP BY 1, 2"
            ") AS sampled (at, minute, pending, scheduled, running) GROUP BY 1",
            [step.total_seconds(), end, *of_params * 3, start, end],
        )
        depths = {at: row for at, *row in cursor.fetchall()}
    sampled = set(depths) | set(counts)

    def counted(index: int) -> list[int | None]:
        return [
            int(counts[at][index]) if at in counts else (0 if at in sampled else None)
            for at in bins
        ]

    def depth(index: int) -> list[int | None]:
        if job_type is not None:
            return [None] * len(bins)
        return [int(depths[at][index]) if at in depths else None for at in bins]

    def percentiles(column: str) -> dict[float, list[float | None]]:
        found = histograms[column]
        return {
            fraction: [percentile(found[at], fraction) if at in found else None for at in bins]
            for fraction in PERCENTILES
        }

    return Series(
        span=span,
        step=step,
        times=bins,
        completed=counted(0),
        failed=counted(1),
        cancelled=counted(2),
        wait=percentiles("wait"),
        run=percentiles("run"),
        pending=depth(0),
        scheduled=depth(1),
        running=depth(2),
    )


def rolled_up_names(*, using: str | None = None) -> tuple[list[str], list[str]]:
    """The queues and the job types that the rollups hold, sorted (from the hours: a
    few thousand rows at most)."""
    with connections[conf.jobs_database(using)].cursor() as cursor:
        cursor.execute("SELECT DISTINCT queue, job_type FROM pgqueue_hour_jobs")
        pairs = cursor.fetchall()
    return sorted({queue for queue, _ in pairs}), sorted({job_type for _, job_type in pairs})
