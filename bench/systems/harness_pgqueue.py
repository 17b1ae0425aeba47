"""Harness for django-pgqueue: drives the real ``enqueue`` / ``enqueue_many`` and
``manage.py pgqueue_worker`` (through ``call_command``) with bench/django_settings.py.

Also measures the references only this project has: ``baseline-insert``, a bare
single-row INSERT transaction on the same table (the W1 reference), and
``enqueue-single-prepared``, W1 with Django's prepared statements turned on, and
``enqueue-single-paired``, that run and the bare INSERT interleaved (the W1 target).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import sys
import time
from typing import Any

from bench import common

MODULE = "bench.systems.harness_pgqueue"
TABLE = "pgqueue_jobs"
#: The package's modules a worker imports once it runs (the runner, and those it imports
#: in its functions), as listed by ``sys.modules`` before and after a burst drain.
WORKER_MODULES = (
    "django_pgqueue.worker.runner",
    "django_pgqueue.limits",
    "django_pgqueue.periodic",
    "django_pgqueue.pruning",
    "django_pgqueue.rate_limits",
    "django_pgqueue.recovery",
)


def setup_django(dsn: str) -> None:
    os.environ["BENCH_DATABASE_URL"] = dsn
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.django_settings"
    import django

    django.setup()


def _execute(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _completed() -> int:
    return _execute(f"SELECT count(*) FROM {TABLE} WHERE status = 'completed'")[0][0]


def _truncate() -> None:
    # The workflow tables have no foreign keys to the jobs (CASCADE does not reach them):
    # left behind, W8's edges would pile up from run to run and slow the later runs.
    # A --baseline commit from before workflows has no such tables.
    tables = [TABLE, "pgqueue_job_dependencies", "pgqueue_job_waits"]
    found = _execute(
        "SELECT name FROM unnest(%s::text[]) AS name WHERE to_regclass(name) IS NOT NULL", [tables]
    )
    _execute(f"TRUNCATE {', '.join(name for (name,) in found)} CASCADE")


def _create_rows_table() -> None:
    """W13's table, empty: one row per job, written by its handler."""
    _execute(f"CREATE TABLE IF NOT EXISTS {common.W13_TABLE} (job_id uuid NOT NULL)")
    _execute(f"TRUNCATE {common.W13_TABLE}")


def enqueue_in_chunks(job_type: str, jobs: int, chunk: int, *, keys: int = 0) -> None:
    """``jobs`` jobs with data ``{"i": i}``, and ``"key": i % keys`` when ``keys``."""
    from django_pgqueue import enqueue_many

    for start in range(0, jobs, chunk):
        enqueue_many(
            {"job_type": job_type, "data": {"i": i, "key": i % keys} if keys else {"i": i}}
            for i in range(start, min(start + chunk, jobs))
        )


def enqueue_chord(members: int) -> None:
    """W8: ``members`` no-op jobs side by side, then one no-op callback after them all,
    written as one workflow (``chord()``)."""
    from django_pgqueue import Step, chord

    chord(
        [Step("bench.noop", {"i": i}) for i in range(members)],
        Step("bench.noop", {"i": members}),
    ).enqueue()


def _declare_keyed_jobs() -> None:
    """Register ``bench.keyed`` (W9) here and in the workers this process starts, and
    write its per-key limit first, as a worker starting would: the jobs enqueued next are
    held beyond one per key, as in a deployment whose workers run."""
    os.environ["BENCH_KEYED_JOBS"] = "1"
    import bench.benchapp.keyed_jobs  # noqa: F401  (registers bench.keyed)
    from django_pgqueue.limits import sync_declared_limits

    sync_declared_limits()


def _declare_rated_keys() -> None:
    """Register ``bench.rated_keys`` (W11) here and in the workers this process starts,
    and write its per-key rate first, as a worker starting would."""
    os.environ["BENCH_RATED_KEYS"] = "1"
    import bench.benchapp.rated_keys_jobs  # noqa: F401  (registers bench.rated_keys)
    from django_pgqueue.rate_limits import sync_declared_rate_limits

    sync_declared_rate_limits()


def setup(args: Any) -> dict[str, Any]:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return {"ok": True}


def _enqueue_each(numbers: range) -> None:
    from django_pgqueue import enqueue

    for i in numbers:
        enqueue("bench.noop", {"i": i})  # autocommit: each its own transaction


def enqueue_single(args: Any) -> dict[str, Any]:
    _truncate()
    began = time.perf_counter()
    _enqueue_each(range(args.jobs))
    return common.rate(args.jobs, time.perf_counter() - began)


#: Django's own switch for prepared statements (its default keeps them off, for poolers).
PREPARED_OPTIONS = {"server_side_binding": True, "prepare_threshold": 5}


def enqueue_single_prepared(args: Any) -> dict[str, Any]:
    """W1 with prepared statements enabled in Django's ``OPTIONS`` (``PREPARED_OPTIONS``):
    the driver settings of the bare INSERT reference, which psycopg prepares by default."""
    _use_prepared_statements()
    return enqueue_single(args)


def _use_prepared_statements() -> None:
    """Reconnect Django with ``PREPARED_OPTIONS`` added to the database's ``OPTIONS``."""
    from django.db import connection

    connection.close()
    options = connection.settings_dict["OPTIONS"]
    connection.settings_dict["OPTIONS"] = {**options, **PREPARED_OPTIONS}


#: Jobs per block of the interleaved W1 measurement (``enqueue-single-paired``).
PAIRED_BLOCK = 500


def enqueue_single_paired(args: Any) -> dict[str, Any]:
    """W1 and the bare INSERT interleaved: ``--jobs`` of each, in blocks of
    ``PAIRED_BLOCK`` that alternate in ABBA order, with Django's prepared statements.

    Every commit waits for the disk, and this VM's disk changes speed from one second to
    the next: measured one after the other, the two rates of a run differ by the moments
    they ran in as much as by the code. Interleaved, both see the same moments, and ABBA
    cancels the advantage of going second. ``ratio`` is the bare INSERT's time over ours.
    """
    import psycopg

    _use_prepared_statements()
    _truncate()
    seconds = {"ours": 0.0, "bare": 0.0}
    with psycopg.connect(args.dsn, autocommit=True) as conn:

        def bare(numbers: range) -> None:
            _bare_insert_each(conn, numbers)

        for block, start in enumerate(range(0, args.jobs, PAIRED_BLOCK)):
            numbers = range(start, min(start + PAIRED_BLOCK, args.jobs))
            order = (("bare", bare), ("ours", _enqueue_each))
            for name, call in order if block % 2 == 0 else order[::-1]:
                began = time.perf_counter()
                call(numbers)
                seconds[name] += time.perf_counter() - began
    return {
        "ratio": seconds["bare"] / seconds["ours"],
        "rate": args.jobs / seconds["ours"],
        "reference_rate": args.jobs / seconds["bare"],
        "jobs": args.jobs,
    }


def enqueue_bulk(args: Any) -> dict[str, Any]:
    _truncate()
    began = time.perf_counter()
    enqueue_in_chunks("bench.noop", args.jobs, args.chunk)
    return common.rate(args.jobs, time.perf_counter() - began)


def baseline_insert(args: Any) -> dict[str, Any]:
    """A bare single-row INSERT per transaction on ``pgqueue_jobs``, plain psycopg."""
    import psycopg

    _truncate()
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        began = time.perf_counter()
        _bare_insert_each(conn, range(args.jobs))
        return common.rate(args.jobs, time.perf_counter() - began)


def _bare_insert_each(conn: Any, numbers: range) -> None:
    for i in numbers:
        conn.execute(
            f"INSERT INTO {TABLE} (job_type, data) VALUES (%s, %s::jsonb)",
            ["bench.noop", f'{{"i": {i}}}'],
        )


def drain(args: Any) -> dict[str, Any]:
    processes, slots = common.parse_layout(args.layout)
    if not args.keep:
        _truncate()
    else:
        _execute(f"VACUUM {TABLE}")  # see --keep
    if args.kind == "keyed":
        _declare_keyed_jobs()
    if args.kind == "rated_keys":
        _declare_rated_keys()
        _execute("TRUNCATE pgqueue_rate_starts")
    if args.kind == "io_wait":
        os.environ["BENCH_ASYNC_JOBS"] = "1"  # the workers run async slots (worker())
        import bench.benchapp.async_jobs
    if args.kind == "writes_row":
        _create_rows_table()
    if args.kind == "noop_isolated":
        os.environ["BENCH_PROCESS_JOBS"] = "1"  # the workers run process slots
        import bench.benchapp.process_jobs  # noqa: F401  (registers bench.noop_isolated)
    job_type = {
        "noop": "bench.noop",
        "cpu_flaky": "bench.cpu_flaky",
        "keyed": "bench.keyed",
        "rated_keys": "bench.rated_keys",
        "io_wait": "bench.io_wait",
        "noop_isolated": "bench.noop_isolated",
        "writes_row": "bench.writes_row",
    }
    keys = common.W9_KEYS if args.kind in ("keyed", "rated_keys") else 0
    enqueue_seconds = 0.0
    if args.kind == "chord":
        began = time.perf_counter()
        enqueue_chord(args.jobs - 1)
        enqueue_seconds = time.perf_counter() - began
    else:
        enqueue_in_chunks(job_type[args.kind], args.jobs, 5000, keys=keys)
    _execute(f"ANALYZE {TABLE}")  # statistics as autovacuum would leave them
    before = _completed()
    server = common.postmaster(_execute("SELECT pg_backend_pid()")[0][0])
    from django.db import connection

    connection.close()  # idle during the drain: not a server backend to keep busy
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, True)] * processes
    )
    server_before = common.server_cpu(server)
    group.go()
    start, end = group.wait()
    server_after = common.server_cpu(server)
    done = _completed() - before
    if done != args.jobs:
        raise RuntimeError(f"{done} of {args.jobs} jobs completed")
    if args.kind == "writes_row":
        rows = _execute(f"SELECT count(*) FROM {common.W13_TABLE}")[0][0]
        if rows != args.jobs:
            raise RuntimeError(f"{rows} rows written by {args.jobs} jobs")
    last = _execute(f"SELECT extract(epoch FROM max(completed_at)) FROM {TABLE}")[0][0]
    # W8 is timed from the enqueue: the workflow's writing is part of its cost.
    result = common.drain_rate(args.jobs, start - enqueue_seconds, float(last), end)
    result["worker_cpu"] = group.cpu
    if server_before is not None and server_after is not None:
        result["server_cpu"] = server_after - server_before
    return {**result, "enqueue": enqueue_seconds} if args.kind == "chord" else result


def rate_limit(args: Any) -> dict[str, Any]:
    """W10: ``bench.rated`` under ``--rate`` jobs a second, a backlog that outlasts the
    measured ``--seconds``, run by non-burst workers; read back from ``started_at``."""
    processes, slots = common.parse_layout(args.layout)
    _truncate()
    _execute("TRUNCATE pgqueue_rate_starts")
    os.environ["BENCH_RATED_JOBS"] = str(args.rate)  # here and in the workers
    import bench.benchapp.rated_jobs  # noqa: F401  (registers bench.rated)
    from django_pgqueue.rate_limits import sync_declared_rate_limits

    sync_declared_rate_limits()
    enqueue_in_chunks("bench.rated", int(args.rate * (args.seconds + 10)), 5000)
    _execute(f"ANALYZE {TABLE}")
    from django.db import connection

    connection.close()
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, False)] * processes
    )
    try:
        group.go()
        time.sleep(args.seconds + 2)
    finally:
        group.terminate()
    starts = _execute(
        f"SELECT extract(epoch FROM started_at) FROM {TABLE} WHERE started_at IS NOT NULL"
    )
    return common.rate_kept([float(s) for (s,) in starts], args.rate, args.seconds)


def latency(args: Any) -> dict[str, Any]:
    from django_pgqueue import enqueue

    _truncate()
    receiver = common.ProbeReceiver()
    env = {**os.environ, "BENCH_PROBE_PORT": str(receiver.port)}
    _, slots = common.parse_layout(args.layout)
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, False)], env=env
    )
    try:
        group.go()
        time.sleep(1.0)  # let the worker settle into its idle wait
        samples = common.latency_samples(
            lambda i: enqueue("bench.noop", {"i": i, "probe": True}), receiver, args.samples
        )
    finally:
        group.terminate()
        receiver.close()
    return {"samples": samples}


def chain_latency(args: Any) -> dict[str, Any]:
    """W8's chain: ``--steps`` no-op jobs one after another, run by idle (not burst)
    workers; each step's start minus the start of the step before (the no-op handler
    takes microseconds), as the handlers report them (the latency probe's clock). The
    database's times cannot tell: a worker records a finish and claims the next step in
    one transaction, under one ``now()``."""
    from django_pgqueue import Step, chain

    _truncate()
    receiver = common.ProbeReceiver()
    env = {**os.environ, "BENCH_PROBE_PORT": str(receiver.port)}
    processes, slots = common.parse_layout(args.layout)
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, False)] * processes, env=env
    )
    try:
        group.go()
        time.sleep(1.0)  # let the workers settle into their idle wait
        steps = (Step("bench.noop", {"i": i, "probe": True}) for i in range(args.steps))
        chain(steps).enqueue()
        started = [receiver.wait(i) for i in range(args.steps)]
    finally:
        group.terminate()
        receiver.close()
    return {"samples": [after - before for before, after in itertools.pairwise(started)]}


def fill_finished(args: Any) -> dict[str, Any]:
    began = time.perf_counter()
    _execute(
        f"""
        INSERT INTO {TABLE} (job_type, status, data, progress, worker_id, attempts,
                             created_at, run_at, claimed_at, started_at, completed_at)
        SELECT 'bench.noop', 'completed', jsonb_build_object('i', g), 100, 'filler', 1,
               t, t, t, t, t
          FROM generate_series(1, %s) AS g,
               LATERAL (SELECT now() - interval '1 day' + g * interval '1 ms') AS x(t)
        """,
        [args.rows],
    )
    _execute(f"VACUUM ANALYZE {TABLE}")
    return {"rows": args.rows, "seconds": time.perf_counter() - began}


def load_worker_code() -> None:
    """Import the worker command and every module a worker runs jobs with.

    Called before the worker says ``ready``, so that a drain times the jobs and not the
    first import of the code that runs them: a working tree's modules are compiled from
    source at each start when bytecode is not cached (``PYTHONDONTWRITEBYTECODE``),
    while an installed package (the ``--baseline``) has its bytecode.
    """
    from django.core.management import load_command_class

    load_command_class("django_pgqueue", "pgqueue_worker")
    for name in WORKER_MODULES:
        with contextlib.suppress(ImportError):  # an earlier commit may lack some
            importlib.import_module(name)


def worker(args: Any) -> None:
    from django.core.management import call_command

    if os.environ.get("BENCH_ASYNC_JOBS"):
        # W7: its slots are places on the event loop; one thread for sync jobs.
        options = ["--concurrency", "1", "--async-concurrency", str(args.slots)]
    elif os.environ.get("BENCH_PROCESS_JOBS"):
        # W12: its slots are child processes; one thread for sync jobs.
        options = ["--concurrency", "1", "--process-concurrency", str(args.slots)]
    else:
        options = ["--concurrency", str(args.slots)]
    options += ["--log-level", "ERROR"]
    if args.batch_size:
        options += ["--batch-size", str(args.batch_size)]
    if args.burst:
        options.append("--burst")
    common.worker_entry(lambda: call_command("pgqueue_worker", *options), load_worker_code)


COMMANDS = {
    "setup": setup,
    "enqueue-single": enqueue_single,
    "enqueue-single-prepared": enqueue_single_prepared,
    "enqueue-single-paired": enqueue_single_paired,
    "enqueue-bulk": enqueue_bulk,
    "baseline-insert": baseline_insert,
    "drain": drain,
    "latency": latency,
    "chain": chain_latency,
    "rate-limit": rate_limit,
    "fill-finished": fill_finished,
}


def main() -> None:
    common.harness_main(__doc__.splitlines()[0], COMMANDS, worker, setup=setup_django)


if __name__ == "__main__":
    sys.exit(main())
