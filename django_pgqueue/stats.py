"""The read model of the queues and workers: what they are doing now, from the database.

The admin's queue overview, ``manage.py pgqueue_status`` and the Prometheus collector
(``metrics.py``) all format one :class:`Snapshot`; none of them computes a figure of its
own, so they cannot disagree. It needs neither prometheus-client nor rich.

Each figure is defined here, once:

- *Due* and *not yet due* are :mod:`django_pgqueue.due`'s predicates, the claim's own:
  ``pending`` counts the due pending jobs (the backlog), ``scheduled`` the others
  (delayed jobs and retries in backoff). The admin's "Pending" column is their sum.
- Times are the database's: ``taken_at`` is ``statement_timestamp()`` when the snapshot
  starts, and ages and windows are measured from the statement's time, never the web
  server's clock nor ``now()`` (inside a caller's long transaction ``now()`` is that
  transaction's start).
- *Recent* means the last ``WINDOW_SECONDS`` (60): ``*_last_minute`` counts jobs whose
  ``completed_at`` (or ``started_at``) falls in it, and the waiting times are those of
  the jobs started in it. The ``*_last_hour`` and ``*_last_day`` counts come from the
  per-minute rollups (``rollups``: the minutes that ended before the last one workers
  rolled up), and ``failed`` counts every failed job; both are read only with
  ``snapshot(totals=True)``.
- A worker is ``alive`` while it heartbeats, ``not responding`` after
  ``PGQUEUE["STALE_AFTER"]`` seconds without a heartbeat, ``stopped`` once it shut down.

Every query is served by an index or reads a small table, so a snapshot stays cheap on a
table of millions of finished jobs: pending jobs through ``idx_jobs_claimable``, claimed
and running ones through ``idx_jobs_worker``, finished jobs only for the last minute,
through a range of ``idx_jobs_finished``, failed jobs (with totals) through
``idx_jobs_failed``, and the last hour and day from the rollups. Completed and cancelled
jobs are never counted whole: no index could serve it on millions of rows.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, models, transaction
from django.utils.translation import gettext_lazy as _

from . import conf
from .due import DUE, NOT_YET_DUE
from .horizon import HorizonHolder, read_holder
from .liveness import LEADER, LIVE
from .models import Job, LimitScope, RateLimitScope, WorkerRecord
from .rates import Rate
from .schema import FINISHED, IN_FLIGHT, JobStatus, status_in

#: The window of "recent" figures: throughput and waiting times.
WINDOW_SECONDS = 60
#: The longer windows of the ``*_last_hour`` and ``*_last_day`` counts (with the totals).
HOUR_SECONDS = 3600
DAY_SECONDS = 86400

#: The finished states, in the order of the rollups' columns.
_FINISHED_NAMES = ("completed", "failed", "cancelled")

# The database's time at each statement (see the module docstring).
_NOW = "statement_timestamp()"

# Pending jobs are read from two partial indexes: the claimable ones, and the ones held
# back by a per-key limit (which always have a key). The claimable ones' ``held`` is the
# constant its index's predicate implies, so that they are read from the index alone
# (``held`` is not one of its columns): reading their rows made the plan a scan of the
# whole table at 2,000,000 jobs.
_PENDING = f"""
SELECT queue,
       count(*) FILTER (WHERE {DUE}),
       count(*) FILTER (WHERE {NOT_YET_DUE}),
       count(*) FILTER (WHERE held),
       EXTRACT(EPOCH FROM {_NOW} - min(run_at) FILTER (WHERE {DUE}))::float8
  FROM (
    SELECT queue, run_at, false AS held FROM pgqueue_jobs
     WHERE {status_in(JobStatus.PENDING)} AND NOT held
    UNION ALL
    SELECT queue, run_at, held FROM pgqueue_jobs
     WHERE {status_in(JobStatus.PENDING)} AND held AND concurrency_key IS NOT NULL
  ) AS pending
 GROUP BY queue
"""

# Waiting jobs have a counter each (pgqueue_job_waits, a small table: waiting jobs and
# those cancelled while waiting); their status has no index of its own.
_WAITING = f"""
SELECT jobs.queue, count(*)
  FROM pgqueue_job_waits AS waits
  JOIN pgqueue_jobs AS jobs ON jobs.id = waits.job_id
 WHERE {status_in(JobStatus.WAITING, "jobs.status")}
 GROUP BY jobs.queue
"""

_IN_FLIGHT = f"""
SELECT queue, worker_id,
       count(*) FILTER (WHERE {status_in(JobStatus.CLAIMED)}),
       count(*) FILTER (WHERE {status_in(JobStatus.RUNNING)})
  FROM pgqueue_jobs
 WHERE {status_in(IN_FLIGHT)}
 GROUP BY queue, worker_id
"""

_FINISHED_RECENTLY = f"""
SELECT queue, status, count(*)
  FROM pgqueue_jobs
 WHERE {status_in(FINISHED)}
   AND completed_at >= {_NOW} - %(window)s * interval '1 second'
 GROUP BY queue, status
"""

# A job that started in the window is either still in flight or finished in it (it
# cannot finish before it starts), so both halves stay on a partial index.
_WAITS = f"""
SELECT queue, count(*),
       percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY wait)
  FROM (
        SELECT queue, GREATEST(EXTRACT(EPOCH FROM started_at - run_at), 0)::float8 AS wait
          FROM pgqueue_jobs
         WHERE {status_in(FINISHED)}
           AND completed_at >= {_NOW} - %(window)s * interval '1 second'
           AND started_at >= {_NOW} - %(window)s * interval '1 second'
        UNION ALL
        SELECT queue, GREATEST(EXTRACT(EPOCH FROM started_at - run_at), 0)::float8
          FROM pgqueue_jobs
         WHERE {status_in(IN_FLIGHT)}
           AND started_at >= {_NOW} - %(window)s * interval '1 second'
       ) AS started
 GROUP BY queue
"""

# Every failed row, through the partial index idx_jobs_failed: failed jobs wait to be
# handled, so they are few next to the completed ones.
_FAILED_TOTALS = f"""
SELECT queue, count(*) FROM pgqueue_jobs WHERE {status_in(JobStatus.FAILED)} GROUP BY queue
"""

# The last day's rollups (pgqueue_minute_jobs: a row per minute, queue and job type).
_ROLLED_UP = f"""
SELECT queue,
       sum(completed) FILTER (WHERE minute >= {_NOW} - %(hour)s * interval '1 second'),
       sum(failed) FILTER (WHERE minute >= {_NOW} - %(hour)s * interval '1 second'),
       sum(cancelled) FILTER (WHERE minute >= {_NOW} - %(hour)s * interval '1 second'),
       sum(completed), sum(failed), sum(cancelled)
  FROM pgqueue_minute_jobs
 WHERE minute >= {_NOW} - %(day)s * interval '1 second'
 GROUP BY queue
"""


class WorkerState(models.TextChoices):
    """What a worker is doing, judged from its row of ``pgqueue_workers``."""

    ALIVE = "alive", _("alive")
    #: No heartbeat for ``PGQUEUE["STALE_AFTER"]``: it died or lost the database.
    NOT_RESPONDING = "not responding", _("not responding")
    #: Shut down cleanly.
    STOPPED = "stopped", _("stopped")


@dataclass(frozen=True)
class QueueStats:
    """One queue. Waiting times are ``started_at - run_at`` of the jobs started in the
    last ``WINDOW_SECONDS``; ``None`` when no job started then. Fields that are ``None``
    unless ``snapshot(totals=True)`` say so."""

    name: str
    #: Jobs waiting for the jobs they depend on ([workflows](../how-to/workflows.md)).
    waiting: int = 0
    #: Pending jobs that are due (``run_at`` reached): the backlog.
    pending: int = 0
    #: Pending jobs whose ``run_at`` is still ahead (delayed jobs and retries in backoff).
    scheduled: int = 0
    #: Of the pending jobs, those held back by their key's
    #: [per-key limit](../how-to/per-key-concurrency.md) (``Job.held``).
    held: int = 0
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
    #: When it was paused (``None``: not paused).
    paused_at: datetime | None = None
    #: ``max_running`` of the queue's concurrency limit (``None``: unlimited).
    max_running: int | None = None
    #: The queue's rate limit enforced, as jobs per period (``"100/s"``; ``None``: none).
    rate_limit: str | None = None
    #: Every ``failed`` job of the queue (totals).
    failed: int | None = None
    #: Jobs finished in the last ``HOUR_SECONDS``, by final status, from the rollups
    #: (totals).
    completed_last_hour: int | None = None
    failed_last_hour: int | None = None
    cancelled_last_hour: int | None = None
    #: The same over the last ``DAY_SECONDS`` (totals).
    completed_last_day: int | None = None
    failed_last_day: int | None = None
    cancelled_last_day: int | None = None

    def finished_last_minute(self, status: JobStatus) -> int:
        """Jobs that reached the finished ``status`` in the last ``WINDOW_SECONDS``."""
        return int(getattr(self, f"{JobStatus(status).value}_last_minute"))

    def jobs_by_status(self) -> dict[JobStatus, int | None]:
        """Jobs in each state counted now, due or not: the active states, and failed jobs
        (``None`` without totals). Completed and cancelled jobs are not counted whole:
        see the ``*_last_hour`` and ``*_last_day`` counts."""
        return {
            JobStatus.WAITING: self.waiting,
            JobStatus.PENDING: self.pending + self.scheduled,
            JobStatus.CLAIMED: self.claimed,
            JobStatus.RUNNING: self.running,
            JobStatus.FAILED: self.failed,
        }

    @property
    def has_jobs(self) -> bool:
        """Whether any figure counts a job (with totals: a failed one, or one finished in
        the last day)."""
        return any(self.jobs_by_status().values()) or any(
            getattr(self, f"{status.value}_{window}")
            for status in FINISHED
            for window in ("last_minute", "last_day")
        )


#: The fields of :class:`QueueStats` that count jobs: they add up over queues.
_COUNTS = (
    "waiting",
    "pending",
    "scheduled",
    "held",
    "claimed",
    "running",
    "completed_last_minute",
    "failed_last_minute",
    "cancelled_last_minute",
    "started_last_minute",
    "failed",
    "completed_last_hour",
    "failed_last_hour",
    "cancelled_last_hour",
    "completed_last_day",
    "failed_last_day",
    "cancelled_last_day",
)


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
    #: A :class:`WorkerState`: ``"alive"``, ``"not responding"`` or ``"stopped"``.
    state: WorkerState
    #: Whether it leads: the live worker with the lowest id, which alone recovers,
    #: prunes, writes the rollups, enqueues periodic jobs and wakes idle workers.
    leads: bool = False

    @property
    def alive(self) -> bool:
        return self.state == WorkerState.ALIVE


@dataclass(frozen=True)
class Snapshot:
    """Queues and workers at ``taken_at`` (the database's clock)."""

    taken_at: datetime
    queues: list[QueueStats] = field(default_factory=list)
    workers: list[WorkerStats] = field(default_factory=list)
    #: The session holding the jobs database's xmin horizon furthest back, if any
    #: (``horizon.py``): vacuum cannot remove dead job rows younger than its snapshot.
    horizon: HorizonHolder | None = None

    def all_queues(self) -> QueueStats:
        """The sum over every queue (named ``""``): counts add up, the oldest due job is
        the oldest of all, and waiting times, which do not add up, are ``None``."""
        total: dict[str, Any] = {}
        for name in _COUNTS:
            known = [getattr(queue, name) for queue in self.queues]
            if any(value is not None for value in known):
                total[name] = sum(value or 0 for value in known)
        ages = [queue.oldest_pending_age_seconds for queue in self.queues]
        total["oldest_pending_age_seconds"] = max(
            (age for age in ages if age is not None), default=None
        )
        return QueueStats(name="", **total)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable data; datetimes as ISO 8601 strings."""

        def plain(value: Any) -> Any:
            if isinstance(value, datetime):
                return value.isoformat()
            if isinstance(value, dict):
                return {key: plain(item) for key, item in value.items()}
            if isinstance(value, list):
                return [plain(item) for item in value]
            if isinstance(value, str):
                return str(value)  # a WorkerState is a str, dumped as its value
            return value

        return {
            "taken_at": self.taken_at.isoformat(),
            "window_seconds": WINDOW_SECONDS,
            "queues": [plain(asdict(queue)) for queue in self.queues],
            "workers": [
                {**plain(asdict(worker)), "alive": worker.alive} for worker in self.workers
            ],
            "horizon": None
            if self.horizon is None
            else {**asdict(self.horizon), "past_threshold": self.horizon.past_threshold()},
        }


def snapshot(*, using: str | None = None, totals: bool = False) -> Snapshot:
    """Read the queues and workers now, in one transaction.

    A queue appears when it has waiting, pending, claimed or running jobs, jobs finished in the
    last minute, a paused state, a concurrency or rate limit, or a live worker serving it by
    name; with ``totals=True``, also when it has a failed job or jobs finished in the
    last day. ``totals=True`` also counts every failed job (reading the failed rows, through
    their index) and the jobs finished in the last hour and day (from the rollups).
    """
    alias = conf.jobs_database(using)
    params = {"window": WINDOW_SECONDS, "hour": HOUR_SECONDS, "day": DAY_SECONDS}
    queues: dict[str, dict[str, Any]] = defaultdict(dict)
    held_by_worker: dict[str, int] = defaultdict(int)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {_NOW}")
        (taken_at,) = cursor.fetchone()

        cursor.execute(_PENDING)
        for name, due, scheduled, held, oldest in cursor.fetchall():
            queues[name].update(
                pending=due, scheduled=scheduled, held=held, oldest_pending_age_seconds=oldest
            )

        cursor.execute(_WAITING)
        for name, waiting in cursor.fetchall():
            queues[name]["waiting"] = waiting

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

        finished_totals: dict[str, dict[str, int]] = defaultdict(dict)
        if totals:
            cursor.execute(_FAILED_TOTALS)
            for name, failed in cursor.fetchall():
                finished_totals[name]["failed"] = failed
            cursor.execute(_ROLLED_UP, params)
            for name, *counts in cursor.fetchall():
                keys = [f"{s}_{w}" for w in ("last_hour", "last_day") for s in _FINISHED_NAMES]
                finished_totals[name].update(zip(keys, (int(c or 0) for c in counts), strict=True))

        cursor.execute("SELECT name, paused_at FROM pgqueue_queues WHERE paused_at IS NOT NULL")
        for name, paused_at in cursor.fetchall():
            queues[name].update(paused=True, paused_at=paused_at)

        cursor.execute(
            "SELECT name, max_running FROM pgqueue_limits WHERE scope = %s", [LimitScope.QUEUE]
        )
        for name, max_running in cursor.fetchall():
            queues[name]["max_running"] = max_running

        cursor.execute(
            "SELECT name, max_jobs, period_seconds FROM pgqueue_rate_limits WHERE scope = %s",
            [RateLimitScope.QUEUE],
        )
        for name, jobs, seconds in cursor.fetchall():
            queues[name]["rate_limit"] = str(Rate(jobs, seconds))

        workers = _workers(alias, cursor, held_by_worker)
        holder = read_holder(cursor)

    for worker in workers:
        if worker.state != WorkerState.STOPPED:
            for name in worker.queues or ():
                queues.setdefault(name, {})
    if totals:
        zeros = {"failed": 0} | {
            f"{name}_{window}": 0
            for name in _FINISHED_NAMES
            for window in ("last_hour", "last_day")
        }
        for name in {*queues, *finished_totals}:
            queues[name].update(zeros | finished_totals.get(name, {}))
    return Snapshot(
        taken_at=taken_at,
        queues=[QueueStats(name=name, **queues[name]) for name in sorted(queues)],
        workers=workers,
        horizon=holder,
    )


def worker(worker_id: str, *, using: str | None = None) -> tuple[WorkerStats, datetime] | None:
    """One worker as ``snapshot()`` reads it, and the database's time of the reading;
    ``None`` for a worker that has no row (never started, or forgotten a day after it
    was last seen)."""
    alias = conf.jobs_database(using)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {_NOW}")
        (taken_at,) = cursor.fetchone()
        record = WorkerRecord.objects.using(alias).filter(worker_id=worker_id).first()
        if record is None:
            return None
        held = Job.objects.using(alias).filter(worker_id=worker_id, status__in=IN_FLIGHT).count()
        live, leads = _liveness(cursor).get(worker_id, (False, False))
    return _worker_stats(record, held, live, leads), taken_at


def _liveness(cursor: Any) -> dict[str, tuple[bool, bool]]:
    """Whether each worker is live and whether it leads (liveness.py), by the clock of
    the transaction of ``cursor``."""
    cursor.execute(
        f"SELECT worker_id, {LIVE}, worker_id = {LEADER} FROM pgqueue_workers",
        {"stale_after": conf.get_settings().STALE_AFTER},
    )
    return {worker_id: (live, bool(leads)) for worker_id, live, leads in cursor.fetchall()}


def _workers(alias: str, cursor: Any, held: dict[str, int]) -> list[WorkerStats]:
    liveness = _liveness(cursor)
    workers = [
        _worker_stats(
            record,
            held.get(record.worker_id, 0),
            *liveness.get(record.worker_id, (False, False)),
        )
        for record in WorkerRecord.objects.using(alias).order_by("-heartbeat_at", "worker_id")
    ]
    order = list(WorkerState)
    workers.sort(key=lambda worker: order.index(WorkerState(worker.state)))  # stable
    return workers


def _worker_stats(record: WorkerRecord, held: int, live: bool, leads: bool) -> WorkerStats:
    """The worker of ``record``, holding ``held`` jobs, live or not and leading or not."""
    if record.stopped_at is not None:
        state = WorkerState.STOPPED
    elif not live:
        state = WorkerState.NOT_RESPONDING
    else:
        state = WorkerState.ALIVE
    return WorkerStats(
        worker_id=record.worker_id,
        hostname=record.hostname,
        pid=record.pid,
        queues=record.queues,
        job_types=record.job_types,
        concurrency=record.concurrency,
        running=held,
        started_at=record.started_at,
        heartbeat_at=record.heartbeat_at,
        stopped_at=record.stopped_at,
        state=state,
        leads=leads,
    )
