"""Harness for django-tasks-db (run in its own virtualenv by bench/run.py).

Tasks are Django Tasks (``@task``, the ``django-tasks`` backport on Django 5.2)
stored by ``django_tasks_db.DatabaseBackend``; workers are ``manage.py db_worker``
(through ``call_command``), which runs one task at a time: 4 slots are 4 processes.
The Tasks API has no bulk enqueue: W2 enqueues in a loop, one transaction per chunk.
It has no retries either, so W6 is not run. Its worker polls (no LISTEN/NOTIFY):
W4 runs it with ``--interval 0.1`` rather than the default 1 s.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from bench import common

MODULE = "bench.systems.harness_django_tasks_db"
POLL_INTERVAL = "0.1"


def _setup_django(dsn: str) -> None:
    os.environ["BENCH_DATABASE_URL"] = dsn
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.systems.dtdb_settings"
    import django

    django.setup()


def _table() -> str:
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult._meta.db_table


def _execute(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _successful() -> int:
    return _execute(f"SELECT count(*) FROM {_table()} WHERE status = 'SUCCESSFUL'")[0][0]


def _truncate() -> None:
    _execute(f"TRUNCATE {_table()}")


def _enqueue_bulk(jobs: int, chunk: int) -> None:
    from django.db import transaction

    from bench.systems.dtdb_tasks import noop

    for start in range(0, jobs, chunk):
        with transaction.atomic():
            for i in range(start, min(start + chunk, jobs)):
                noop.enqueue(i=i)


def setup(args: Any) -> dict[str, Any]:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return {"ok": True}


def enqueue_single(args: Any) -> dict[str, Any]:
    from bench.systems.dtdb_tasks import noop

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
    if slots != 1:
        raise ValueError("db_worker runs one task at a time: use a layout of Nx1")
    if args.kind != "noop":
        raise ValueError("django-tasks-db has no retries: W6 does not apply")
    if not args.keep:
        _truncate()
    else:
        _execute(f"VACUUM {_table()}")  # see --keep
    _enqueue_bulk(args.jobs, 5000)
    _execute(f"ANALYZE {_table()}")  # statistics as autovacuum would leave them
    before = _successful()
    from django.db import connection

    connection.close()
    group = common.WorkerGroup.start([common.worker_command(MODULE, args.dsn, 1, True)] * processes)
    group.go()
    start, end = group.wait()
    done = _successful() - before
    if done != args.jobs:
        raise RuntimeError(f"{done} of {args.jobs} tasks successful")
    last = _execute(f"SELECT extract(epoch FROM max(finished_at)) FROM {_table()}")[0][0]
    return common.drain_rate(args.jobs, start, float(last), end)


def latency(args: Any) -> dict[str, Any]:
    from bench.systems.dtdb_tasks import noop

    _truncate()
    receiver = common.ProbeReceiver()
    env = {**os.environ, "BENCH_PROBE_PORT": str(receiver.port)}
    group = common.WorkerGroup.start([common.worker_command(MODULE, args.dsn, 1, False)], env=env)
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


def fill_finished(args: Any) -> dict[str, Any]:
    began = time.perf_counter()
    _execute(
        f"""
        INSERT INTO {_table()} (id, status, enqueued_at, started_at, finished_at,
                                args_kwargs, priority, task_path, worker_ids, queue_name,
                                backend_name, run_after, return_value,
                                exception_class_path, traceback)
        SELECT gen_random_uuid(), 'SUCCESSFUL', t, t, t,
               jsonb_build_object('args', '[]'::jsonb, 'kwargs', jsonb_build_object('i', g)),
               0, 'bench.systems.dtdb_tasks.noop', '["filler"]', 'default', 'default',
               '9999-01-01'::timestamptz, 'null', '', ''
          FROM generate_series(1, %s) AS g,
               LATERAL (SELECT now() - interval '1 day' + g * interval '1 ms') AS x(t)
        """,
        [args.rows],
    )
    _execute(f"VACUUM ANALYZE {_table()}")
    return {"rows": args.rows, "seconds": time.perf_counter() - began}


def worker(args: Any) -> None:
    from django.core.management import call_command

    options = ["--queue-name", "*", "--no-startup-delay", "--interval", POLL_INTERVAL]
    if args.burst:
        options.append("--batch")
    common.worker_entry(lambda: call_command("db_worker", *options, verbosity=0))


COMMANDS = {
    "setup": setup,
    "enqueue-single": enqueue_single,
    "enqueue-bulk": enqueue_bulk,
    "drain": drain,
    "latency": latency,
    "fill-finished": fill_finished,
}


def main() -> None:
    common.harness_main(__doc__.splitlines()[0], COMMANDS, worker, setup=_setup_django)


if __name__ == "__main__":
    sys.exit(main())
