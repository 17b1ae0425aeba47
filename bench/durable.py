"""Durable steps, sleeps and waits: their cost per step, at idle, and to wake.

    python bench/durable.py [--sleepers N] [--wake N] [--steps-jobs N] [--runs N]
        [--concurrency N] [--database-url URL]

On a fresh database (migrated here) of a durable server started as bench/run.py starts
its own (``fsync`` and ``synchronous_commit`` on), or of ``--database-url``, with one
``pgqueue_worker --concurrency 4`` (or ``--concurrency``):

1. Idle: the worker runs idle with no job, then beside ``--sleepers`` suspended jobs
   (half in ``job.sleep()``, half in ``job.wait_for_event()``, written in SQL as a worker
   leaves them). For each, over ``MEASURE_SECONDS``: the transactions the database
   committed per second (the worker's polls and heartbeats), the client connections
   held, and the median time of one idle claim.
2. Steps: ``--steps-jobs`` jobs of ten no-op ``job.step()`` each, drained, set beside
   ten times as many no-op jobs, drained by the same worker; ``--runs`` rounds of each,
   alternating, medians reported. The figure is the steps' rate (checkpoints a second)
   as a ratio of the no-op jobs' rate, and the WAL written per checkpoint (the steps'
   drain's WAL per job less a no-op job's, over ten).
3. Wake: ``--wake`` no-op jobs are drained, then ``--wake`` events, emitted in one
   transaction, wake as many waiting jobs: the rate from that commit to the last woken
   job's completion, as a ratio of the drain's.

Prints Markdown; see bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


if __name__ == "__main__" and not os.environ.get("BENCH_DATABASE_URL"):
    from bench.run import rerun_on_a_fresh_database

    raise SystemExit(rerun_on_a_fresh_database(__file__, "durable_steps"))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.django_settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from django_pgqueue import emit_event, enqueue_many  # noqa: E402
from django_pgqueue.options import JobSpec  # noqa: E402
from django_pgqueue.worker import queries  # noqa: E402

MEASURE_SECONDS = 10.0
SETTLE_SECONDS = 3.0
#: Before the first figures: a worker opens the connection of its periodic work (rate
#: limits, recovery) at that work's first round, 10 s after it starts.
WARM_UP_SECONDS = 12.0

_SUSPENDED = """
WITH jobs AS (
    INSERT INTO pgqueue_jobs (job_type, data, run_at)
    SELECT CASE WHEN g %% 2 = 0 THEN 'bench.sleeps' ELSE 'bench.waits' END,
           jsonb_build_object('i', g),
           now() + CASE WHEN g %% 2 = 0 THEN interval '2 days' ELSE interval '1000 years' END
      FROM generate_series(1, %s) AS g
    RETURNING id, job_type, data, run_at
)
INSERT INTO pgqueue_job_steps (job_id, name, kind, attempt, wake_at, started_at)
SELECT id,
       CASE job_type WHEN 'bench.sleeps' THEN 'nap' ELSE 'e:' || (data->>'i') END,
       CASE job_type WHEN 'bench.sleeps' THEN 'sleep' ELSE 'event' END,
       1,
       CASE job_type WHEN 'bench.sleeps' THEN run_at END,
       now()
  FROM jobs
"""


def database_figures() -> tuple[int, int]:
    """Transactions committed in this database so far, and its connections but ours."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        (commits,) = cursor.fetchone()
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        (connections,) = cursor.fetchone()
    return int(commits), int(connections)


def idle_claim_ms(rounds: int = 40) -> float:
    """The median time of a claim that finds nothing due, as an idle worker's poll."""
    times = []
    with connection.cursor() as cursor:
        for _ in range(rounds):
            started = time.perf_counter()
            cursor.execute(queries.CLAIM, ["bench-probe", None, 10, None, 4, None, None])
            cursor.fetchall()
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure_idle(label: str, settle: float = SETTLE_SECONDS) -> dict[str, Any]:
    time.sleep(settle)
    commits, connections = database_figures()
    time.sleep(MEASURE_SECONDS)
    after, _ = database_figures()
    # Our own two figure queries commit too: 2 transactions per database_figures().
    per_second = (after - commits - 2) / MEASURE_SECONDS
    return {
        "case": label,
        "commits_per_second": round(per_second, 1),
        "connections": connections,
        "idle_claim_ms": round(idle_claim_ms(), 2),
    }


def wait_for_completed(count: int, job_type: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pgqueue_jobs WHERE job_type = %s AND status = 'completed'",
                [job_type],
            )
            (done,) = cursor.fetchone()
        if done >= count:
            return
        time.sleep(0.02)
    raise SystemExit(f"{job_type}: only {done} of {count} completed in {timeout}s")


def wal_lsn() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def timed_drain(specs: list[JobSpec], job_type: str) -> tuple[float, int]:
    """Enqueue ``specs``, and return the seconds from that commit to the last job's
    completion, and the WAL bytes written meanwhile."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgqueue_jobs CASCADE")
    wal = wal_lsn()
    enqueue_many(specs)
    started = time.monotonic()
    wait_for_completed(len(specs), job_type)
    return time.monotonic() - started, wal_lsn() - wal


def measure_steps(jobs: int, runs: int) -> str:
    """Jobs of ten no-op steps beside ten times as many no-op jobs."""
    plain_rates, step_rates, plain_wal, step_wal = [], [], [], []
    for _ in range(runs):
        seconds, wal = timed_drain([JobSpec(job_type="bench.noop")] * (10 * jobs), "bench.noop")
        plain_rates.append(10 * jobs / seconds)
        plain_wal.append(wal / (10 * jobs))
        seconds, wal = timed_drain([JobSpec(job_type="bench.ten_steps")] * jobs, "bench.ten_steps")
        step_rates.append(10 * jobs / seconds)
        step_wal.append(wal / jobs)
    plain, steps = statistics.median(plain_rates), statistics.median(step_rates)
    per_checkpoint = (statistics.median(step_wal) - statistics.median(plain_wal)) / 10
    return (
        f"{10 * jobs:,} no-op jobs drained at {plain:,.0f} jobs/s (WAL "
        f"{statistics.median(plain_wal):,.0f} B a job); {jobs:,} jobs of ten no-op steps "
        f"at {steps:,.0f} steps/s: {steps / plain:.2f}x; WAL {per_checkpoint:,.0f} B a "
        f"checkpoint (medians of {runs} alternating runs)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleepers", type=int, default=100_000)
    parser.add_argument("--wake", type=int, default=10_000)
    parser.add_argument("--steps-jobs", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=4,
        help="the worker's threads (default 4): a step waits on a round trip, a no-op "
        "job on nothing, so more threads speed the steps up and not the no-op jobs",
    )
    parser.add_argument(
        "--database-url",
        help="a server to run on (a fresh database is made there); default: a durable "
        "server started as bench/run.py starts its own",
    )
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgqueue_jobs, pgqueue_emitted_events CASCADE")
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "pgqueue_worker", "--concurrency", str(args.concurrency)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        rows = [measure_idle("idle worker, no job", settle=WARM_UP_SECONDS)]
        with connection.cursor() as cursor:
            cursor.execute(_SUSPENDED, [args.sleepers])
            cursor.execute("VACUUM ANALYZE pgqueue_jobs")
            cursor.execute("VACUUM ANALYZE pgqueue_job_steps")
        rows.append(measure_idle(f"idle worker, {args.sleepers:,} jobs sleeping or waiting"))
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE pgqueue_jobs CASCADE")
        steps_line = measure_steps(args.steps_jobs, args.runs)

        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE pgqueue_jobs CASCADE")
            cursor.execute(_SUSPENDED, [2 * args.wake])
        enqueue_many([JobSpec(job_type="bench.noop") for _ in range(args.wake)])
        started = time.monotonic()
        wait_for_completed(args.wake, "bench.noop")
        drain_rate = args.wake / (time.monotonic() - started)

        started = time.monotonic()
        with transaction.atomic():
            for i in range(1, 2 * args.wake, 2):  # the odd ones wait
                emit_event(f"e:{i}", i)
        committed = time.monotonic()
        wait_for_completed(args.wake, "bench.waits")
        wake_rate = args.wake / (time.monotonic() - committed)
        emit_rate = args.wake / (committed - started)
    finally:
        worker.terminate()
        worker.wait(timeout=60)

    print(f"One worker of {args.concurrency} threads.")
    print()
    print(steps_line)
    print()
    print("| case | commits/s | connections | idle claim (ms) |")
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['case']} | {row['commits_per_second']} | {row['connections']} "
            f"| {row['idle_claim_ms']} |"
        )
    print()
    print(
        f"{args.wake:,} no-op jobs drained at {drain_rate:,.0f} jobs/s. {args.wake:,} "
        f"events emitted in one transaction ({emit_rate:,.0f} emits/s); from its commit, "
        f"their waiting jobs woke and completed at {wake_rate:,.0f} jobs/s: "
        f"{wake_rate / drain_rate:.2f}x the drain"
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        print(cursor.fetchone()[0])
        cursor.execute("SHOW fsync")
        print(f"fsync {cursor.fetchone()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
