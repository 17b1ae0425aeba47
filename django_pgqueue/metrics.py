"""Prometheus metrics: queue state read from the database at scrape time, and what a
worker process ran.

Needs prometheus-client (``pip install 'django-pgqueue[metrics]'``). Two ways to expose:

- ``metrics_view``: a Django view serving the queue metrics; mount it in your URLconf
  (and keep it away from the public internet, see the monitoring how-to).
- ``start_metrics_server`` (``pgqueue_worker --metrics-port``): an HTTP server in the
  worker process serving the queue metrics and the worker's own counters.

Everything is registered in private registries, never prometheus-client's global one,
so these metrics cannot clash with others the project exports.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any
from wsgiref.simple_server import WSGIServer

from django.db import DatabaseError, connections
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from . import conf, signals, stats
from .exceptions import MissingExtraError
from .models import Job
from .schema import FINISHED, JobStatus

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised by a test in a fresh import
    raise MissingExtraError("django_pgqueue.metrics", "prometheus-client", "metrics") from exc

logger = logging.getLogger("django_pgqueue.metrics")

#: Buckets of the worker's histograms, in seconds: jobs take milliseconds to an hour.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: The ``status`` label of due-later pending jobs in ``pgqueue_jobs`` (not a job state).
SCHEDULED = "scheduled"
#: The quantiles of ``pgqueue_job_wait_seconds``.
QUANTILES = (("0.5", "wait_p50_seconds"), ("0.95", "wait_p95_seconds"))


class QueueCollector(Collector):
    """Reads :func:`django_pgqueue.stats.snapshot` at each scrape and exposes it as gauges.

    ``close_connection=True`` closes this thread's database connection after each
    scrape: for HTTP servers that serve each scrape from a new thread.
    """

    def __init__(self, *, using: str | None = None, close_connection: bool = False) -> None:
        self.using = using
        self.close_connection = close_connection

    def collect(self) -> Iterator[Metric]:
        alias = conf.jobs_database(self.using)
        up = GaugeMetricFamily(
            "pgqueue_stats_up", "1 if the queue statistics were read from the database, else 0"
        )
        try:
            snapshot = stats.snapshot(using=alias)
        except DatabaseError as exc:
            logger.warning("could not read queue statistics for metrics: %s", exc)
            if not connections[alias].in_atomic_block:  # reconnect at the next scrape
                connections[alias].close()
            up.add_metric([], 0)
            yield up
            return
        finally:
            if self.close_connection:
                connections[alias].close()
        up.add_metric([], 1)
        yield up
        yield from _queue_metrics(snapshot)


def _queue_metrics(snapshot: stats.Snapshot) -> Iterator[Metric]:
    jobs = GaugeMetricFamily(
        "pgqueue_jobs",
        "Jobs waiting or held, by queue and status (scheduled: pending, not due yet)",
        labels=["queue", "status"],
    )
    finished = GaugeMetricFamily(
        "pgqueue_jobs_finished_last_minute",
        "Jobs that finished in the last minute, by queue and final status",
        labels=["queue", "status"],
    )
    started = GaugeMetricFamily(
        "pgqueue_jobs_started_last_minute",
        "Jobs started in the last minute, by queue",
        labels=["queue"],
    )
    wait = GaugeMetricFamily(
        "pgqueue_job_wait_seconds",
        "Time from run_at to start of the jobs started in the last minute (quantiles)",
        labels=["queue", "quantile"],
    )
    oldest = GaugeMetricFamily(
        "pgqueue_oldest_pending_age_seconds",
        "How long the oldest due pending job has waited (0: none is due)",
        labels=["queue"],
    )
    paused = GaugeMetricFamily(
        "pgqueue_queue_paused", "1 if the queue is paused, else 0", labels=["queue"]
    )
    limit = GaugeMetricFamily(
        "pgqueue_queue_concurrency_limit",
        "Most jobs of the queue claimed or running at once (only limited queues)",
        labels=["queue"],
    )
    for queue in snapshot.queues:
        held = (
            (JobStatus.WAITING.value, queue.waiting),
            (JobStatus.PENDING.value, queue.pending),
            (SCHEDULED, queue.scheduled),
            (JobStatus.CLAIMED.value, queue.claimed),
            (JobStatus.RUNNING.value, queue.running),
        )
        for label, count in held:
            jobs.add_metric([queue.name, label], count)
        for status in FINISHED:
            finished.add_metric([queue.name, status.value], queue.finished_last_minute(status))
        started.add_metric([queue.name], queue.started_last_minute)
        for quantile, attribute in QUANTILES:
            value = getattr(queue, attribute)
            if value is not None:
                wait.add_metric([queue.name, quantile], value)
        oldest.add_metric([queue.name], queue.oldest_pending_age_seconds or 0.0)
        paused.add_metric([queue.name], 1 if queue.paused else 0)
        if queue.max_running is not None:
            limit.add_metric([queue.name], queue.max_running)
    yield from (jobs, finished, started, wait, oldest, paused, limit)

    states = Tally(worker.state for worker in snapshot.workers)
    alive = GaugeMetricFamily("pgqueue_workers_alive", "Workers heartbeating now")
    alive.add_metric([], states[stats.WorkerState.ALIVE])
    lost = GaugeMetricFamily(
        "pgqueue_workers_not_responding",
        "Workers that stopped heartbeating without shutting down (died, or lost the database)",
    )
    lost.add_metric([], states[stats.WorkerState.NOT_RESPONDING])
    yield from (alive, lost)

    holder = snapshot.horizon
    horizon = GaugeMetricFamily(
        "pgqueue_xmin_horizon_age_seconds",
        "How long the oldest transaction or snapshot holding back vacuum in the jobs "
        "database has been open (0: none)",
    )
    horizon.add_metric([], (holder.age_seconds or 0.0) if holder is not None else 0.0)
    yield horizon


class WorkerMetrics:
    """Counters and histograms of the jobs this process runs, fed by the worker signals.

    Call :meth:`connect` to start counting and :meth:`disconnect` to stop. Outcomes:
    ``completed``, ``failed`` (no attempt left, or ``FailJob``) and ``retried``;
    cancelled jobs are not counted.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.jobs = Counter(
            "pgqueue_worker_jobs_total",
            "Jobs this worker ran, by queue, job type and outcome",
            ["queue", "job_type", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "pgqueue_worker_job_duration_seconds",
            "How long handlers ran in this worker",
            ["queue"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.wait = Histogram(
            "pgqueue_worker_job_wait_seconds",
            "Time from run_at to start of the jobs this worker started",
            ["queue"],
            buckets=BUCKETS,
            registry=registry,
        )
        self._uid = f"django_pgqueue.metrics.{id(self)}"

    def connect(self) -> None:
        """Start counting the jobs run by workers in this process."""
        signals.job_started.connect(self._started, weak=False, dispatch_uid=self._uid)
        signals.job_completed.connect(self._completed, weak=False, dispatch_uid=self._uid)
        signals.job_failed.connect(self._failed, weak=False, dispatch_uid=self._uid)

    def disconnect(self) -> None:
        for signal in (signals.job_started, signals.job_completed, signals.job_failed):
            signal.disconnect(dispatch_uid=self._uid)

    def _started(self, *, job: Job, **kwargs: Any) -> None:
        # Read back by _finished on the same instance; Job declares no such field.
        job._pgqueue_metrics_started = time.monotonic()  # type: ignore[attr-defined]
        if job.started_at is not None and job.run_at is not None:
            waited = (job.started_at - job.run_at).total_seconds()
            self.wait.labels(job.queue).observe(max(waited, 0.0))

    def _completed(self, *, job: Job, **kwargs: Any) -> None:
        self._finished(job, JobStatus.COMPLETED.value)

    def _failed(self, *, job: Job, will_retry: bool = False, **kwargs: Any) -> None:
        self._finished(job, "retried" if will_retry else JobStatus.FAILED.value)

    def _finished(self, job: Job, outcome: str) -> None:
        self.jobs.labels(job.queue, job.job_type, outcome).inc()
        started = getattr(job, "_pgqueue_metrics_started", None)
        if started is not None:
            self.duration.labels(job.queue).observe(time.monotonic() - started)


@cache
def view_registry() -> CollectorRegistry:
    """The registry ``metrics_view`` serves: the queue metrics of ``PGQUEUE["DATABASE"]``."""
    registry = CollectorRegistry()
    registry.register(QueueCollector())
    return registry


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the queue metrics in the Prometheus (or OpenMetrics) text format.

    Not mounted by the app: add it to your URLconf behind the protection you choose.
    """
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(view_registry()), content_type=content_type)


@dataclass
class MetricsServer:
    """A running metrics HTTP server; :meth:`stop` shuts it down."""

    server: WSGIServer
    thread: threading.Thread
    registry: CollectorRegistry
    worker_metrics: WorkerMetrics

    @property
    def port(self) -> int:
        return self.server.server_port

    def stop(self) -> None:
        """Stop counting jobs and serving; returns once the port is released."""
        self.worker_metrics.disconnect()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_metrics_server(
    port: int, addr: str = "0.0.0.0", *, using: str | None = None
) -> MetricsServer:
    """Serve the queue metrics and this process's worker metrics over HTTP on
    ``addr:port`` (any path), from a daemon thread.

    ``port=0`` takes a free port (see ``MetricsServer.port``). Raises ``OSError`` when
    the address cannot be bound (for example, the port is in use).
    """
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"the metrics port must be an integer from 0 to 65535, got {port!r}")
    registry = CollectorRegistry()
    registry.register(QueueCollector(using=using, close_connection=True))
    worker_metrics = WorkerMetrics(registry)
    server, thread = start_http_server(port, addr, registry=registry)
    worker_metrics.connect()
    logger.info("serving metrics on http://%s:%d/metrics", addr, server.server_port)
    return MetricsServer(server, thread, registry, worker_metrics)
