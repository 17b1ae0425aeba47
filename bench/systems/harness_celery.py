"""Harness for Celery on Redis (run in its own virtualenv by bench/run.py).

bench/run.py starts a ``redis-server`` for it and passes its URL in
``BENCH_REDIS_URL``; ``--dsn`` (a PostgreSQL database, as for every harness) is not used.
The broker and the result backend are that Redis. Settings changed from Celery's
defaults: ``task_acks_late`` (a task is acknowledged once it ran, so a worker that dies
loses nothing, as the PostgreSQL queues promise), a prefetch of ``PREFETCH`` tasks per
worker process, results ignored except where a chord needs them. A worker is
``celery worker`` through ``app.worker_main`` with ``--without-heartbeat --without-gossip
--without-mingle`` (one node), its pool chosen by the layout: ``prefork-4`` (Celery's
default pool, 4 child processes) or ``threads-4``; W7's I/O-bound tasks run in
``threads-500`` or ``gevent-500`` (Celery's pools for I/O; a gevent worker monkey-patches
the standard library first, as ``celery worker -P gevent`` does, so ``time.sleep``
yields to the other greenlets).

Celery has no "stop when the queue is empty": a drain is over when the queue and the
unacknowledged set are both empty (with late acknowledgement a task leaves the latter
once it ran), seen on two polls in a row; the workers are then stopped. A worker says
``ready`` from the ``worker_ready`` signal and waits there for ``go``: its consumer has
started (pool, connections) but fetches nothing before the timed drain begins.
"""

from __future__ import annotations

import os

if os.environ.get("BENCH_CELERY_POOL") == "gevent":  # before anything opens a socket
    from gevent import monkey

    monkey.patch_all()

import itertools
import sys
import time
from typing import Any

from celery import Celery, chain, chord, group
from celery.signals import worker_ready

from bench import common

MODULE = "bench.systems.harness_celery"
QUEUE = "celery"
#: Tasks a worker process reserves ahead (``worker_prefetch_multiplier`` is per slot):
#: 100 in all, as measured best by hand for no-op tasks (issue 28).
PREFETCH = 100
#: Seconds between two looks at the queue while waiting for a drain to end.
POLL_SECONDS = 0.002
#: Where the chord's callback writes the time it ran (seconds since the epoch).
CALLBACK_DONE = "bench:callback_done"
#: Redis connections of a gevent worker (see below).
GEVENT_CONNECTIONS = 1000
#: The pool and the slots of each layout.
POOLS = {
    "prefork-4": ("prefork", 4),
    "threads-4": ("threads", 4),
    "threads-500": ("threads", 500),
    "gevent-500": ("gevent", 500),
}

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("bench", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=PREFETCH // 4,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_redirect_stdouts=False,  # the harness reads "ready" on the worker's stdout
)
if os.environ.get("BENCH_CELERY_POOL") == "gevent":
    # Each greenlet acknowledges its task on a connection of the broker's pool, 10 by
    # default: hundreds at once fail with "Too many connections" and are lost to Redis.
    app.conf.broker_transport_options = {"max_connections": GEVENT_CONNECTIONS}


@app.task(name="bench.noop")
def noop(i: int, probe: bool = False) -> None:
    if probe:
        common.probe(i)


@app.task(name="bench.member", ignore_result=False)
def member(i: int) -> int:
    """A chord's member: a no-op whose result the chord collects."""
    return i


@app.task(name="bench.callback")
def callback(results: list[int]) -> None:
    """A chord's callback: note when it ran."""
    _redis().set(CALLBACK_DONE, repr(time.time()))


@app.task(name="bench.cpu_flaky", bind=True, max_retries=2)
def cpu_flaky(self: Any, i: int) -> None:
    common.burn_cpu()
    if self.request.retries == 0 and common.fails_first_attempt(i):
        raise self.retry(countdown=0)


@app.task(name="bench.io_wait")
def io_wait(i: int) -> None:
    time.sleep(common.IO_WAIT_SECONDS)  # a greenlet switch under the gevent pool


_client: Any = None


def _redis() -> Any:
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(REDIS_URL)
    return _client


def _flush() -> None:
    _redis().flushdb()


def setup(args: Any) -> dict[str, Any]:
    _redis().ping()
    return {"ok": True}


def _send_each(task: Any, numbers: range, **options: Any) -> None:
    """One ``apply_async`` per task, on one producer connection."""
    with app.producer_or_acquire() as producer:
        for i in numbers:
            task.apply_async((i,), producer=producer, **options)


def enqueue_single(args: Any) -> dict[str, Any]:
    _flush()
    began = time.perf_counter()
    for i in range(args.jobs):
        noop.delay(i)
    return common.rate(args.jobs, time.perf_counter() - began)


def enqueue_bulk(args: Any) -> dict[str, Any]:
    """Celery has no bulk enqueue: a loop of ``apply_async`` on one connection."""
    _flush()
    began = time.perf_counter()
    _send_each(noop, range(args.jobs))
    return common.rate(args.jobs, time.perf_counter() - began)


def _drained() -> bool:
    client = _redis()
    return client.llen(QUEUE) == 0 and client.hlen("unacked") == 0


def _wait_callback(timeout: float = common.DRAIN_TIMEOUT) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = _redis().get(CALLBACK_DONE)
        if done is not None:
            return float(done)
        time.sleep(POLL_SECONDS)
    raise RuntimeError("the chord's callback did not run")


def _workers(layout: str, env: dict[str, str] | None = None) -> common.WorkerGroup:
    if layout not in POOLS:
        raise ValueError(f"unknown layout {layout!r}; choose from {sorted(POOLS)}")
    pool, slots = POOLS[layout]
    command = common.module_command(MODULE, "--dsn", "-", "worker", "--slots", str(slots))
    env = {**os.environ, **(env or {}), "BENCH_CELERY_POOL": pool}
    return common.WorkerGroup.start([command], env=env)


def drain(args: Any) -> dict[str, Any]:
    if args.kind not in ("noop", "cpu_flaky", "chord", "io_wait"):
        raise ValueError(f"no {args.kind} drain for Celery")
    _flush()
    enqueue_seconds = 0.0
    if args.kind == "chord":
        began = time.perf_counter()
        chord(group(member.s(i) for i in range(args.jobs - 1)), callback.s()).apply_async()
        enqueue_seconds = time.perf_counter() - began
    else:
        task = {"noop": noop, "cpu_flaky": cpu_flaky, "io_wait": io_wait}[args.kind]
        _send_each(task, range(args.jobs))
    group_ = _workers(args.layout)
    try:
        start = time.time()
        group_.go()
        last = (
            _wait_callback()
            if args.kind == "chord"
            else common.first_seen_drained(_drained, POLL_SECONDS)
        )
    finally:
        group_.terminate()
    # A chord is timed from the enqueue, as for django-pgqueue.
    return common.drain_rate(args.jobs, start - enqueue_seconds, last, time.time())


def latency(args: Any) -> dict[str, Any]:
    _flush()
    receiver = common.ProbeReceiver()
    group_ = _workers(args.layout, {"BENCH_PROBE_PORT": str(receiver.port)})
    try:
        group_.go()
        time.sleep(1.0)  # let the worker settle into its idle wait
        samples = common.latency_samples(
            lambda i: noop.apply_async((i, True)), receiver, args.samples
        )
    finally:
        group_.terminate()
        receiver.close()
    return {"samples": samples}


def chain_latency(args: Any) -> dict[str, Any]:
    """W8's chain: ``--steps`` no-op tasks in a Celery ``chain`` (immutable signatures:
    a step takes no result), run by an idle worker; each step's start minus the start of
    the step before, as the tasks report them."""
    _flush()
    receiver = common.ProbeReceiver()
    group_ = _workers(args.layout, {"BENCH_PROBE_PORT": str(receiver.port)})
    try:
        group_.go()
        time.sleep(1.0)
        chain(noop.si(i, True) for i in range(args.steps)).apply_async()
        started = [receiver.wait(i) for i in range(args.steps)]
    finally:
        group_.terminate()
        receiver.close()
    return {"samples": [after - before for before, after in itertools.pairwise(started)]}


def _wait_for_go(**_: Any) -> None:
    """``worker_ready``: the consumer is up; say so, then wait for the timed start."""
    sys.__stdout__.write("ready\n")
    sys.__stdout__.flush()
    if sys.__stdin__.readline().strip() != "go":
        os._exit(0)


def worker(args: Any) -> None:
    worker_ready.connect(_wait_for_go, weak=False)
    app.worker_main(
        [
            "worker",
            "--pool",
            os.environ.get("BENCH_CELERY_POOL", "prefork"),
            "--concurrency",
            str(args.slots),
            "--loglevel",
            "WARNING",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "--queues",
            QUEUE,
        ]
    )


COMMANDS = {
    "setup": setup,
    "enqueue-single": enqueue_single,
    "enqueue-bulk": enqueue_bulk,
    "drain": drain,
    "latency": latency,
    "chain": chain_latency,
}


def main() -> None:
    common.harness_main(__doc__.splitlines()[0], COMMANDS, worker)


if __name__ == "__main__":
    sys.exit(main())
