"""The benchmark suite (bench/) keeps working: a smoke run of it, our system only.

The benchmark is not part of the test suite; this runs it at its smallest
(``--smoke``: a few hundred jobs, one run, no peers, no chart) against the test run's
server, so that a change to the package or to bench/ cannot leave it broken unnoticed;
the same for the long-run pruning benchmark (bench/steady.py: 2 rounds of 200 jobs) and
the admin's speed at millions of jobs (bench/admin_speed.py: 2,000 jobs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bench.common import with_database
from bench.run import CEILING_BATCH

ROOT = Path(__file__).resolve().parent.parent


def run_smoke(script: str, results_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<script> --smoke`` on the test run's server, results in ``results_dir``."""
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(
        [
            sys.executable,
            f"bench/{script}",
            "--smoke",
            *args,
            "--database-url",
            os.environ["DATABASE_URL"],
            "--results-dir",
            str(results_dir),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bench_smoke_run_measures_every_workload(tmp_path: Path) -> None:
    result = run_smoke("run.py", tmp_path, "--systems", "pgqueue")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FAILED" not in result.stderr, result.stderr[-3000:]

    report = (tmp_path / "results.md").read_text()
    # The side-by-side table heads the report: every workload of it measured.
    side = report.split("## Side by side", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in side.splitlines() if line.startswith("| django-pgqueue"))
    for cell in row.strip("|").split("|")[2:]:
        assert re.fullmatch(r"[\d,.]+", cell.strip()), row
    enqueue = report.split("## Enqueue and latency", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in enqueue.splitlines() if line.startswith("| django-pgqueue"))
    w1, w2, p50, p99 = (cell.strip() for cell in row.strip("|").split("|")[1:5])
    for cell in (w1, w2, p50, p99):
        assert re.fullmatch(r"[\d,.]+", cell), row
    # The W1 target's figure: our enqueue interleaved with the bare INSERT.
    assert re.search(r"^W1 interleaved with the bare INSERT .*: [\d.]+x \(", report, re.M), report
    draining = report.split("## Draining", 1)[1].split("\n## ", 1)[0]
    drains = [line for line in draining.splitlines() if "threads (`--concurrency" in line]
    assert len(drains) == 2, report  # both ways of spending the slots
    for index, line in enumerate(drains):
        cells = (cell.strip() for cell in line.strip("|").split("|")[2:10])
        w3, w5, slowdown, w6, w9, w9_ratio, w11, w11_ratio = cells
        assert re.fullmatch(r"[\d,.]+", w3), line
        if index == 0:  # --smoke runs W5, W6, W9 and W11 in the first layout only
            assert re.fullmatch(r"[\d,.]+", w5) and re.fullmatch(r"[\d,.]+", w6), line
            assert re.fullmatch(r"[\d.]+x", slowdown), line
            assert re.fullmatch(r"[\d,.]+", w9) and re.fullmatch(r"[\d.]+x", w9_ratio), line
            assert re.fullmatch(r"[\d,.]+", w11) and re.fullmatch(r"[\d.]+x", w11_ratio), line
    # W8: the chord's rate and its ratio to W3, the chain's step-to-step times.
    workflows = report.split("## Workflows (W8)", 1)[1].split("\n## ", 1)[0]
    first = next(line for line in workflows.splitlines() if "threads (`--concurrency" in line)
    chord, ratio, chain_p50, chain_p95 = (cell.strip() for cell in first.strip("|").split("|")[2:6])
    assert re.fullmatch(r"[\d,.]+", chord) and re.fullmatch(r"[\d.]+x", ratio), first
    assert re.fullmatch(r"[\d,.]+", chain_p50) and re.fullmatch(r"[\d,.]+", chain_p95), first
    # Every target is judged; the ones needing peers or pgbench say n/a.
    verdicts = re.findall(r"^(PASS|MISS|n/a )\s", result.stdout, re.MULTILINE)
    assert len(verdicts) == 18, result.stdout[-2000:]
    # W7: async handlers awaiting I/O, one process, with the ratio to our best.
    io_bound = report.split("## I/O-bound jobs (W7)", 1)[1].split("\n## ", 1)[0]
    ours = next(line for line in io_bound.splitlines() if "--async-concurrency 500" in line)
    rate, ratio = (cell.strip() for cell in ours.strip("|").split("|")[2:4])
    assert re.fullmatch(r"[\d,.]+", rate) and ratio == "1.00x", ours
    # W12: no-op jobs in child processes, beside the same on threads.
    isolated = report.split("## Process isolation (W12)", 1)[1].split("\n## ", 1)[0]
    assert "4 child processes" in isolated and "4 threads (W3" in isolated, isolated
    assert "ms of a slot's time per job" in isolated, isolated
    # W10: the rate limit kept, never exceeded in any second.
    assert re.search(r"^PASS  W10 most starts in any second", result.stdout, re.M), result.stdout
    lines = report.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("## Rate limits (W10"))
    kept, peak = (cell.strip() for cell in lines[header + 4].strip("|").split("|")[1:3])
    assert re.fullmatch(r"[\d.]+", kept) and int(peak) <= 20, lines[header + 4]
    assert (tmp_path / "results.json").exists()
    assert not (tmp_path / "chart.png").exists()
    # Each drain's CPU time per job: the workers', and the server's when it runs here.
    figures = json.loads((tmp_path / "results.json").read_text())["figures"]
    cpu = {(f["workload"], f["variant"]): f["values"] for f in figures if "-cpu" in f["workload"]}
    assert all(value > 0 for value in cpu[("W3-worker-cpu", "1x4")]), cpu
    if _server_is_local():
        assert all(value > 0 for value in cpu[("W3-server-cpu", "1x4")]), cpu


def _server_is_local() -> bool:
    from bench.common import postmaster

    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone() or (0,)
        return postmaster(pid) is not None


def test_bench_steady_smoke_run_measures_both_modes(tmp_path: Path) -> None:
    result = run_smoke("steady.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    data = json.loads((tmp_path / "steady.json").read_text())
    retention, kept = data["modes"]
    assert retention["settings"]["RETENTION"] and "RETENTION" not in kept["settings"]
    for mode in (retention, kept):
        assert mode["error"] is None and mode["worker_exit"] == 0, mode
        assert [r["round"] for r in mode["rounds"]] == [1, 2], mode
        assert all(r["rate"] > 0 and r["bytes"] > 0 for r in mode["rounds"]), mode
    # The worker got the settings: it pruned round 1's jobs during the pause.
    assert kept["rounds"][-1]["rows"] == 400
    assert retention["rounds"][-1]["rows"] < 400
    report = (tmp_path / "steady.md").read_text()
    assert report.count("| Round |") == 2, report
    assert "last/first" in result.stdout
    assert not (tmp_path / "steady.png").exists()


def test_the_long_run_judges_its_last_tenth_against_its_first() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import steady

    def pruning(rates: list[float]) -> steady.Mode:
        rounds = [
            {"round": i, "rate": rate, "rows": 100, "bytes": 1, "elapsed": float(i), "jobs": 100}
            for i, rate in enumerate(rates, 1)
        ]
        return steady.Mode("retention", "RETENTION 5 s", {"RETENTION": 5.0}, rounds)

    plan = steady.FULL
    # 20 rounds: the means of two a tenth; only one mode ran (--modes retention).
    kept_up = steady.summary_lines([pruning([1000.0] * 18 + [950.0, 850.0])], plan)
    slowed = steady.summary_lines([pruning([1000.0] * 18 + [900.0, 850.0])], plan)

    assert kept_up[-1].startswith("- PASS with pruning, the last tenth of the rounds drained 0.90x")
    assert slowed[-1].startswith("- MISS with pruning, the last tenth of the rounds drained 0.88x")


def test_admin_speed_smoke_run_times_every_page(tmp_path: Path) -> None:
    result = run_smoke("admin_speed.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    data = json.loads((tmp_path / "admin-speed.json").read_text())
    assert data["jobs"] == 2_000
    pages = data["pages"]
    for page in ("job list", "queue overview", "charts, week", "errors", "a worker's page"):
        assert pages[page]["median_ms"] > 0 and pages[page]["queries"] > 0, page
    report = (tmp_path / "admin-speed.md").read_text()
    assert report.startswith("# The admin at 2,000 jobs")
    assert report.count("\n| ") == len(pages) + 1  # the header and a row per page


def test_cost_smoke_run_measures_each_step_and_the_floor(tmp_path: Path) -> None:
    result = run_smoke("cost.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FAILED" not in result.stderr, result.stderr[-3000:]

    steps = json.loads((tmp_path / "cost.json").read_text())["steps"]
    found = {(s["system"], s["step"], s["layout"]) for s in steps}
    assert found == {
        ("pgqueue", "single", ""),
        ("pgqueue", "bulk", ""),
        ("pgqueue", "drain", "1x4"),
        ("pgqueue", "drain", "1x16"),
        ("floor", "single", ""),
        ("floor", "bulk", ""),
        ("floor", "drain", f"4 clients, batch {CEILING_BATCH}"),
    }
    for step in steps:
        assert step["wal"] > 0, step
        if step["step"] == "drain":
            # Measured from its workers' start: the enqueue before it is left out; each
            # job is updated twice (claimed, completed).
            assert step["inserted"] < step["jobs"] <= step["updated"] / 2, step
            assert step["backends"] >= 1, step
        else:
            assert step["inserted"] == step["jobs"] and step["updated"] == 0, step
    report = (tmp_path / "cost.md").read_text()
    assert report.count("\n| django-pgqueue ") == 4, report  # single, bulk, two drains
    assert re.search(r"^- (PASS|MISS) WAL a job at most 1.3x the floor's, drain 1x4", report, re.M)


def test_scale_smoke_run_drains_in_each_layout(tmp_path: Path) -> None:
    result = run_smoke("scale.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    layouts = json.loads((tmp_path / "scale.json").read_text())["layouts"]
    assert [(layout["processes"], layout["slots"]) for layout in layouts] == [(1, 4), (2, 4)]
    one, two = layouts
    for layout in layouts:
        assert layout["rates"][0] > 0 and layout["worker_us"][0] > 0, layout
        assert 0 < layout["cpu_share"][0] <= 1.5, layout  # a server on this machine
    # Each process holds its own connections: two hold more than one.
    assert one["backends"][0] >= 2 and two["backends"][0] > one["backends"][0], layouts
    report = (tmp_path / "scale.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and "x 4 slots" in line]
    assert len(rows) == 2, report
    assert all(row.rstrip(" |").endswith(("the CPUs", "not the CPUs")) for row in rows), rows


def test_designs_smoke_run_drains_every_design_and_compares_it_with_today(
    tmp_path: Path,
) -> None:
    result = run_smoke("designs.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    designs = json.loads((tmp_path / "designs.json").read_text())["designs"]
    assert list(designs) == ["today", "history", "narrow-claim", "outcomes"]
    for name, measured in designs.items():
        assert measured["single_wal"][0] > 0 and measured["drain_rate"][0] > 0, name
    # The design written to spare the WAL: a job's row written once, narrow rows after.
    assert designs["outcomes"]["drain_wal"][0] < designs["today"]["drain_wal"][0] / 2, designs
    report = (tmp_path / "designs.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(designs)
    assert rows[0].endswith("| 1.00x | 1.00x |"), rows


def test_a_baseline_run_reports_each_figure_as_a_ratio_to_it(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from bench import baseline, report

    figures = []
    for system, scale in (("pgqueue", 1.0), (baseline.NAME, 2.0)):
        for workload, variant in baseline.COMPARED:
            figures.append(report.Figure(system, workload, variant, values=[100.0 / scale]))
    results = report.Results(
        meta={},
        systems=[
            report.SystemInfo("pgqueue", "django-pgqueue"),
            report.SystemInfo(baseline.NAME, "django-pgqueue at abc"),
        ],
        figures=figures,
    )

    rows = report.baseline_targets(results)

    assert [row.measured for row in rows] == [2.0] * len(baseline.COMPARED)
    assert all(row.verdict == "PASS" for row in rows)
    assert "## Against the baseline (django-pgqueue at abc)" in report.markdown(results)
    # The baseline is not a peer of ours.
    peer = next(
        t for t in report.targets(results) if t.name == "W3 vs every Python PostgreSQL peer"
    )
    assert peer.measured is None


def test_the_w3_targets_take_postgresql_and_redis_peers_apart() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import report

    figures = [
        report.Figure("pgqueue", "W3", "1x4", values=[12000.0]),
        report.Figure("oban", "W3", "1x4", values=[1000.0]),
        report.Figure("chancy", "W3", "1x4", values=[3000.0]),
        report.Figure("dramatiq", "W3", "1x4", values=[1500.0]),
        report.Figure("rq", "W3", "simple-4", values=[800.0]),
        report.Figure("rq", "W3", "fork-4", values=[160.0]),
    ]
    results = report.Results(
        meta={},
        systems=[
            report.SystemInfo("pgqueue", "django-pgqueue"),
            report.SystemInfo("oban", "oban"),
            report.SystemInfo("chancy", "Chancy"),
            report.SystemInfo("dramatiq", "Dramatiq on Redis", on_redis=True),
            report.SystemInfo("rq", "RQ on Redis", on_redis=True),
        ],
        figures=figures,
    )

    found = {t.name: t for t in report.targets(results)}

    postgres = found["W3 vs every Python PostgreSQL peer"]
    assert (postgres.measured, postgres.verdict) == (4.0, "MISS")
    assert "chancy 1x4" in postgres.detail
    on_redis = found["W3 vs each Redis-based peer"]
    assert (on_redis.measured, on_redis.verdict) == (8.0, "MISS")
    assert "dramatiq 1x4" in on_redis.detail


def test_the_side_by_side_table_shows_each_systems_best_layout_and_its_durability() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import report

    results = report.Results(
        meta={},
        systems=[
            report.SystemInfo("pgqueue", "django-pgqueue", version="0.1"),
            report.SystemInfo("celery-durable", "Celery on durable Redis", on_redis=True),
            report.SystemInfo("rq", "RQ on Redis", on_redis=True, status="unavailable: no"),
        ],
        figures=[
            report.Figure("pgqueue", "W3", "1x4", values=[12000.0]),
            report.Figure("pgqueue", "W3", "2x2", values=[18000.0, 20000.0]),
            report.Figure("pgqueue", "W4-p99", "1x4", values=[3.0]),
            report.Figure("pgqueue", "W4-p99", "2x2", values=[2.5]),
            report.Figure("celery-durable", "W1", "", values=[1500.0]),
        ],
    )

    rows = report.side_by_side(results)[2:]

    ours = rows[0].split(" | ")
    assert ours[:2] == ["| django-pgqueue 0.1", "PostgreSQL, durable commit"]
    assert ours[4] == "19,000"  # W3: the faster layout, its median
    assert ours[6] == "2.5"  # W4 p99: the lower
    assert ours[2] == "n/a"
    assert rows[1].startswith("| Celery on durable Redis | Redis, `appendfsync always` | 1,500 |")
    assert rows[2].startswith("| RQ on Redis | Redis, no persistence | unavailable: no |")


def test_the_readmes_table_is_the_committed_results() -> None:
    # The README's figures come from bench/results/results.json, never typed by hand.
    check = subprocess.run(
        [sys.executable, "bench/readme_table.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr


def test_w1_is_judged_against_celery_and_w4_p99_against_the_best_peer() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import report

    figures = [
        report.Figure("pgqueue", "W1", "", values=[2000.0]),
        report.Figure("pgqueue", "W1", "prepared", values=[3000.0]),
        report.Figure("celery", "W1", "", values=[2500.0]),
        report.Figure("pgqueue", "W4-p99", "", values=[3.0]),
        report.Figure("celery", "W4-p99", "", values=[1.5]),
        report.Figure("oban", "W4-p99", "", values=[3.2]),
    ]
    results = report.Results(meta={}, systems=[], figures=figures)

    found = {t.name: t for t in report.targets(results)}

    w1 = found["W1 vs Celery's .delay() on Redis without persistence"]
    assert (w1.measured, w1.verdict) == (1.2, "PASS")
    assert "prepared statements" in w1.detail and "durable commit" in w1.detail
    w4 = found["W4 p99 vs the best peer's"]
    assert (w4.measured, w4.verdict) == (2.0, "MISS")
    assert "best: celery 1.5 ms" in w4.detail


def test_a_baseline_run_shows_where_the_cpu_time_per_job_went() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import baseline, report

    figures = [
        report.Figure(system, "W3", "2x2", values=[20000.0])
        for system in ("pgqueue", baseline.NAME)
    ]
    for system, worker, server in (
        ("pgqueue", [33.0, 35.0, 34.0], [42.0]),
        (baseline.NAME, [32.0], [40.0]),
    ):
        figures.append(report.Figure(system, "W3-worker-cpu", "2x2", values=worker))
        figures.append(report.Figure(system, "W3-server-cpu", "2x2", values=server))
    results = report.Results(meta={}, systems=[], figures=figures)

    text = report.markdown(results)

    assert "| W3 2x2 | worker | 34.0 (33.0-35.0) | 32.0 (32.0-32.0) | 1.062x |" in text, text
    assert "| W3 2x2 | server | 42.0 (42.0-42.0) | 40.0 (40.0-40.0) | 1.050x |" in text, text


def test_a_baseline_checkout_is_the_commits_tree_and_hides_the_working_tree(
    tmp_path: Path,
) -> None:
    sys.path.insert(0, str(ROOT))
    from bench import baseline

    commit = baseline.resolve("HEAD")
    source = baseline.checkout(commit, tmp_path)
    path = baseline.harness_path(tmp_path)

    assert (source / "django_pgqueue" / "__init__.py").exists()
    assert sorted(p.name for p in path.iterdir()) == ["bench"]
    assert (path / "bench" / "run.py").exists()


def test_workloads_can_be_chosen_and_unknown_ones_are_refused() -> None:
    sys.path.insert(0, str(ROOT))
    import pytest

    from bench import run

    assert run.parse_args(["--workloads", "w1, W3"]).workloads == {"W1", "W3"}
    assert run.parse_args([]).workloads == set(run.WORKLOADS)
    with pytest.raises(SystemExit):
        run.parse_args(["--workloads", "W99"])


def test_each_run_starts_with_the_next_system() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import report, run

    bench = run.Bench(report.Results(meta={}, systems=[], figures=[]), run.SMOKE)
    bench.systems = ["ours", "before", "peer"]  # type: ignore[list-item]

    orders = [bench.in_turn(number) for number in range(1, 5)]

    assert orders == [
        ["ours", "before", "peer"],
        ["before", "peer", "ours"],
        ["peer", "ours", "before"],
        ["ours", "before", "peer"],
    ]


def run_harness_script(script: str, dsn: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -c script dsn`` from the repository, outside the tests' settings."""
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(
        [sys.executable, "-c", script, dsn],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


IMPORTED_BY_A_DRAIN = """
import sys
from bench.systems import harness_pgqueue as harness
harness.setup_django(sys.argv[1])
harness.load_worker_code()
loaded = set(sys.modules)
harness.enqueue_in_chunks("bench.noop", 50, 50)
from django.core.management import call_command
call_command("pgqueue_worker", "--burst", "--log-level", "ERROR")
print(sorted(name for name in set(sys.modules) - loaded if name.startswith("django_pgqueue")))
"""


@pytest.mark.django_db(transaction=True)
def test_a_timed_drain_imports_none_of_the_workers_code() -> None:
    # A drain is timed from "ready" on: the worker's modules must be imported before,
    # or a working tree, compiled from source at each start, pays for it in the drain.
    from django.db import connection

    dsn = with_database(os.environ["DATABASE_URL"], connection.settings_dict["NAME"])
    result = run_harness_script(IMPORTED_BY_A_DRAIN, dsn)

    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


def test_the_harness_empties_a_baseline_database_that_predates_workflows() -> None:
    # --baseline may name a commit from before the workflow tables existed.
    name = "pgqueue_bench_smoke_old_schema"
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as server:
        server.execute(f"DROP DATABASE IF EXISTS {name}")
        server.execute(f"CREATE DATABASE {name}")
    try:
        dsn = with_database(os.environ["DATABASE_URL"], name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE pgqueue_jobs (id int)")
            conn.execute("INSERT INTO pgqueue_jobs VALUES (1)")
        result = run_harness_script(
            "import sys; from bench.systems import harness_pgqueue as harness; "
            "harness.setup_django(sys.argv[1]); harness._truncate()",
            dsn,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM pgqueue_jobs").fetchone() == (0,)
    finally:
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as server:
            server.execute(f"DROP DATABASE IF EXISTS {name}")
