"""Harness for django-absurd (run in its own virtualenv by bench/run.py).

Tasks are Django Tasks (``@task``, Django 6) stored by
``django_absurd.backends.AbsurdBackend`` in Absurd's tables for the ``default`` queue;
``enqueue`` one at a time (W1) and, since the Tasks API has no bulk enqueue, in a loop
of 5,000 to a transaction (W2). A worker process is ``manage.py absurd_worker
--concurrency SLOTS --poll-interval POLL_SECONDS`` (through ``call_command``): it polls
(no LISTEN/NOTIFY), every quarter of a second by default, a hundredth here as for
the other polling peers. It has no burst mode: a burst worker's own thread sends the
process the SIGTERM that stops the worker once no task of the queue is left pending,
running or sleeping (looked at every 20 ms). W3 is timed to the last run's
``completed_at``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from bench import common

MODULE = "bench.systems.harness_django_absurd"
TASKS = "absurd.t_default"
RUNS = "absurd.r_default"
POLL_SECONDS = "0.01"
#: How often a burst worker looks whether tasks are left.
BURST_CHECK_SECONDS = 0.02


def _setup_django(dsn: str) -> None:
    os.environ["BENCH_DATABASE_URL"] = dsn
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.systems.absurd_settings"
    import django

    django.setup()


def _execute(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _completed() -> int:
    return _execute(f"SELECT count(*) FROM {TASKS} WHERE state = 'completed'")[0][0]


def _left() -> int:
    query = f"SELECT count(*) FROM {TASKS} WHERE state IN ('pending', 'running', 'sleeping')"
    return _execute(query)[0][0]


def _truncate() -> None:
    """Empty the queue's tables (tasks, runs, checkpoints, events, waits)."""
    tables = _execute(
        "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables "
        "WHERE schemaname = 'absurd' AND tablename LIKE '%\\_default'"
    )
    _execute(f"TRUNCATE {', '.join(name for (name,) in tables)}")


def _enqueue_bulk(jobs: int, chunk: int, kind: str = "noop") -> None:
    from django.db import transaction

    from bench.systems import absurd_tasks

    task = absurd_tasks.cpu_flaky if kind == "cpu_flaky" else absurd_tasks.noop
    for start in range(0, jobs, chunk):
        with transaction.atomic():
            for i in range(start, min(start + chunk, jobs)):
                task.enqueue(i=i)


def setup(args: Any) -> dict[str, Any]:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)  # Absurd's schema, and the declared queue
    return {"ok": True}


def enqueue_single(args: Any) -> dict[str, Any]:
    from bench.systems.absurd_tasks import noop

    _truncate()
    began = time.perf_counter()
    for i in range(args.jobs):
        noop.enqueue(i=i)  # autocommit: each its own transaction
    return common.rate(args.jobs, time.perf_counter() - began)


def enqueue_bulk(args: Any) -> dict[str, Any]:
    _truncate()
    began = time.perf_counter()
    _enqueue_bulk(args.jobs, args.chunk)
    return common.rate(args.jobs, time.perf_counter() - began)


def drain(args: Any) -> dict[str, Any]:
    processes, slots = common.parse_layout(args.layout)
    if args.kind not in ("noop", "cpu_flaky"):
        raise RuntimeError(f"no {args.kind} tasks in this harness")
    if not args.keep:
        _truncate()
    _enqueue_bulk(args.jobs, 5000, args.kind)
    _execute(f"ANALYZE {TASKS}")  # statistics as autovacuum would leave them
    _execute(f"ANALYZE {RUNS}")
    before = _completed()
    from django.db import connection

    connection.close()
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, True)] * processes
    )
    group.go()
    start, end = group.wait()
    done = _completed() - before
    if done != args.jobs:
        raise RuntimeError(f"{done} of {args.jobs} tasks completed")
    if args.kind == "cpu_flaky":
        retried = _execute(f"SELECT count(*) FROM {TASKS} WHERE attempts > 1")[0][0]
        common.check_retried(retried, args.jobs)
    last = _execute(f"SELECT extract(epoch FROM max(completed_at)) FROM {RUNS}")[0][0]
    return common.drain_rate(args.jobs, start, float(last), end)


def latency(args: Any) -> dict[str, Any]:
    from bench.systems.absurd_tasks import noop

    _truncate()
    receiver = common.ProbeReceiver()
    env = {**os.environ, "BENCH_PROBE_PORT": str(receiver.port)}
    _, slots = common.parse_layout(args.layout)
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, False)], env=env
    )
    try:
        group.go()
        time.sleep(1.0)
        samples = common.latency_samples(
            lambda i: noop.enqueue(i=i, probe=True), receiver, args.samples
        )
    finally:
        group.terminate()
        receiver.close()
    return {"samples": samples}


def _stop_when_drained() -> None:
    """SIGTERM this process, the worker's own way to stop, once no task is left."""
    from django.db import connection

    try:
        while _left():
            time.sleep(BURST_CHECK_SECONDS)
    finally:
        connection.close()
    os.kill(os.getpid(), signal.SIGTERM)


def worker(args: Any) -> None:
    import io

    from django.core.management import call_command

    options = ["--concurrency", str(args.slots), "--poll-interval", POLL_SECONDS]

    def run() -> None:
        if args.burst:
            threading.Thread(target=_stop_when_drained, daemon=True).start()
        # Its banner kept off standard output, where the worker reports to the harness.
        call_command("absurd_worker", *options, verbosity=0, stdout=io.StringIO())

    common.worker_entry(run)


COMMANDS = {
    "setup": setup,
    "enqueue-single": enqueue_single,
    "enqueue-bulk": enqueue_bulk,
    "drain": drain,
    "latency": latency,
}


def main() -> None:
    common.harness_main(__doc__.splitlines()[0], COMMANDS, worker, setup=_setup_django)


if __name__ == "__main__":
    sys.exit(main())
