"""W3 as the workers grow: the drain's rate with 1, 2, 4 and 8 worker processes, each
with 4 and with 16 slots, and what holds it back.

    python bench/scale.py [--processes 1,2,4,8] [--slots 4,16] [--jobs N] [--runs N]
        [--database-url URL] [--results-dir DIR] [--smoke]

On a durable server started as bench/run.py starts its own (or ``--database-url``'s),
django-pgqueue drains ``--jobs`` no-op jobs (W3, the harness's ``drain``) in every
layout of processes x slots, ``--runs`` times, the layouts interleaved within a run.
For each layout it reports the rate (median, min-max), the CPU time a job of the worker
processes and of the server, the share of the machine's cores those two kept busy
while draining (their CPU time over the drain's time and the machine's cores), and the
most client backends the workers held at once (``pg_stat_activity``, sampled every
10 ms). A layout whose share is near 100 % is bound by the CPUs; one well below it
waits on something else (commits, locks, wake-ups). Prints Markdown; writes scale.md
and scale.json into ``--results-dir`` when given. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import cost  # noqa: E402
from bench import run as bench  # noqa: E402
from bench.common import write_results  # noqa: E402

#: A layout's CPU share at or above which the machine's cores are what bounds it.
CPU_BOUND_SHARE = 0.9


@dataclass
class Layout:
    """Every run of one layout (processes x slots)."""

    processes: int
    slots: int
    rates: list[float] = field(default_factory=list)
    worker_us: list[float] = field(default_factory=list)
    server_us: list[float] = field(default_factory=list)
    cpu_share: list[float] = field(default_factory=list)
    backends: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.processes}x{self.slots}"

    def record(self, result: dict[str, Any], jobs: int, most_backends: int) -> None:
        """Add one drain's result (the harness's ``drain``)."""
        seconds = jobs / result["rate"]
        self.rates.append(result["rate"])
        self.worker_us.append(1e6 * result["worker_cpu"] / jobs)
        self.backends.append(most_backends)
        server = result.get("server_cpu")
        if server is not None:
            self.server_us.append(1e6 * server / jobs)
            busy = result["worker_cpu"] + server
            self.cpu_share.append(busy / (seconds * (os.cpu_count() or 1)))


@contextlib.contextmanager
def most_backends(admin_url: str, dsn: str) -> Iterator[list[int]]:
    """Yield a list that holds, once the block ends, the most client backends connected
    to ``dsn``'s database at once while it ran."""
    found = [0]
    done = threading.Event()
    database = conninfo_to_dict(dsn)["dbname"]

    def sample() -> None:
        with bench._connect(admin_url) as conn:
            while not done.wait(0.01):
                (count,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = %s AND backend_type = 'client backend'",
                    [database],
                ).fetchone()
                found[0] = max(found[0], count)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        done.set()
        thread.join()


def _range(values: Sequence[float], digits: int = 0) -> str:
    if not values:
        return "n/a"
    median = statistics.median(values)
    return f"{median:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def bound_by(layout: Layout) -> str:
    """What holds the layout's rate back, as the CPU share tells."""
    if not layout.cpu_share:
        return "n/a (a server elsewhere: no CPU figure)"
    share = statistics.median(layout.cpu_share)
    if share >= CPU_BOUND_SHARE:
        return "the CPUs"
    return "waits (commits, locks, wake-ups), not the CPUs"


def markdown(layouts: list[Layout], meta: dict[str, Any]) -> str:
    lines = [
        "# W3 as the workers grow",
        "",
        f"{meta['started']}, commit {meta['commit']}. Machine: {meta['machine']}. "
        f"Server: {meta['server']}; PostgreSQL {meta['version']}. {meta['jobs']:,} no-op "
        f"jobs a drain, {meta['runs']} run(s) a layout, the layouts interleaved.",
        "",
        "Rates: jobs a second from `go` to the last job recorded as finished (median, "
        "min-max). CPU: time a job of the worker processes (every thread) and of the "
        "server (every process). Cores busy: the two together over the drain's time and "
        f"the machine's {os.cpu_count()} cores. Backends: the most client connections the "
        "workers held at once.",
        "",
        "| layout | jobs/s | worker CPU (µs a job) | server CPU (µs a job) | cores busy "
        "| backends | bound by |",
        "|---|---|---|---|---|---|---|",
    ]
    for layout in layouts:
        share = [100 * value for value in layout.cpu_share]
        lines.append(
            f"| {layout.processes} process(es) x {layout.slots} slots | "
            f"{_range(layout.rates)} | {_range(layout.worker_us, 1)} | "
            f"{_range(layout.server_us, 1)} | {_range(share)} % | "
            f"{max(layout.backends, default=0)} | {bound_by(layout)} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", default="1,2,4,8", help="worker processes to try")
    parser.add_argument("--slots", default="4,16", help="slots a process to try")
    parser.add_argument("--jobs", type=int, default=None, help="jobs a drain (20,000)")
    parser.add_argument("--runs", type=int, default=None, help="runs a layout (3)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (the test suite's)")
    parser.add_argument("--database-url", default=None, help="use this server instead")
    parser.add_argument("--results-dir", default=None, help="where to write scale.md/json")
    parser.add_argument(
        "--venv-dir",
        default=os.environ.get(
            "PGQUEUE_BENCH_VENVS", str(Path.home() / ".cache" / "pgqueue-bench" / "venvs")
        ),
    )
    args = parser.parse_args(argv)
    args.processes = [int(value) for value in args.processes.split(",")]
    args.slots = [int(value) for value in args.slots.split(",")]
    if args.smoke:
        args.processes, args.slots = args.processes[:2], args.slots[:1]
    args.jobs = args.jobs or (300 if args.smoke else 20_000)
    args.runs = args.runs or (1 if args.smoke else 3)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ours = next(spec for spec in bench.SYSTEMS if spec.name == "pgqueue")
    layouts = [Layout(p, s) for s in args.slots for p in args.processes]
    meta: dict[str, Any] = {
        **bench.script_meta("bench/scale.py", args.database_url),
        "jobs": args.jobs,
        "runs": args.runs,
    }
    with bench.postgres(args.database_url) as admin_url:
        with bench._connect(admin_url) as admin:
            meta["version"] = admin.execute("SHOW server_version").fetchone()[0]
        system = cost.prepare(ours, admin_url, Path(args.venv_dir))
        try:
            for run in range(1, args.runs + 1):
                # Each run starts one layout later: none always drains first.
                turn = (run - 1) % len(layouts)
                for layout in layouts[turn:] + layouts[:turn]:
                    with most_backends(admin_url, system.dsn) as backends:
                        result = system.run(
                            "drain", "--layout", layout.name, "--jobs", str(args.jobs)
                        )
                    layout.record(result, args.jobs, backends[0])
                    bench.log(f"run {run} {layout.name}: {result['rate']:,.0f} jobs/s")
        finally:
            bench.drop_database(admin_url, system.dsn)
    text = markdown(layouts, meta)
    if args.results_dir:
        data = {"meta": meta, "layouts": [asdict(layout) for layout in layouts]}
        write_results(args.results_dir, "scale", text, data)
    print(text)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
