"""What the queues and workers are doing right now, read from the database.

Used by the Prometheus collector (``metrics.py``) and ``manage.py pgqueue_status``; it
needs neither prometheus-client nor rich.

Every query is served by an index, so a snapshot stays cheap on a table of millions of
finished jobs: pending jobs through ``idx_jobs_claimable``, claimed and running ones
through ``idx_jobs_worker``, and finished jobs only for the last minute, through a range
of ``idx_jobs_finished``. Finished jobs are therefore never counted over all time; the
total of ``failed`` jobs, which no index serves, is read only when asked for.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from . import conf
from .due import DUE, NOT_YET_DUE
from .models import LimitScope, WorkerRecord

#: The window of "recent" figures: throughput and waiting times.
WINDOW_SECONDS = 60

_PENDING = f"""
SELECT queue,
       count(*) FILTER (WHERE {DUE}),
       count(*) FILTER (WHERE {NOT_YET_DUE}),
       EXTRACT(EPOCH FROM now() - min(run_at) FILTER (WHERE {DUE}))::float8
  FROM pgqueue_jobs
 WHERE status = 'pending'
 GROUP BY queue
"""

_IN_FLIGHT = """
SELECT queue, worker_id,
       count(*) FILTER (WHERE status = 'claimed'),
       count(*) FILTER (WHERE status = 'running')
  FROM pgqueue_jobs
 WHERE status IN ('claimed', 'running')
 GROUP BY queue, worker_id
"""

_FINISHED_RECENTLY = """
SELECT queue, status, count(*)
  FROM pgqueue_jobs
 WHERE status IN ('completed', 'failed', 'cancelled')
   AND completed_at >= now() - %(window)s * interval '1 second'
 GROUP BY queue, status
"""

# A job that started in the window is either still in flight or finished in it (it
# cannot finish before it starts), so both halves stay on a partial index.
_WAITS = """
SELECT queue, count(*),
       percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY wait)
  FROM (
        SELECT queue, GREATEST(EXTRACT(EPOCH FROM started_at - run_at), 0)::float8 AS wait
          FROM pgqueue_jobs
         WHERE status IN ('completed', 'failed', 'cancelled')
           AND completed_at >= now() - %(window)s * interval '1 second'
           AND started_at >= now() - %(window)s * interval '1 second'
        UNION ALL
        SELECT queue, GREATEST(EXTRACT(EPOCH FROM started_at - run_at), 0)::float8
          FROM pgqueue_jobs
         WHERE status IN ('claimed', 'running')
           AND started_at >= now() - %(window)s * interval '1 second'
       ) AS started
 GROUP BY queue
"""

_FAILED_TOTAL = "SELECT queue, count(*) FROM pgqueue_jobs WHERE status = 'failed' GROUP BY queue"


@dataclass(frozen=True)
class QueueStats:
    """One queue. Waiting times are ``started_at - run_at`` of the jobs started in the
    last ``WINDOW_SECONDS``; ``None`` when no job started then."""

    name: str
    #: Pending jobs that are due (``run_at`` reached): the backlog.
    pending: int = 0
    #: Pending jobs whose ``run_at`` is still ahead (delayed jobs and retries in backoff).
    scheduled: int = 0
    claimed: int = 0
    running: int = 0
    completed_last_minute: int = 0
    failed_last_minute: int = 0
    cancelled_last_minute: int = 0
    started_last_minute: int = 0
    wait_p50_seconds: float | None = None
    wait_p95_seconds: float | None = None
    #: How long the oldest due pending job has been waiting (``None``: none is due).
    oldest_pending_age_seconds: float | None = None
    paused: bool = False
    #: ``max_running`` of the queue's concurrency limit (``None``: unlimited).
    max_running: int | None = None
    #: Every ``failed`` job of the queue; ``None`` unless ``snapshot(failed_total=True)``.
    failed: int | None = None


@dataclass(frozen=True)
class WorkerStats:
    """One row of ``pgqueue_workers`` and the jobs that worker holds now."""

    worker_id: str
    hostname: str
    pid: int
    #: ``None``: every queue (or job type).
    queues: list[str] | None
    job_types: list[str] | None
    concurrency: int
    #: Jobs it holds (claimed or running).
    running: int
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    #: ``"alive"``, ``"stopped"`` (shut down cleanly) or ``"not responding"`` (no
    #: heartbeat for ``PGQUEUE["STALE_AFTER"]``: it died or lost the database).
    state: str

    @property
    def alive(self) -> bool:
        return self.state == "alive"


@dataclass(frozen=True)
class Snapshot:
    """Queues and workers at ``taken_at`` (the database's clock)."""

    taken_at: datetime
    queues: list[QueueStats] = field(default_factory=list)
    workers: list[WorkerStats] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable data; datetimes as ISO 8601 strings."""

        def plain(value: Any) -> Any:
            if isinstance(value, datetime):
                return value.isoformat()
            if isinstance(value, dict):
                return {key: plain(item) for key, item in value.items()}
            if isinstance(value, list):
                return [plain(item) for item in value]
            return value

        return {
            "taken_at": self.taken_at.isoformat(),
            "window_seconds": WINDOW_SECONDS,
            "queues": [plain(asdict(queue)) for queue in self.queues],
            "workers": [
                {**plain(asdict(worker)), "alive": worker.alive} for worker in self.workers
            ],
        }


def snapshot(*, using: str | None = None, failed_total: bool = False) -> Snapshot:
    """Read the queues and workers now, in one transaction (one ``now()``).

    A queue appears when it has pending, claimed or running jobs, jobs finished in the
    last minute, a paused state, a concurrency limit, or a live worker serving it by
    name. ``failed_total=True`` also counts every ``failed`` job: no index serves that
    count, so it reads all finished rows; leave it off for frequent polling.
    """
    alias = conf.jobs_database(using)
    params = {"window": WINDOW_SECONDS}
    queues: dict[str, dict[str, Any]] = defaultdict(dict)
    held_by_worker: dict[str, int] = defaultdict(int)
    failed: dict[str, int] = {}
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute("SELECT now()")
        (taken_at,) = cursor.fetchone()

        cursor.execute(_PENDING)
        for name, due, scheduled, oldest in cursor.fetchall():
            queues[name].update(pending=due, scheduled=scheduled, oldest_pending_age_seconds=oldest)

        cursor.execute(_IN_FLIGHT)
        for name, worker_id, claimed, running in cursor.fetchall():
            row = queues[name]
            row["claimed"] = row.get("claimed", 0) + claimed
            row["running"] = row.get("running", 0) + running
            if worker_id is not None:
                held_by_worker[worker_id] += claimed + running

        cursor.execute(_FINISHED_RECENTLY, params)
        for name, status, count in cursor.fetchall():
            queues[name][f"{status}_last_minute"] = count

        cursor.execute(_WAITS, params)
        for name, started, (p50, p95) in cursor.fetchall():
            queues[name].update(
                started_last_minute=started, wait_p50_seconds=p50, wait_p95_seconds=p95
            )

        if failed_total:
            cursor.execute(_FAILED_TOTAL)
            failed = dict(cursor.fetchall())

        cursor.execute("SELECT name FROM pgqueue_queues WHERE paused_at IS NOT NULL")
        for (name,) in cursor.fetchall():
            queues[name]["paused"] = True

        cursor.execute(
            "SELECT name, max_running FROM pgqueue_limits WHERE scope = %s", [LimitScope.QUEUE]
        )
        for name, max_running in cursor.fetchall():
            queues[name]["max_running"] = max_running

        workers = _workers(alias, taken_at, held_by_worker)

    for worker in workers:
        if worker.state != "stopped":
            for name in worker.queues or ():
                queues.setdefault(name, {})
    if failed_total:
        for name in queues:
            queues[name]["failed"] = failed.get(name, 0)
    return Snapshot(
        taken_at=taken_at,
        queues=[QueueStats(name=name, **queues[name]) for name in sorted(queues)],
        workers=workers,
    )


def _workers(alias: str, now: datetime, held: dict[str, int]) -> list[WorkerStats]:
    stale_after = timedelta(seconds=conf.get_settings().STALE_AFTER)
    workers = []
    for record in WorkerRecord.objects.using(alias).order_by("-heartbeat_at", "worker_id"):
        if record.stopped_at is not None:
            state = "stopped"
        elif now - record.heartbeat_at > stale_after:
            state = "not responding"
        else:
            state = "alive"
        workers.append(
            WorkerStats(
                worker_id=record.worker_id,
                hostname=record.hostname,
                pid=record.pid,
                queues=record.queues,
                job_types=record.job_types,
                concurrency=record.concurrency,
                running=held.get(record.worker_id, 0),
                started_at=record.started_at,
                heartbeat_at=record.heartbeat_at,
                stopped_at=record.stopped_at,
                state=state,
            )
        )
    order = {"alive": 0, "not responding": 1, "stopped": 2}
    workers.sort(key=lambda worker: order[worker.state])  # stable: newest heartbeat first
    return workers
