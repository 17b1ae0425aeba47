"""What idle workers cost the database: statements, transactions, connections, CPU.

    python bench/idle.py [--workers N] [--seconds S] [--cases notify,polling]
        [--database-url URL]

On a fresh database (migrated here) of a durable server started as bench/run.py starts
its own, with ``pg_stat_statements`` loaded and room for the connections (or of
``--database-url``), starts ``--workers`` processes of ``pgqueue_worker --concurrency 4``
with no job to run, waits until all of them are registered and ``SETTLE_SECONDS``
more, then counts over ``--seconds``: the statements the server ran for this database
(top-level ``pg_stat_statements`` calls; "n/a" where the extension is missing), the
transactions it committed, the client connections held, and the CPU the server spent
(every process of it, from ``/proc``; only for a server on this machine). Cases:
``notify``, the defaults (idle workers claim when notified, the leader wakes them for
jobs that become due with time), and ``polling``, ``PGQUEUE["NOTIFY"] = False`` (what
workers behind a transaction pooler without ``LISTEN_DATABASE`` do: each polls every
``POLL_INTERVAL``).

Prints Markdown; see bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: For the server this script starts: 100 workers hold three connections each.
SERVER_SETTINGS = ("max_connections=500", "shared_preload_libraries=pg_stat_statements")

if __name__ == "__main__" and not os.environ.get("BENCH_DATABASE_URL"):
    from bench.run import rerun_on_a_fresh_database

    raise SystemExit(rerun_on_a_fresh_database(__file__, "idle_workers", SERVER_SETTINGS))

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.django_settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from bench.common import postmaster, server_cpu  # noqa: E402

#: After the last worker registered: its first beats, the leader's first wake-up calls.
SETTLE_SECONDS = 15.0
CASES = {"notify": {}, "polling": {"NOTIFY": False}}


def _one(sql: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def has_statement_counts() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            cursor.execute("SELECT count(*) FROM pg_stat_statements")
        return True
    except Exception:  # not loaded, or not allowed: reported as n/a
        connection.close()
        return False


def figures(statements: bool) -> dict[str, Any]:
    """This database's counters now."""
    _one("SELECT pg_stat_clear_snapshot()")
    return {
        "at": time.monotonic(),
        "commits": _one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ),
        "statements": _one(
            "SELECT sum(calls)::bigint FROM pg_stat_statements WHERE toplevel AND dbid = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        if statements
        else None,
        "connections": _one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ),
        "cpu": server_cpu(postmaster(_one("SELECT pg_backend_pid()"))),
    }


def start_workers(count: int, pgqueue: dict[str, Any]) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_PGQUEUE": json.dumps(pgqueue)}
    command = [sys.executable, "-m", "django", "pgqueue_worker", "--concurrency", "4"]
    return [
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(count)
    ]


def wait_registered(count: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while _one("SELECT count(*) FROM pgqueue_workers WHERE stopped_at IS NULL") < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"fewer than {count} workers registered within {timeout:g}s")
        time.sleep(1)


def stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def measure(case: str, workers: int, seconds: float, statements: bool) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgqueue_workers")
    processes = start_workers(workers, CASES[case])
    try:
        wait_registered(workers)
        time.sleep(SETTLE_SECONDS)
        before = figures(statements)
        time.sleep(seconds)
        after = figures(statements)
    finally:
        stop(processes)
    elapsed = after["at"] - before["at"]
    # Each figures() call commits 5 transactions and runs 6 statements of its own.
    row = {
        "case": case,
        "workers": workers,
        "commits_per_second": (after["commits"] - before["commits"] - 5) / elapsed,
        "statements_per_second": None,
        "connections": after["connections"],
        "server_cpu_percent": None,
    }
    if statements:
        row["statements_per_second"] = (after["statements"] - before["statements"] - 6) / elapsed
    if before["cpu"] is not None and after["cpu"] is not None:
        row["server_cpu_percent"] = 100 * (after["cpu"] - before["cpu"]) / elapsed
    return row


def _figure(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--cases", default="notify,polling")
    parser.add_argument(
        "--database-url",
        help="a server to run on (a fresh database is made there); default: a durable "
        "server started as bench/run.py starts its own, with pg_stat_statements",
    )
    args = parser.parse_args()
    cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases: {', '.join(sorted(unknown))} (known: notify, polling)")
    call_command("migrate", verbosity=0)
    statements = has_statement_counts()
    rows = [measure(case, args.workers, args.seconds, statements) for case in cases]

    print(
        f"{args.workers} idle `pgqueue_worker --concurrency 4` processes, default settings "
        f"but the case's, counted over {args.seconds:g} s after they settled."
    )
    print()
    print(
        "| case | statements/s | per worker a minute | transactions/s | connections "
        "| server CPU (% of a core) |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        per_minute = (
            None
            if row["statements_per_second"] is None
            else 60 * row["statements_per_second"] / row["workers"]
        )
        print(
            f"| {row['case']} | {_figure(row['statements_per_second'])} "
            f"| {_figure(per_minute)} | {_figure(row['commits_per_second'])} "
            f"| {row['connections']} | {_figure(row['server_cpu_percent'])} |"
        )
    print()
    print(_one("SELECT version()"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
