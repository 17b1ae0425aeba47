"""Long-run benchmark of pruning: does ``PGQUEUE["RETENTION"]`` keep W3 steady?

    python bench/steady.py [--rounds N] [--jobs N] [--database-url URL]
                           [--results-dir DIR] [--quick | --smoke]

On the same durable PostgreSQL as bench/run.py (or ``--database-url``), runs two modes,
each in a fresh database: workers pruning finished jobs (``RETENTION`` and
``FAILED_RETENTION`` set) and workers keeping them (the default). Each mode starts one
long-running ``pgqueue_worker --concurrency 4`` and feeds it rounds of no-op jobs
(``enqueue_many``), timing each round's drain and recording the size of the jobs table
after it. Writes ``steady.md``, ``steady.json`` and ``steady.png`` into
``--results-dir``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from bench.run import (  # noqa: E402
    HarnessError,
    add_server_setting_argument,
    drop_database,
    fresh_database,
    git_commit,
    harness,
    log,
    machine,
    postgres,
    server_settings,
    started_server,
)
from bench.systems import harness_pgqueue  # noqa: E402
from django_pgqueue.conf import PgQueueSettings  # noqa: E402

#: The environment variable bench/django_settings.py reads ``PGQUEUE`` from (JSON).
SETTINGS_ENV = "BENCH_PGQUEUE"
SLOTS = 4
CHUNK = 5000
#: How often the end of a drain is looked for.
POLL_SECONDS = 0.05
DEFAULT_HEARTBEAT = PgQueueSettings.HEARTBEAT_INTERVAL
ROUND_TIMEOUT = common.DRAIN_TIMEOUT


@dataclass(frozen=True)
class Plan:
    """How long a run is, and the settings of its two modes."""

    name: str
    rounds: int
    jobs: int
    #: Seconds of idle worker between rounds (0: rounds back to back, constant load).
    pause: float
    retention: float
    #: ``PGQUEUE["HEARTBEAT_INTERVAL"]`` in both modes (None: the package default).
    heartbeat: float | None = None

    def modes(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(name, label, PGQUEUE settings) of each mode, in the order they run."""
        common_settings = {} if self.heartbeat is None else {"HEARTBEAT_INTERVAL": self.heartbeat}
        pruning = {"RETENTION": self.retention, "FAILED_RETENTION": self.retention}
        return [
            ("retention", f"RETENTION {self.retention:g} s", {**common_settings, **pruning}),
            ("none", "no retention (finished jobs kept)", common_settings),
        ]


#: The long run's target: the last tenth of its rounds drain at least this share of
#: the first tenth's rate, with pruning on.
STEADY_TARGET = 0.9
FULL = Plan("full", rounds=30, jobs=20_000, pause=0.0, retention=5.0)
QUICK = Plan("quick", rounds=6, jobs=5_000, pause=0.0, retention=5.0)
#: The modes' names, in the order they run (every plan has the same).
MODE_NAMES = tuple(name for name, _, _ in FULL.modes())
# Rounds this small end long before a default heartbeat (10 s): beats every 0.5 s and a
# pause between rounds let pruning act, so that the smoke run covers it too.
SMOKE = Plan("smoke", rounds=2, jobs=200, pause=3.0, retention=1.0, heartbeat=0.5)


# -- one mode (run in its own process: Django is set up for that mode's database) --------


def _query(sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return cursor.fetchone()


_ACTIVE = f"""
SELECT EXISTS (SELECT 1 FROM {harness_pgqueue.TABLE} WHERE status = 'pending')
    OR EXISTS (SELECT 1 FROM {harness_pgqueue.TABLE} WHERE status IN ('claimed', 'running'))
"""
_STATS = f"""
SELECT (SELECT count(*) FROM {harness_pgqueue.TABLE}),
       pg_total_relation_size('{harness_pgqueue.TABLE}'),
       s.n_dead_tup,
       s.autovacuum_count,
       (SELECT count(*) FROM {harness_pgqueue.TABLE} WHERE status = 'failed')
  FROM pg_stat_user_tables AS s
 WHERE s.relname = '{harness_pgqueue.TABLE}'
"""


def drain_round(jobs: int, worker: subprocess.Popen[str]) -> dict[str, Any]:
    """Enqueue ``jobs`` no-op jobs, wait until none is left to run; time the drain."""
    from django.db import transaction

    # One transaction (of chunks of 5,000): the worker sees the whole round at once, so
    # the drain has a clear start, the commit.
    with transaction.atomic():
        harness_pgqueue.enqueue_in_chunks("bench.noop", jobs, CHUNK)
    (start,) = _query("SELECT extract(epoch FROM clock_timestamp())")
    deadline = time.monotonic() + ROUND_TIMEOUT
    while _query(_ACTIVE)[0]:
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with status {worker.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the round did not drain within {ROUND_TIMEOUT:g}s")
        time.sleep(POLL_SECONDS)
    # The newest finished row is this round's last job: never old enough to be pruned yet.
    (end,) = _query(f"SELECT extract(epoch FROM max(completed_at)) FROM {harness_pgqueue.TABLE}")
    rows, size, dead, autovacuums, failed = _query(_STATS)
    if failed:
        raise RuntimeError(f"{failed} no-op job(s) failed")
    seconds = float(end) - float(start)
    return {
        "worker_rss": resident_memory(worker.pid),
        "jobs": jobs,
        "seconds": seconds,
        "rate": jobs / seconds if seconds > 0 else 0.0,
        "rows": rows,
        "bytes": size,
        "dead_tuples": dead,
        "autovacuums": autovacuums,
    }


def resident_memory(pid: int) -> int | None:
    """The memory process ``pid`` holds now, in bytes (``VmRSS``; None off Linux)."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def run_mode(args: argparse.Namespace) -> None:
    """The body of a mode's process: one worker, ``--rounds`` rounds, one JSON line each."""
    harness_pgqueue.setup_django(args.dsn)
    from django.db import connection

    worker = common.module_command(
        harness_pgqueue.MODULE, "--dsn", args.dsn, "worker", "--slots", str(SLOTS)
    )
    group = common.WorkerGroup.start([worker])
    try:
        group.go()
        started = time.monotonic()
        for number in range(1, args.rounds + 1):
            result = drain_round(args.jobs, group.processes[0])
            elapsed = time.monotonic() - started
            common.emit({"round": number, "elapsed": elapsed, **result})
            if args.pause and number < args.rounds:
                connection.close()  # idle as the worker is
                time.sleep(args.pause)
    finally:
        group.terminate()
    status = group.processes[0].returncode
    common.emit({"worker_exit": status})


# -- the benchmark ----------------------------------------------------------------------


@dataclass
class Mode:
    name: str
    label: str
    settings: dict[str, Any]
    rounds: list[dict[str, Any]]
    worker_exit: int | None = None
    error: str | None = None


def _mode_process(dsn: str, settings: dict[str, Any], plan: Plan) -> Iterator[dict[str, Any]]:
    """Run one mode in a process of its own; yield what it reports, as it reports it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), SETTINGS_ENV: json.dumps(settings)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    command = [
        *(sys.executable, "-m", "bench.steady", "--dsn", dsn),
        *("--rounds", str(plan.rounds), "--jobs", str(plan.jobs), "--pause", str(plan.pause)),
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert process.stdout is not None
    try:
        for line in process.stdout:
            if line.startswith("{"):
                yield json.loads(line)
        if process.wait() != 0:
            raise HarnessError(f"exit status {process.returncode} (its error is above)")
    finally:
        # Its worker must not outlive it, whatever happened.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def measure(
    admin_url: str, plan: Plan, *, keep: bool, only: Sequence[str] = MODE_NAMES
) -> list[Mode]:
    modes = []
    for name, label, settings in plan.modes():
        if name not in only:
            continue
        mode = Mode(name, label, settings, [])
        modes.append(mode)
        dsn = fresh_database(admin_url, f"steady_{name}")
        log(f"{label}: PGQUEUE={settings}, {plan.rounds} rounds of {plan.jobs:,} jobs")
        try:
            harness(sys.executable, harness_pgqueue.MODULE, dsn, "setup", timeout=300)
            for report in _mode_process(dsn, settings, plan):
                if "round" in report:
                    mode.rounds.append(report)
                    log(
                        f"{name} round {report['round']}: {report['rate']:,.0f} jobs/s, "
                        f"{report['rows']:,} rows, {_mb(report['bytes'])}, "
                        f"{report['dead_tuples']:,} dead tuples"
                    )
                else:
                    mode.worker_exit = report.get("worker_exit")
        except (HarnessError, OSError, subprocess.SubprocessError) as exc:
            mode.error = f"error: {exc}"
            log(f"{label}: FAILED: {exc}")
        finally:
            if not keep:
                drop_database(admin_url, dsn)
    return modes


# -- the report -------------------------------------------------------------------------


def _mb(size: int) -> str:
    return f"{size / 1024**2:,.1f} MB"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def warm_up(plan: Plan) -> float:
    """Seconds after a worker's start before pruning can have had an effect: the first
    job must be older than the retention, then a heartbeat must come."""
    heartbeat = DEFAULT_HEARTBEAT if plan.heartbeat is None else plan.heartbeat
    return plan.retention + heartbeat


def verdict(mode: Mode, plan: Plan) -> str:
    """Whether the table stayed bounded once pruning could act: over the rounds ending
    after the warm-up, the second half never held clearly more rows than the first."""
    rows = [r["rows"] for r in mode.rounds if r["elapsed"] >= warm_up(plan)]
    if len(rows) < 4:
        return (
            f"run too short to tell ({len(rows)} round(s) ended after the first "
            f"{warm_up(plan):g} s, when pruning can first have acted; 4 needed)"
        )
    half = len(rows) // 2
    first, second = max(rows[:half]), max(rows[half:])
    if second <= 1.25 * first:
        return f"bounded (at most {first:,} rows, then {second:,}, after the warm-up)"
    return f"growing (at most {first:,} rows, then {second:,}, after the warm-up)"


def summary_lines(modes: list[Mode], plan: Plan) -> list[str]:
    lines = []
    for mode in modes:
        if not mode.rounds:
            lines.append(f"- **{mode.label}**: no round measured ({mode.error or 'no result'})")
            continue
        first, last = mode.rounds[0], mode.rounds[-1]
        enqueued = sum(r["jobs"] for r in mode.rounds)
        text = (
            f"- **{mode.label}**: {first['rate']:,.0f} jobs/s in round 1, "
            f"{last['rate']:,.0f} in round {last['round']}: last/first "
            f"{_ratio(last['rate'], first['rate'])}"
        )
        if len(mode.rounds) >= 6:
            head = sum(r["rate"] for r in mode.rounds[:3]) / 3
            tail = sum(r["rate"] for r in mode.rounds[-3:]) / 3
            text += f" (mean of the last 3 / first 3: {_ratio(tail, head)})"
        text += (
            f"; at most {max(r['rows'] for r in mode.rounds):,} rows and "
            f"{_mb(max(r['bytes'] for r in mode.rounds))} (table and indexes); "
            f"{enqueued - last['rows']:,} of {enqueued:,} jobs pruned by the end; "
            f"table: {verdict(mode, plan)}"
        )
        text += memory_text(mode)
        if mode.error:
            text += f"; {mode.error}"
        if mode.worker_exit not in (0, None):
            text += f"; the worker exited with status {mode.worker_exit}"
        lines.append(text)
    pruning = next((m for m in modes if m.name == "retention" and m.rounds), None)
    if pruning is not None and len(pruning.rounds) >= 10:
        tenth = len(pruning.rounds) // 10
        head = sum(r["rate"] for r in pruning.rounds[:tenth]) / tenth
        tail = sum(r["rate"] for r in pruning.rounds[-tenth:]) / tenth
        verdict_word = "PASS" if tail >= STEADY_TARGET * head else "MISS"
        lines.append(
            f"- {verdict_word} with pruning, the last tenth of the rounds drained "
            f"{_ratio(tail, head)} the first tenth's rate (target at least "
            f"{STEADY_TARGET:g}x): {tail:,.0f} against {head:,.0f} jobs/s, the means of "
            f"{tenth} rounds each."
        )
    if len(modes) != 2:
        return lines
    retained, kept = (m.rounds for m in modes)
    if retained and kept and len(retained) == len(kept):
        lines.append(
            f"- Last round, {modes[0].label} / {modes[1].label}: "
            f"{_ratio(retained[-1]['rate'], kept[-1]['rate'])} the drain rate, "
            f"{_ratio(retained[-1]['bytes'], kept[-1]['bytes'])} the size."
        )
    return lines


def memory_text(mode: Mode) -> str:
    """The worker's memory after the first round and after the last, as the issue
    compares them (RSS after 1,000,000 jobs within 10 % of RSS after 10,000)."""
    first, last = mode.rounds[0].get("worker_rss"), mode.rounds[-1].get("worker_rss")
    if not first or not last:
        return ""
    done = sum(r["jobs"] for r in mode.rounds)
    return (
        f"; the worker held {_mb(first)} after round 1 ({mode.rounds[0]['jobs']:,} jobs) "
        f"and {_mb(last)} after {done:,} jobs: {_ratio(last, first)}"
    )


def settings_line(meta: dict[str, Any]) -> str:
    pairs = ", ".join(f"`{name}` {value}" for name, value in meta["settings"].items())
    return f"Server settings: {pairs}."


def markdown(meta: dict[str, Any], modes: list[Mode], plan: Plan) -> str:
    out = [
        "# Long-run pruning benchmark",
        "",
        f"{meta['started']}, {meta['mode']} mode: {meta['rounds']} rounds of "
        f"{meta['jobs']:,} no-op jobs per mode, 1 worker process x {SLOTS} threads. "
        f"{meta['machine']}; commit {meta['commit']}; {meta['server']}; "
        f"took {meta['duration']}.",
        "",
        "## Summary",
        "",
        *summary_lines(modes, plan),
        "",
        settings_line(meta),
        "",
    ]
    for mode in modes:
        out += [f"## {mode.label}", "", f"`PGQUEUE = {json.dumps(mode.settings)}`", ""]
        if mode.error:
            out += [f"**{mode.error}**", ""]
        out += [
            "| Round | Ended at (s) | Drain (jobs/s) | Seconds | Rows | Table + indexes "
            "| Dead tuples | Autovacuums | Worker RSS |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| {r['round']} | {r['elapsed']:.1f} | {r['rate']:,.0f} | {r['seconds']:.2f} "
            f"| {r['rows']:,} | {_mb(r['bytes'])} | {r['dead_tuples']:,} | {r['autovacuums']} "
            f"| {_mb(r['worker_rss']) if r.get('worker_rss') else '-'} |"
            for r in mode.rounds
        ]
        out.append("")
    out += ["## Notes", "", *(f"- {note}" for note in meta["notes"]), ""]
    return "\n".join(out)


def chart(meta: dict[str, Any], modes: list[Mode], path: Path) -> None:
    """Drain rate per round for both modes, and the table's size beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate_ax, size_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode in modes:
        rounds = [r["round"] for r in mode.rounds]
        rate_ax.plot(rounds, [r["rate"] for r in mode.rounds], marker="o", label=mode.label)
        size_ax.plot(
            rounds, [r["bytes"] / 1024**2 for r in mode.rounds], marker="o", label=mode.label
        )
    rate_ax.set(title="Drain rate", xlabel="round", ylabel="jobs/s")
    rate_ax.set_ylim(bottom=0)
    size_ax.set_ylim(bottom=0)
    size_ax.set(title="pgqueue_jobs, table and indexes", xlabel="round", ylabel="MB")
    for ax in (rate_ax, size_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"django-pgqueue long run, {meta['started']}, {meta['mode']} mode: "
        f"{meta['jobs']:,} jobs per round, 1 worker x {SLOTS} threads",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def notes(plan: Plan) -> list[str]:
    text = [
        "Each mode runs in a fresh database with one `pgqueue_worker --concurrency 4`, "
        "started once and stopped (SIGTERM) after the last round. A round enqueues its jobs "
        f"with `enqueue_many()` in chunks of {CHUNK:,}, in one transaction, and is timed "
        "from that commit to the last job recorded as finished (the database's clock).",
        "The benchmark runs no `ANALYZE` or `VACUUM`: autovacuum works as it would in "
        "production. Rows, size and dead tuples are read right after each drain; dead "
        "tuples come from `pg_stat_user_tables`, which backends update with a delay of up "
        "to a few seconds.",
        "Workers prune on every heartbeat (`HEARTBEAT_INTERVAL`, 10 s by default), for at "
        "most half of it, in batches of 1,000 rows finished more than `RETENTION` ago; "
        "rows finished within the retention, or since the last heartbeat, are still in "
        "the table when a round ends.",
        "A table is called bounded when, over the rounds ending after the warm-up "
        f"(`RETENTION` + `HEARTBEAT_INTERVAL`, {warm_up(plan):g} s after the worker "
        "started, before which nothing can have been pruned), the second half never held "
        "more than 1.25x the most rows of the first half.",
    ]
    if plan.pause:
        text.append(
            f"Rounds are {plan.pause:g} s apart here (back to back in the full and quick "
            "runs), so that pruning acts within so short a run."
        )
    if plan.heartbeat is not None:
        text.append(
            f"`HEARTBEAT_INTERVAL` is {plan.heartbeat:g} s in both modes (10 s by default): "
            "the rounds are too short for a default heartbeat to fall in them."
        )
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="6 rounds of 5,000 jobs")
    size.add_argument(
        "--smoke",
        action="store_true",
        help="2 rounds of 200 jobs, short heartbeats, no chart (what the test suite runs)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds per mode (default: 30)")
    parser.add_argument(
        "--modes",
        default=",".join(MODE_NAMES),
        help="comma-separated, from retention (pruning on) and none (finished jobs kept); "
        "default: both",
    )
    parser.add_argument("--jobs", type=int, default=None, help="jobs per round (default: 20,000)")
    parser.add_argument(
        "--database-url",
        default=None,
        help="use this PostgreSQL server (a role that may create databases) instead of "
        "starting one",
    )
    add_server_setting_argument(parser)
    parser.add_argument(
        "--results-dir",
        default=None,
        help="where to write steady.md/json and steady.png "
        "(default: bench/results; --smoke: nowhere)",
    )
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    parser.add_argument(
        "--keep-databases", action="store_true", help="leave the benchmark databases behind"
    )
    # Internal: run one mode's rounds against this database (see _mode_process).
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--pause", type=float, default=0.0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dsn:
        run_mode(args)
        return 0
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    plan = replace(plan, rounds=args.rounds or plan.rounds, jobs=args.jobs or plan.jobs)
    if plan.rounds < 1 or plan.jobs < 1:
        raise SystemExit("--rounds and --jobs must be at least 1")
    only = [name.strip() for name in args.modes.split(",") if name.strip()]
    if not only or set(only) - set(MODE_NAMES):
        raise SystemExit(f"--modes: choose from {', '.join(MODE_NAMES)}")
    results_dir = Path(args.results_dir) if args.results_dir else None
    if results_dir is None and not args.smoke:
        results_dir = ROOT / "bench" / "results"

    began = time.monotonic()
    meta: dict[str, Any] = {
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": plan.name,
        "plan": asdict(plan),
        "rounds": plan.rounds,
        "jobs": plan.jobs,
        "machine": machine(),
        "commit": git_commit(),
        "server": "given by --database-url"
        if args.database_url
        else started_server("bench/steady.py", args.server_setting),
        "notes": notes(plan),
    }
    log(f"long-run pruning benchmark: {plan}")
    with postgres(args.database_url, args.server_setting) as admin_url:
        meta["settings"] = server_settings(admin_url)
        modes = measure(admin_url, plan, keep=args.keep_databases, only=only)
    elapsed = int(time.monotonic() - began)
    meta["duration"] = f"{elapsed // 60} min {elapsed % 60} s"

    text = markdown(meta, modes, plan)
    if results_dir:
        data = {"meta": meta, "modes": [asdict(mode) for mode in modes]}
        common.write_results(results_dir, "steady", text, data)
        if not args.no_chart and not args.smoke:
            chart(meta, modes, results_dir / "steady.png")
        log(f"wrote {results_dir}")
    for line in [*summary_lines(modes, plan), settings_line(meta)]:
        print(line)
    return 1 if any(mode.error for mode in modes) else 0


if __name__ == "__main__":
    sys.exit(main())
