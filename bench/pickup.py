"""Where a due job's pickup time goes: a timeline of each hop, from the enqueueing
commit to the handler's first line.

    python bench/pickup.py [--samples N] [--concurrency C] [--busy FRACTION]
        [--database-url URL]

On a fresh database (migrated here) of a durable server started as bench/run.py starts
its own (or of ``--database-url``), starts one ``pgqueue_worker --concurrency C`` whose
process records, on the monotonic clock every process of this machine shares, the
moments of each hop of a job's pickup:

- ``heard``: the listener thread read the notification and woke the main loop;
- ``woke``: the main loop began its cycle;
- ``claimed``: the claim's results came back;
- ``handed``: the job was put in the slots' queue;
- ``slot``: a slot thread took it and marks it started;
- ``call``: the handler's transaction is open (``transaction.atomic``, which connects
  the slot's thread to the database when it has no connection yet), the handler called;
- ``handler``: the handler's first line.

Then enqueues ``--samples`` probe jobs one at a time, each once the one before started
and after a short, varying pause (as W4), and prints the percentiles of each hop's
duration and of the whole. Then, with the worker stopped, the floor: how long after the
same enqueues a bare psycopg connection that LISTENs hears them (the notification's
delivery alone).

``--busy F`` enqueues no-op jobs beside the probes, a transaction about every 5 ms from a thread
of this process, at ``F`` times the rate this worker drains (measured first, with a
burst drain): W4 "with the worker busy".

Prints Markdown; see bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if __name__ == "__main__" and not os.environ.get("BENCH_DATABASE_URL"):
    from bench.run import rerun_on_a_fresh_database

    raise SystemExit(rerun_on_a_fresh_database(__file__, "pickup_timeline"))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.django_settings")

import django  # noqa: E402

django.setup()

from bench.common import sample_pause  # noqa: E402

#: The hops, in the order a job passes them; the handler's is the probe's own message.
HOPS = ("heard", "woke", "claimed", "handed", "slot", "call", "handler")
#: Seconds the worker is left alone after it starts (its first beats, the first tick).
SETTLE_SECONDS = 3.0


# -- the worker's side ---------------------------------------------------------------


def instrument(port: int) -> None:
    """Make this process report each hop's moment to ``port`` (UDP, "hop t")."""
    from django_pgqueue import registry
    from django_pgqueue.worker import execution, listener, runner, slots

    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def report(hop: str) -> None:
        sink.sendto(f"{hop} {time.monotonic()!r}".encode(), ("127.0.0.1", port))

    class ReportingWake:
        """The listener's handle on the main loop's event: reports each wake-up."""

        def __init__(self, event: threading.Event) -> None:
            self._event = event

        def set(self) -> None:
            self._event.set()
            report("heard")

        def __getattr__(self, name: str) -> Any:
            return getattr(self._event, name)

    listener_init = listener.NotificationListener.__init__

    def init(self: Any, *args: Any, wake: threading.Event, **kwargs: Any) -> None:
        listener_init(self, *args, wake=ReportingWake(wake), **kwargs)  # type: ignore[arg-type]

    listener.NotificationListener.__init__ = init  # type: ignore[method-assign]

    cycle = runner.Worker._cycle

    def reporting_cycle(self: Any, slots: Any) -> Any:
        if self._room() > 0:
            report("woke")
        return cycle(self, slots)

    runner.Worker._cycle = reporting_cycle  # type: ignore[method-assign]

    claimed_jobs = runner.claimed_jobs

    def reporting_claimed_jobs(*args: Any) -> Any:
        found = claimed_jobs(*args)
        if found[0]:
            report("claimed")
        return found

    runner.claimed_jobs = reporting_claimed_jobs

    submit = slots.SlotPool.submit

    def reporting_submit(self: Any, running: Any) -> None:
        report("handed")
        submit(self, running)

    slots.SlotPool.submit = reporting_submit  # type: ignore[method-assign]

    mark_started = execution.mark_started

    def reporting_mark_started(running: Any) -> None:
        report("slot")
        mark_started(running)

    execution.mark_started = reporting_mark_started
    call = registry.JobDefinition.__call__

    def reporting_call(self: Any, job: Any) -> Any:
        report("call")
        return call(self, job)

    registry.JobDefinition.__call__ = reporting_call  # type: ignore[method-assign]


def run_worker(port: int, concurrency: int) -> None:
    from django.core.management import call_command

    instrument(port)
    os.environ["BENCH_PROBE_PORT"] = str(port)
    call_command("pgqueue_worker", "--concurrency", str(concurrency), "--log-level", "ERROR")


# -- the harness's side --------------------------------------------------------------


class Events:
    """The hops' moments as the worker reports them, and the probes' ("i t")."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])

    def drain(self) -> None:
        self.sock.setblocking(False)
        try:
            while True:
                self.sock.recv(128)
        except BlockingIOError:
            pass
        finally:
            self.sock.setblocking(True)

    def until_handler(self, i: int, timeout: float = 30.0) -> dict[str, float]:
        """The first moment of each hop reported before probe ``i`` started."""
        seen: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        while True:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            name, moment = self.sock.recv(128).decode().split()
            if name == str(i):
                seen["handler"] = float(moment)
                return seen
            if not name.isdigit():
                seen.setdefault(name, float(moment))


def floor_latencies(samples: int) -> list[float]:
    """The floor of any pickup: when a bare psycopg connection that LISTENs to the
    worker's channel hears each of ``samples`` enqueues (no worker running)."""
    import psycopg

    from django_pgqueue import conf, enqueue

    channel = conf.get_settings().NOTIFY_CHANNEL
    latencies = []
    with psycopg.connect(os.environ["BENCH_DATABASE_URL"], autocommit=True) as listening:
        listening.execute(f'LISTEN "{channel}"')
        for i in range(samples):
            enqueue("bench.noop", {"i": i})
            committed = time.monotonic()
            for _ in listening.notifies(timeout=5.0, stop_after=1):
                latencies.append(time.monotonic() - committed)
            time.sleep(sample_pause(i))
    return latencies


def percentiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    return statistics.median(ordered), cuts[89], cuts[98]


def busy_load(rate: float, stop: threading.Event) -> None:
    """Enqueue no-op jobs at ``rate`` a second in small transactions until ``stop``."""
    from django_pgqueue import enqueue_many

    per_batch = max(int(rate / 200), 1)  # a transaction every 5 ms or so
    interval = per_batch / rate
    next_at = time.monotonic()
    while not stop.is_set():
        enqueue_many([{"job_type": "bench.noop"}] * per_batch)
        next_at += interval
        stop.wait(max(next_at - time.monotonic(), 0.0))


def drain_rate(concurrency: int, jobs: int = 5000) -> float:
    """Jobs a second one burst worker drains here."""
    from django.core.management import call_command

    from django_pgqueue import enqueue_many

    enqueue_many([{"job_type": "bench.noop"}] * jobs)
    started = time.monotonic()
    call_command(
        "pgqueue_worker", "--concurrency", str(concurrency), "--burst", "--log-level", "ERROR"
    )
    return jobs / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--busy", type=float, default=0.0)
    parser.add_argument("--database-url")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.worker, args.concurrency)
        return

    from django.core.management import call_command
    from django.db import connection

    from django_pgqueue import enqueue

    call_command("migrate", verbosity=0)
    rate = drain_rate(args.concurrency) * args.busy if args.busy else 0.0
    connection.close()
    events = Events()
    command = [sys.executable, __file__, "--worker", str(events.port)]
    worker = subprocess.Popen([*command, "--concurrency", str(args.concurrency)])
    stop_load = threading.Event()
    load = threading.Thread(target=busy_load, args=(rate, stop_load), daemon=True)
    timelines: list[dict[str, float]] = []
    try:
        time.sleep(SETTLE_SECONDS)
        if rate:
            load.start()
            time.sleep(1.0)
        for i in range(args.samples):
            events.drain()
            enqueue("bench.noop", {"i": i, "probe": True})
            committed = time.monotonic()
            seen = events.until_handler(i)
            timelines.append({hop: moment - committed for hop, moment in seen.items()})
            time.sleep(sample_pause(i))
    finally:
        stop_load.set()
        worker.terminate()
        worker.wait(30)
    report(args, rate, timelines, floor_latencies(args.samples))


def report(args: Any, rate: float, timelines: list[dict[str, float]], floors: list[float]) -> None:
    state = f"busy at {rate:,.0f} jobs/s ({args.busy:g} of its drain)" if rate else "idle"
    print(f"## Pickup timeline: one worker, {args.concurrency} slots, {state}")
    print()
    print(f"{len(timelines)} probe jobs. Milliseconds from the enqueueing commit's return:")
    print("each hop's own duration (from the hop before), then the total.")
    print()
    print("| hop | p50 | p90 | p99 |")
    print("|---|---|---|---|")
    before = None
    # Busy, the hops after a commit may be other jobs' (a claim already on its way):
    # only the total is the probe's own.
    complete = [t for t in timelines if all(hop in t for hop in HOPS)] if not rate else []
    for hop in HOPS if complete else ():
        durations = [t[hop] - (t[before] if before else 0.0) for t in complete]
        p50, p90, p99 = percentiles(durations)
        print(f"| {hop} | {p50 * 1000:.2f} | {p90 * 1000:.2f} | {p99 * 1000:.2f} |")
        before = hop
    p50, p90, p99 = percentiles([t["handler"] for t in timelines])
    print(f"| **total** | **{p50 * 1000:.2f}** | **{p90 * 1000:.2f}** | **{p99 * 1000:.2f}** |")
    if floors:
        p50, p90, p99 = percentiles(floors)
        print(
            f"| floor: a bare LISTEN hears it | {p50 * 1000:.2f} | {p90 * 1000:.2f} "
            f"| {p99 * 1000:.2f} |"
        )
    if not rate:
        print()
        print(
            f"{len(timelines) - len(complete)} samples missed a hop (claimed by a poll or "
            "a recheck, not woken by their own notification) and count in the total only."
        )


if __name__ == "__main__":
    main()
