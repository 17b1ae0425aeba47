"""The admin at millions of jobs: each page's server-side response time, and whether a
query of it reads the whole jobs table.

    python bench/admin_speed.py [--jobs N] [--requests N] [--database-url URL]
        [--results-dir DIR] [--smoke]

On a fresh database (migrated here) of a durable server started as bench/run.py starts
its own, or of ``--database-url``: fills ``pgqueue_jobs`` with ``--jobs`` jobs (2,000,000
by default; 80% completed, 10% failed with errors of four classes, 5% pending, some of
them delayed, 3% cancelled, 2% running; 20 job types in 5 queues; finished over the
last week; and ten older jobs of a queue and job type of their own) and a week of
per-minute rollups, runs ``VACUUM ANALYZE`` (as autovacuum leaves a table at rest), then
requests every admin page and filter as a superuser through Django's test client,
``--requests`` times each after one warm-up request. For each: the median and slowest
response, the queries it ran, and the queries that read at least half of
``pgqueue_jobs`` (by their plans, run with ``EXPLAIN ANALYZE``).

The target (issue 19) is every page under 300 ms with no such scan. ``--smoke`` fills
2,000 jobs and one request each: it checks the script and the pages, not their speed
(the planner scans small tables whole). Writes ``admin-speed.md`` and
``admin-speed.json`` to ``--results-dir`` (default: bench/results/admin-speed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: The issue's target: every page's server-side response.
TARGET_MS = 300.0


if __name__ == "__main__" and not os.environ.get("BENCH_DATABASE_URL"):
    from bench.run import rerun_on_a_fresh_database

    raise SystemExit(rerun_on_a_fresh_database(__file__, "admin_speed"))

os.environ["DJANGO_SETTINGS_MODULE"] = "bench.admin_settings"

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import reverse  # noqa: E402

from django_pgqueue.stored_schedules import save_schedule  # noqa: E402

_FILL = """
INSERT INTO pgqueue_jobs (job_type, queue, data, status, priority, attempts, max_attempts,
                          created_at, run_at, started_at, completed_at, worker_id,
                          last_error, error_class)
SELECT 'bench.type' || (g %% 20),
       'queue' || (g %% 5),
       jsonb_build_object('order_id', g, 'customer', 'customer-' || (g %% 5000),
                          'kind', CASE WHEN g %% 3 = 0 THEN 'billing' ELSE 'shipping' END),
       s.status,
       100 + (g %% 7),
       CASE WHEN s.status = 'failed' THEN 3 WHEN s.status = 'pending' THEN 0 ELSE 1 END,
       3,
       t.at - interval '2 seconds',
       CASE WHEN s.status = 'pending' AND g %% 4 = 0 THEN now() + interval '1 hour'
            ELSE t.at - interval '1 second' END,
       CASE WHEN s.status IN ('completed', 'failed', 'running') THEN t.at - interval '1 second' END,
       CASE WHEN s.status IN ('completed', 'failed', 'cancelled') THEN t.at END,
       CASE WHEN s.status = 'running' THEN 'bench-worker' END,
       e.error,
       -- As the trigger that keeps it would, had the jobs failed one by one.
       pgqueue_error_class(e.error)
  FROM generate_series(1, %(jobs)s) AS g,
       LATERAL (SELECT CASE WHEN g %% 100 < 80 THEN 'completed'
                            WHEN g %% 100 < 90 THEN 'failed'
                            WHEN g %% 100 < 95 THEN 'pending'
                            WHEN g %% 100 < 98 THEN 'cancelled'
                            ELSE 'running' END AS status) AS s,
       LATERAL (SELECT now() - (g::float8 / %(jobs)s) * interval '7 days' AS at) AS t,
       LATERAL (SELECT CASE WHEN s.status = 'failed'
                            THEN (ARRAY['ValueError', 'KeyError', 'TimeoutError',
                                        'ConnectionError'])[g %% 4 + 1]
                                 || ': order ' || g || ' could not be processed'
                            ELSE '' END AS error) AS e
"""

_ROLLUPS = """
INSERT INTO pgqueue_minutes (minute, depths)
SELECT m, jsonb_build_object('queue0', jsonb_build_object('pending', 100, 'scheduled', 5,
                                                          'running', 3, 'waiting', 0))
  FROM generate_series(date_trunc('minute', now()) - interval '7 days',
                       date_trunc('minute', now()), interval '1 minute') AS m;
INSERT INTO pgqueue_minute_jobs (minute, queue, job_type, completed, failed, cancelled,
                                 wait_ms, run_ms)
SELECT m, 'queue' || (k % 5), 'bench.type' || k, 50, 1, 0,
       '{0,0,0,0,0,0,2,5,9,12,8,4,2,1}', '{0,0,0,0,0,0,0,0,0,0,0,0,0,0,3,9,20,9,3}'
  FROM generate_series(date_trunc('minute', now()) - interval '7 days',
                       date_trunc('minute', now()) - interval '1 minute',
                       interval '1 minute') AS m,
       generate_series(0, 19) AS k;
"""


def fill(jobs: int) -> float:
    """Insert the jobs and rollups, and ``VACUUM ANALYZE``; return the seconds it took."""
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(_FILL, {"jobs": jobs})
        for statement in _ROLLUPS.split(";"):
            if statement.strip():
                cursor.execute(statement)
        cursor.execute("VACUUM ANALYZE")  # as autovacuum leaves a table at rest
        cursor.execute(
            "INSERT INTO pgqueue_workers (worker_id, hostname, pid, concurrency)"
            " VALUES ('bench-worker', 'bench', 1, 4)"
        )
        # A queue and a job type of ten jobs, the oldest of all: filters that match few.
        cursor.execute(
            "INSERT INTO pgqueue_jobs (job_type, queue, status, created_at, completed_at)"
            " SELECT 'bench.rare', 'rare', 'completed', now() - interval '8 days',"
            " now() - interval '8 days' FROM generate_series(1, 10)"
        )
    save_schedule("bench-nightly", "bench.noop", "0 3 * * *")
    return time.perf_counter() - started


def pages(jobs: int) -> list[tuple[str, str]]:
    """Every page and filter timed: (label, URL)."""
    page = min(50, jobs // 200)  # of 100 rows: within the list at any size
    changelist = reverse("admin:django_pgqueue_job_changelist")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM pgqueue_jobs WHERE status = 'failed' ORDER BY completed_at DESC LIMIT 1"
        )
        (failed_id,) = cursor.fetchone()
        cursor.execute("SELECT id FROM pgqueue_jobs WHERE status = 'pending' LIMIT 50")
        pending = [str(row[0]) for row in cursor.fetchall()]
    live = reverse("admin:django_pgqueue_job_live") + "?" + "&".join(f"id={i}" for i in pending)
    return [
        ("job list", changelist),
        (f"job list, page {page}", f"{changelist}?p={page}"),
        ("job list, failed", f"{changelist}?status__exact=failed"),
        ("job list, pending", f"{changelist}?status__exact=pending"),
        ("job list, running", f"{changelist}?status__exact=running"),
        ("job list, waiting (none)", f"{changelist}?status__exact=waiting"),
        ("job list, a queue of ten old jobs", f"{changelist}?queue=rare"),
        ("job list, a job type of ten old jobs", f"{changelist}?job_type=bench.rare"),
        ("job list, one queue", f"{changelist}?queue=queue3"),
        ("job list, one job type", f"{changelist}?job_type=bench.type7"),
        ("job list, queue and status", f"{changelist}?queue=queue1&status__exact=failed"),
        ("job list, search order_id=1234", f"{changelist}?q=order_id%3D1234"),
        ("job list, search a job type", f"{changelist}?q=bench.type7"),
        ("job list, search a word", f"{changelist}?q=billing"),
        ("job list, error class", f"{changelist}?status__exact=failed&error=KeyError"),
        ("job list, sorted by run at", f"{changelist}?o=6"),
        ("a failed job's page", reverse("admin:django_pgqueue_job_change", args=[failed_id])),
        ("live endpoint, 50 jobs", live),
        ("queue overview", reverse("admin:django_pgqueue_job_overview")),
        ("charts, hour", reverse("admin:django_pgqueue_job_charts")),
        ("charts, day", reverse("admin:django_pgqueue_job_charts") + "?span=day"),
        ("charts, week", reverse("admin:django_pgqueue_job_charts") + "?span=week"),
        (
            "charts, week, one job type",
            reverse("admin:django_pgqueue_job_charts") + "?span=week&job_type=bench.type3",
        ),
        ("errors", reverse("admin:django_pgqueue_job_errors")),
        ("periodic jobs", reverse("admin:django_pgqueue_job_periodic")),
        ("stored schedules", reverse("admin:django_pgqueue_storedschedule_changelist")),
        ("concurrency limits", reverse("admin:django_pgqueue_concurrencylimit_changelist")),
        ("rate limits", reverse("admin:django_pgqueue_ratelimit_changelist")),
        ("a worker's page", reverse("admin:django_pgqueue_job_worker", args=["bench-worker"])),
    ]


def scans_of_jobs(queries: list[dict[str, Any]]) -> list[str]:
    """The queries that read at least half of ``pgqueue_jobs``, by their plans run with
    ``EXPLAIN ANALYZE`` (rows returned and removed by filters, over every loop, of each
    scan of it): a count bounded by ``LIMIT`` reads only what it counts."""
    found = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE relname = 'pgqueue_jobs'")
        (table_rows,) = cursor.fetchone()
        for query in queries:
            sql = query["sql"]
            if "pgqueue_jobs" not in sql or not sql.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            if _rows_read(plan[0]["Plan"]) >= table_rows / 2:
                found.append(sql)
    return found


def _rows_read(node: dict[str, Any]) -> float:
    """Rows of pgqueue_jobs that a plan's scans read."""
    read = 0.0
    if node.get("Relation Name") == "pgqueue_jobs":
        rows = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
        read += rows * node.get("Actual Loops", 1)
    for child in node.get("Plans", []):
        read += _rows_read(child)
    return read


def measure(client: Client, url: str, requests: int) -> dict[str, Any]:
    """One warm-up request, then ``requests`` timed ones, with the last one's queries."""
    response = client.get(url)
    if response.status_code != 200:
        raise SystemExit(f"{url} answered {response.status_code}")
    times = []
    for _ in range(requests):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            client.get(url)
            times.append((time.perf_counter() - started) * 1000)
    return {
        "median_ms": statistics.median(times),
        "max_ms": max(times),
        "queries": len(captured.captured_queries),
        "scans": scans_of_jobs(captured.captured_queries),
    }


def report(jobs: int, fill_seconds: float, results: dict[str, dict[str, Any]]) -> str:
    slow = [label for label, found in results.items() if found["median_ms"] > TARGET_MS]
    scanning = [label for label, found in results.items() if found["scans"]]
    lines = [
        f"# The admin at {jobs:,} jobs",
        "",
        f"Filled in {fill_seconds:.0f} s. Median and slowest server-side response of each",
        "page (Django's test client, a superuser), the queries it ran, and how many of",
        "them read at least half of `pgqueue_jobs` (by `EXPLAIN ANALYZE`).",
        "",
        "| Page | Median ms | Slowest ms | Queries | Reads of half the jobs or more |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, found in results.items():
        lines.append(
            f"| {label} | {found['median_ms']:.0f} | {found['max_ms']:.0f} | "
            f"{found['queries']} | {len(found['scans'])} |"
        )
    lines += [
        "",
        f"Over {TARGET_MS:.0f} ms: {', '.join(slow) or 'none'}.",
        f"Reading half the jobs or more: {', '.join(scanning) or 'none'}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2_000_000)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--database-url", help="a server to use instead of starting one")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "bench/results/admin-speed")
    parser.add_argument("--smoke", action="store_true", help="2,000 jobs, one request each")
    options = parser.parse_args()
    if options.smoke:
        options.jobs, options.requests = 2_000, 1
    call_command("migrate", verbosity=0)
    fill_seconds = fill(options.jobs)
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)
    results = {}
    for label, url in pages(options.jobs):
        results[label] = measure(client, url, options.requests)
        print(f"{label}: {results[label]['median_ms']:.0f} ms", file=sys.stderr)
    options.results_dir.mkdir(parents=True, exist_ok=True)
    (options.results_dir / "admin-speed.md").write_text(report(options.jobs, fill_seconds, results))
    (options.results_dir / "admin-speed.json").write_text(
        json.dumps({"jobs": options.jobs, "pages": results}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
