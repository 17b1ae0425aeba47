"""Harness for RQ on Redis (run in its own virtualenv by bench/run.py).

bench/run.py starts a ``redis-server`` for it and passes its URL in
``BENCH_REDIS_URL``; ``--dsn`` (a PostgreSQL database, as for every harness) is not used.
Jobs are enqueued by the dotted path of their function, as RQ's documentation shows,
with its defaults (results kept for 500 s). A worker process runs one job at a time,
so 4 slots are 4 worker processes, each ``work(burst=True)`` for a drain and ``work()``
for the latency probe. A drain is timed to the latest ``ended_at`` of its jobs, read
once every job is in the finished registry (polled), and the workers are then stopped:
a burst worker's own exit may wait up to a minute for its command channel's thread,
no cost of the queue. Two layouts: RQ's default
``Worker``, which forks a work horse for every job (a job that crashes or leaks cannot
take the worker along), and ``SimpleWorker``, which runs jobs in the worker process.
W6 enqueues with ``Retry(max=1)`` (no interval: a failed job is queued again at once).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC
from typing import Any

from redis import Redis
from rq import Queue, Retry, SimpleWorker, Worker, get_current_job
from rq.job import Job

from bench import common

MODULE = "bench.systems.harness_rq"
QUEUE = "bench"
NOOP = f"{MODULE}.noop"
CPU_FLAKY = f"{MODULE}.cpu_flaky"
#: The worker class and the number of worker processes of each layout.
LAYOUTS = {"fork-4": (Worker, 4), "simple-4": (SimpleWorker, 4)}
#: Seconds between two looks at the finished registry while a drain runs.
POLL_SECONDS = 0.005

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def noop(i: int, probe: bool = False) -> None:
    if probe:
        common.probe(i)


def cpu_flaky(i: int) -> None:
    common.burn_cpu()
    job = get_current_job()
    assert job is not None
    if common.fails_first_attempt(i) and job.retries_left:
        raise common.FlakyJobError(f"job {i} fails its first attempt")


_connection: Redis | None = None


def _redis() -> Redis:
    global _connection
    if _connection is None:
        _connection = Redis.from_url(REDIS_URL)
    return _connection


def _queue() -> Queue:
    return Queue(QUEUE, connection=_redis())


def setup(args: Any) -> dict[str, Any]:
    _redis().ping()
    return {"ok": True}


def enqueue_single(args: Any) -> dict[str, Any]:
    _redis().flushdb()
    queue = _queue()
    began = time.perf_counter()
    for i in range(args.jobs):
        queue.enqueue(NOOP, i)
    return common.rate(args.jobs, time.perf_counter() - began)


def _enqueue_many(queue: Queue, function: str, jobs: int, chunk: int, **options: Any) -> None:
    """``enqueue_many`` (one Redis pipeline a call) in chunks of ``chunk``."""
    for start in range(0, jobs, chunk):
        queue.enqueue_many(
            [
                Queue.prepare_data(function, (i,), **options)
                for i in range(start, min(start + chunk, jobs))
            ]
        )


def enqueue_bulk(args: Any) -> dict[str, Any]:
    _redis().flushdb()
    queue = _queue()
    began = time.perf_counter()
    _enqueue_many(queue, NOOP, args.jobs, args.chunk)
    return common.rate(args.jobs, time.perf_counter() - began)


def _workers(layout: str, burst: bool, env: dict[str, str] | None = None) -> common.WorkerGroup:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose from {sorted(LAYOUTS)}")
    _, processes = LAYOUTS[layout]
    command = common.worker_command(MODULE, "-", 1, burst)
    env = {**os.environ, **(env or {}), "BENCH_RQ_LAYOUT": layout}
    return common.WorkerGroup.start([command] * processes, env=env)


def drain(args: Any) -> dict[str, Any]:
    if args.kind not in ("noop", "cpu_flaky"):
        raise ValueError(f"no {args.kind} drain for RQ")
    _redis().flushdb()
    queue = _queue()
    if args.kind == "noop":
        _enqueue_many(queue, NOOP, args.jobs, 5000)
    else:
        _enqueue_many(queue, CPU_FLAKY, args.jobs, 5000, retry=Retry(max=1))
    group = _workers(args.layout, burst=True)
    try:
        start = time.time()
        group.go()
        while queue.finished_job_registry.count < args.jobs:
            if all(process.poll() is not None for process in group.processes):
                finished = queue.finished_job_registry.count
                raise RuntimeError(f"the workers exited with {finished} of {args.jobs} finished")
            time.sleep(POLL_SECONDS)
        exited = time.time()
    finally:
        group.kill()
    return common.drain_rate(args.jobs, start, _last_end(queue), exited)


def _last_end(queue: Queue) -> float:
    """The latest ``ended_at`` of the finished jobs (epoch seconds)."""
    ids = queue.finished_job_registry.get_job_ids()
    ends = [job.ended_at for job in Job.fetch_many(ids, connection=_redis()) if job]
    latest = max(end for end in ends if end is not None)
    return (latest if latest.tzinfo else latest.replace(tzinfo=UTC)).timestamp()


def latency(args: Any) -> dict[str, Any]:
    _redis().flushdb()
    queue = _queue()
    receiver = common.ProbeReceiver()
    group = _workers(args.layout, burst=False, env={"BENCH_PROBE_PORT": str(receiver.port)})
    try:
        group.go()
        time.sleep(1.0)  # let the workers settle into their blocking wait
        samples = common.latency_samples(
            lambda i: queue.enqueue(NOOP, i, True), receiver, args.samples
        )
    finally:
        group.kill()  # as after a drain: RQ's exit is no measure of the queue
        receiver.close()
    return {"samples": samples}


def worker(args: Any) -> None:
    worker_class, _ = LAYOUTS[os.environ.get("BENCH_RQ_LAYOUT", "fork-4")]
    made: list[Any] = []

    def make() -> None:
        made.append(worker_class([_queue()], connection=_redis()))

    common.worker_entry(lambda: made[0].work(burst=args.burst, logging_level="CRITICAL"), make)


COMMANDS = {
    "setup": setup,
    "enqueue-single": enqueue_single,
    "enqueue-bulk": enqueue_bulk,
    "drain": drain,
    "latency": latency,
}


def main() -> None:
    common.harness_main(__doc__.splitlines()[0], COMMANDS, worker)


if __name__ == "__main__":
    sys.exit(main())
