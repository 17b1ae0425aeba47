"""Harness for Dramatiq on Redis (run in its own virtualenv by bench/run.py).

bench/run.py starts a ``redis-server`` for it and passes its URL in
``BENCH_REDIS_URL``; ``--dsn`` (a PostgreSQL database, as for every harness) is not used.
The broker is Dramatiq's ``RedisBroker`` with its default middleware (retries, time
limits, age limits), plus ``CurrentMessage`` for W6's attempt number. A worker process is
a ``dramatiq.Worker`` of ``worker_threads=4``, as ``dramatiq --processes 1 --threads 4``
runs, with ``worker_timeout=10``: an idle consumer looks for messages again within 10 ms
(its default backs off to 1 s), the lowest polling interval, as for the other polling
peers. Dramatiq acknowledges a message once it ran (nothing is lost with a worker).

Dramatiq has no burst mode and keeps no finished messages: a drain is over when the
queue's and the delay queue's message hashes are both empty (a message leaves them when
acknowledged), seen on two polls in a row; the workers are then stopped. W6's actor
retries once, at once (``max_retries=1``, a backoff of 1 ms through the delay queue).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

from bench import common

MODULE = "bench.systems.harness_dramatiq"
QUEUE = "bench"
#: The message hashes of the queue and of its delay queue (Dramatiq's Redis layout).
MESSAGE_HASHES = (f"dramatiq:{QUEUE}.msgs", f"dramatiq:{QUEUE}.DQ.msgs")
#: Milliseconds an idle consumer waits before it looks for messages again, at most.
WORKER_TIMEOUT_MS = 10
#: Seconds between two looks at the queue while waiting for a drain to end.
POLL_SECONDS = 0.002
#: The worker threads of each layout (one process).
LAYOUTS = {"1x4": 4}

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")

broker = RedisBroker(url=REDIS_URL)
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop(i: int, probe: bool = False) -> None:
    if probe:
        common.probe(i)


@dramatiq.actor(queue_name=QUEUE, max_retries=1, min_backoff=1, max_backoff=1)
def cpu_flaky(i: int) -> None:
    common.burn_cpu()
    message = CurrentMessage.get_current_message()
    assert message is not None
    if common.fails_first_attempt(i) and not message.options.get("retries"):
        raise common.FlakyJobError(f"job {i} fails its first attempt")


def setup(args: Any) -> dict[str, Any]:
    broker.client.ping()
    return {"ok": True}


def _flush() -> None:
    broker.client.flushdb()


def _send_each(actor: Any, jobs: int) -> None:
    for i in range(jobs):
        actor.send(i)


def enqueue_single(args: Any) -> dict[str, Any]:
    _flush()
    began = time.perf_counter()
    _send_each(noop, args.jobs)
    return common.rate(args.jobs, time.perf_counter() - began)


def enqueue_bulk(args: Any) -> dict[str, Any]:
    """Dramatiq has no bulk enqueue (a ``group`` sends its messages one by one)."""
    _flush()
    began = time.perf_counter()
    _send_each(noop, args.jobs)
    return common.rate(args.jobs, time.perf_counter() - began)


def _drained() -> bool:
    return all(broker.client.hlen(name) == 0 for name in MESSAGE_HASHES)


def _workers(layout: str, env: dict[str, str] | None = None) -> common.WorkerGroup:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose from {sorted(LAYOUTS)}")
    command = common.worker_command(MODULE, "-", LAYOUTS[layout], burst=False)
    return common.WorkerGroup.start([command], env={**os.environ, **(env or {})})


def drain(args: Any) -> dict[str, Any]:
    if args.kind not in ("noop", "cpu_flaky"):
        raise ValueError(f"no {args.kind} drain for Dramatiq")
    _flush()
    _send_each({"noop": noop, "cpu_flaky": cpu_flaky}[args.kind], args.jobs)
    group = _workers(args.layout)
    try:
        start = time.time()
        group.go()
        last = common.first_seen_drained(_drained, POLL_SECONDS)
    finally:
        group.kill()  # its shutdown is no measure of the queue
    return common.drain_rate(args.jobs, start, last, time.time())


def latency(args: Any) -> dict[str, Any]:
    _flush()
    receiver = common.ProbeReceiver()
    group = _workers(args.layout, {"BENCH_PROBE_PORT": str(receiver.port)})
    try:
        group.go()
        time.sleep(1.0)  # let the consumer settle into its idle wait
        samples = common.latency_samples(lambda i: noop.send(i, True), receiver, args.samples)
    finally:
        group.kill()
        receiver.close()
    return {"samples": samples}


def worker(args: Any) -> None:
    # A W6 drain fails 1 job in 10 on purpose: no traceback for each.
    logging.getLogger("dramatiq").setLevel(logging.CRITICAL)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def run() -> None:
        work = dramatiq.Worker(broker, worker_threads=args.slots, worker_timeout=WORKER_TIMEOUT_MS)
        work.start()
        stop.wait()
        work.stop()

    common.worker_entry(run)


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
