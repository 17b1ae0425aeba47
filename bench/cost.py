"""What each PostgreSQL queue costs the database per job: WAL, statements, transactions,
row versions, backends.

    python bench/cost.py [--systems NAME,...] [--single N] [--bulk N] [--drain N]
        [--batch B] [--database-url URL] [--results-dir DIR] [--smoke]

On a durable server started as bench/run.py starts its own, with ``pg_stat_statements``
loaded (``track=all``) and autovacuum off (or on ``--database-url``'s server), each
system gets a fresh database and takes three steps, one at a time: a single enqueue
(W1's command), a bulk enqueue (W2's) and drains of no-op jobs (W3's) with 4 and with
16 slots. Each step starts after a ``CHECKPOINT``; around it the script reads the
server's counters for that database: the WAL written (``pg_current_wal_lsn``, split by
record type with ``pg_waldump --stats=record`` when the server's files are on this
machine), the statements run (``pg_stat_statements``: those the clients sent, and with
the ones run inside functions), the transactions (``pg_stat_database``), the row
versions written and the share of updates that were HOT (``pg_stat_user_tables``), and
for drains the most client backends the workers held at once (``pg_stat_activity``,
sampled every 10 ms). A drain is measured from the moment its workers are ready until
they exited (bench/common.py's ``cost_mark``): its enqueue is not part of it.

The floor is the same steps in bare SQL on django-pgqueue's table: one ``INSERT`` a
transaction, ``COPY`` in chunks of 5,000, and bench/pgbench/claim_complete.sql with 4
clients claiming ``--batch`` jobs a round. Prints Markdown with each figure's ratio to
the floor and to the best peer, and the targets of issue 28 judged PASS or MISS; writes
cost.md and cost.json into ``--results-dir`` when given. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import run as bench  # noqa: E402
from bench.common import parse_layout, postmaster, server_cpu, write_results  # noqa: E402

SERVER_SETTINGS = (
    "shared_preload_libraries=pg_stat_statements",
    "pg_stat_statements.track=all",
    "autovacuum=off",
)
FLOOR = "floor"
#: Seconds to wait, after the step's clients are gone, for their backends to exit and
#: flush their counters (a backend writes its table counters when it exits).
EXIT_WAIT = 5.0
SAMPLE_EVERY = 0.01
COPY_CHUNK = 5000


@dataclass
class Counters:
    """The server's counters for one database at one moment."""

    lsn: int
    lsn_text: str
    transactions: int
    #: Statements the clients sent (top level), and with those run inside functions;
    #: None without pg_stat_statements.
    statements: int | None
    nested: int | None
    inserted: int
    updated: int
    hot: int
    deleted: int


@dataclass
class Step:
    """What one step cost, in total (divide by ``jobs`` for a job's share)."""

    system: str
    step: str
    layout: str
    jobs: int
    wal: int
    transactions: int
    statements: int | None
    nested: int | None
    inserted: int
    updated: int
    hot: int
    deleted: int
    backends: int | None = None
    #: CPU seconds the server spent (every process of it; None for a server elsewhere).
    server_cpu: float | None = None
    #: WAL record type -> [records, bytes (full-page images included), of which images].
    records: dict[str, list[int]] = field(default_factory=dict)

    def per_job(self, value: int | None) -> float | None:
        return None if value is None else value / self.jobs


class Meter:
    """Reads the counters of one system's database around a step."""

    def __init__(self, admin_url: str, dsn: str, waldump: Path | None) -> None:
        self.admin = bench._connect(admin_url)
        self.db = bench._connect(dsn)
        self.dbname = self.db.info.dbname
        self.admin_url = admin_url
        self.waldump = waldump
        self.has_statements = _has_statements(self.admin)
        self.postmaster = postmaster(self.admin.info.backend_pid)
        #: The server's CPU seconds when the step began, and what the step used.
        self.cpu_at_begin: float | None = None
        self.cpu_used: float | None = None
        self.ours = {self.db.info.backend_pid}
        self.ignored: set[int] = set()
        self.before: Counters | None = None
        self.after: Counters | None = None
        self.backends: int | None = None
        self.sampler: BackendSampler | None = None

    def close(self) -> None:
        if self.sampler is not None:  # a step that failed before its end
            self.sampler.stop()
            self.sampler = None
        self.admin.close()
        self.db.close()

    def clients(self) -> set[int]:
        rows = self.admin.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = %s AND backend_type = 'client backend'",
            [self.dbname],
        )
        return {pid for (pid,) in rows} - self.ours

    def ignore_present(self) -> None:
        """Leave out of the backends count the clients connected now (a harness's own)."""
        self.ignored = self.clients()

    def begin(self, sample: bool) -> None:
        self.admin.execute("CHECKPOINT")
        self.before = self._read()
        self.cpu_at_begin = server_cpu(self.postmaster)
        if sample:
            self.sampler = BackendSampler(self.admin_url, self.dbname, self.ours | self.ignored)
            self.sampler.start()

    def stop(self) -> None:
        """The step ended: read the counters once its backends exited."""
        if self.sampler is not None:
            self.backends = self.sampler.stop()
            self.sampler = None
        self._wait_for_exits()
        self.after = self._read()
        cpu = server_cpu(self.postmaster)
        began = self.cpu_at_begin
        self.cpu_used = None if cpu is None or began is None else cpu - began

    def result(self, system: str, step: str, layout: str, jobs: int) -> Step:
        """What the step between :meth:`begin` and :meth:`stop` cost."""
        before, after = self.before, self.after
        if before is None or after is None:
            raise bench.HarnessError("the step ended without its cost marks")
        self.before = self.after = None

        def delta(name: str) -> Any:
            first, last = getattr(before, name), getattr(after, name)
            return None if first is None or last is None else last - first

        result = Step(
            system,
            step,
            layout,
            jobs,
            wal=after.lsn - before.lsn,
            transactions=delta("transactions"),
            statements=delta("statements"),
            nested=delta("nested"),
            inserted=delta("inserted"),
            updated=delta("updated"),
            hot=delta("hot"),
            deleted=delta("deleted"),
            backends=self.backends,
            server_cpu=self.cpu_used,
        )
        if self.waldump is not None:
            result.records = wal_records(self.waldump, self._wal_dir(), before, after)
        self.ignored = set()
        self.backends = None
        return result

    def _wait_for_exits(self) -> None:
        deadline = time.monotonic() + EXIT_WAIT
        while self.clients() - self.ignored and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the last one's counters, written as it exits

    def _wal_dir(self) -> Path:
        return Path(self.admin.execute("SHOW data_directory").fetchone()[0]) / "pg_wal"

    def _read(self) -> Counters:
        tables = self.db.execute(
            "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), "
            "coalesce(sum(n_tup_hot_upd), 0), coalesce(sum(n_tup_del), 0) "
            "FROM pg_stat_user_tables"
        ).fetchone()
        lsn, lsn_text, transactions = self.admin.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, pg_current_wal_lsn()::text, "
            "xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            [self.dbname],
        ).fetchone()
        statements = nested = None
        if self.has_statements:
            statements, nested = self.admin.execute(
                "SELECT coalesce(sum(calls) FILTER (WHERE toplevel), 0)::bigint, "
                "coalesce(sum(calls), 0)::bigint FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
                [self.dbname],
            ).fetchone()
        self.admin.execute("SELECT pg_stat_clear_snapshot()")
        return Counters(int(lsn), lsn_text, transactions, statements, nested, *map(int, tables))


def _has_statements(conn: Any) -> bool:
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT toplevel FROM pg_stat_statements LIMIT 1")
        return True
    except Exception:  # not loaded, or older than PostgreSQL 14: reported as n/a
        return False


class BackendSampler(threading.Thread):
    """Counts a database's client backends every ``SAMPLE_EVERY`` s; keeps the most."""

    def __init__(self, admin_url: str, dbname: str, ignored: set[int]) -> None:
        super().__init__(daemon=True)
        self.conn = bench._connect(admin_url)
        self.dbname = dbname
        self.ignored = list(ignored)
        self.most = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            count = self.conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                "AND backend_type = 'client backend' AND pid <> ALL (%s)",
                [self.dbname, self.ignored],
            ).fetchone()[0]
            self.most = max(self.most, count)
            self.stopping.wait(SAMPLE_EVERY)

    def stop(self) -> int:
        self.stopping.set()
        self.join()
        self.conn.close()
        return self.most


RECORD = re.compile(
    r"^(\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)"
)


def wal_records(
    waldump: Path, wal_dir: Path, before: Counters, after: Counters
) -> dict[str, list[int]]:
    """The WAL between two readings by record type (``pg_waldump --stats=record``):
    type -> [records, bytes with full-page images, bytes of images]; empty when the
    files cannot be read here."""
    if not wal_dir.is_dir():
        return {}
    done = subprocess.run(
        [
            str(waldump),
            "--stats=record",
            "-p",
            str(wal_dir),
            "-s",
            before.lsn_text,
            "-e",
            after.lsn_text,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    records: dict[str, list[int]] = {}
    for line in done.stdout.splitlines():
        match = RECORD.match(line)
        if match and match.group(1) != "Total":
            kind, count, _, images, combined = match.groups()
            records[kind] = [int(count), int(combined), int(images)]
    return records


def find_waldump(admin: Any) -> Path | None:
    """pg_waldump of the server's major version (the system binaries', else the PATH's);
    None if there is none."""
    candidates = []
    with contextlib.suppress(SystemExit, OSError):
        candidates.append(Path(bench._with_postgres()._system_bindir()) / "pg_waldump")
    found = shutil.which("pg_waldump")
    if found:
        candidates.append(Path(found))
    server = int(admin.execute("SHOW server_version_num").fetchone()[0]) // 10000
    for binary in candidates:
        if binary.exists():
            version = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
            major = re.search(r"(\d+)\.", version.stdout)
            if major and int(major.group(1)) == server:
                return binary
    return None


# -- running the steps ---------------------------------------------------------------


def run_harness(system: bench.Prepared, meter: Meter, args: Sequence[str], marked: bool) -> None:
    """Run one harness command. ``marked``: the step is what lies between its workers'
    ``go`` and ``end`` marks; otherwise the whole command."""
    path = system.spec.harness_path or ROOT
    env = bench.harness_environment(path, {**system.env, "BENCH_COST_MARKS": "1"})
    if not marked:
        meter.ignore_present()
        meter.begin(sample=False)
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen(
            [system.python, "-m", system.spec.module, "--dsn", system.dsn, *args],
            cwd=path,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        assert process.stdin is not None and process.stdout is not None
        with process:
            for line in process.stdout:
                mark = line.strip().removeprefix("cost-mark ")
                if mark == line.strip():
                    continue
                if mark == "start" and marked:
                    meter.ignore_present()
                elif mark == "go" and marked:
                    meter.begin(sample=True)
                elif mark == "end" and marked:
                    meter.stop()
                process.stdin.write("ok\n")
                process.stdin.flush()
        if process.returncode != 0:
            errors.seek(0)
            lines = [line for line in errors.read().splitlines() if line.strip()]
            raise bench.HarnessError(lines[-1][:300] if lines else "harness failed")
    if not marked:
        meter.stop()


def system_steps(
    system: bench.Prepared, meter: Meter, sizes: Sizes, layouts: Sequence[str]
) -> Iterator[Step]:
    name = system.spec.name
    run_harness(system, meter, ["enqueue-single", "--jobs", str(sizes.single)], False)
    yield meter.result(name, "single", "", sizes.single)
    run_harness(system, meter, ["enqueue-bulk", "--jobs", str(sizes.bulk)], False)
    yield meter.result(name, "bulk", "", sizes.bulk)
    for layout in layouts:
        run_harness(system, meter, ["drain", "--layout", layout, "--jobs", str(sizes.drain)], True)
        yield meter.result(name, "drain", layout, sizes.drain)


def floor_steps(floor: bench.Prepared, meter: Meter, sizes: Sizes, batch: int) -> Iterator[Step]:
    """The same steps in bare SQL on django-pgqueue's table."""
    run_harness(floor, meter, ["baseline-insert", "--jobs", str(sizes.single)], False)
    yield meter.result(FLOOR, "single", "", sizes.single)
    meter.db.execute("TRUNCATE pgqueue_jobs CASCADE")
    meter.ignore_present()
    meter.begin(sample=False)
    with bench._connect(floor.dsn) as conn:
        for start in range(0, sizes.bulk, COPY_CHUNK):
            with (
                conn.transaction(),
                conn.cursor().copy("COPY pgqueue_jobs (job_type, data) FROM STDIN") as copy,
            ):
                for i in range(start, min(start + COPY_CHUNK, sizes.bulk)):
                    copy.write_row(("bench.noop", f'{{"i": {i}}}'))
    meter.stop()
    yield meter.result(FLOOR, "bulk", "", sizes.bulk)
    bench.fill_pgbench_jobs(floor.dsn, sizes.drain)
    meter.ignore_present()
    meter.begin(sample=True)
    bench.pgbench_drain(bench.pgbench_binary(), floor.dsn, sizes.drain, batch)
    meter.stop()
    clients = f"{bench.PGBENCH_CLIENTS} clients, batch {batch}"
    yield meter.result(FLOOR, "drain", clients, sizes.drain)


def sixteen_slots(layout: str) -> str:
    """The layout with 16 slots in place of 4 ("1x4" -> "1x16", "4x1" -> "16x1")."""
    processes, slots = parse_layout(layout)
    return f"{processes}x{slots * 4}" if slots >= processes else f"{processes * 4}x{slots}"


# -- the report ----------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    single: int
    bulk: int
    drain: int


STEPS = {
    "single": "Single enqueue (W1: one job a transaction)",
    "bulk": "Bulk enqueue (W2: chunks of 5,000)",
    "drain": "Drain (W3: no-op jobs)",
}


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return "n/a"
    return f"{value / reference:.2f}x"


def best_peer(
    steps: Sequence[Step], step: str, measure: Callable[[Step], float | None]
) -> Step | None:
    """The peer's step with the least of ``measure`` (None when no peer has one)."""
    peers = [
        s
        for s in steps
        if s.step == step and s.system not in ("pgqueue", FLOOR) and measure(s) is not None
    ]
    return min(peers, key=lambda s: measure(s) or 0.0) if peers else None


def _wal(s: Step) -> float | None:
    return s.per_job(s.wal)


def _statements(s: Step) -> float | None:
    return s.per_job(s.statements)


def markdown(steps: Sequence[Step], labels: dict[str, str], meta: dict[str, Any]) -> str:
    lines = [
        "# What a job costs the database",
        "",
        f"{meta['started']}, commit {meta['commit']}. Machine: {meta['machine']}. "
        f"Server: {meta['server']}; PostgreSQL {meta['version']}. {meta['sizes']}",
        "",
        "Per job. *Statements*: those the clients sent (utility ones such as BEGIN and "
        "COMMIT included), then with those run inside functions. *Row versions*: rows "
        "inserted plus rows updated (each update writes a new version); *HOT*: the share "
        "of updates that were heap-only (no index entry). *Backends*: the most client "
        "connections the workers held at once (drains only). *Server CPU*: every process "
        "of the server (`/proc`; n/a for a server elsewhere), checkpoints and the "
        "WAL writer included: a noisy figure, unlike the others.",
    ]
    floor = {s.step: s for s in steps if s.system == FLOOR}
    for step, title in STEPS.items():
        rows = [s for s in steps if s.step == step]
        if not rows:
            continue
        best = best_peer(steps, step, _wal)
        lines += [
            "",
            f"## {title}",
            "",
            "| system | layout | WAL (B) | vs floor | vs best peer | statements | with nested "
            "| transactions | row versions | HOT | deletes | backends | server CPU (µs) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for s in rows:
            hot = None if not s.updated else 100 * s.hot / s.updated
            lines.append(
                f"| {labels.get(s.system, s.system)} | {s.layout or '-'} "
                f"| {_num(s.per_job(s.wal), 0)} "
                f"| {_ratio(_wal(s), _wal(floor[step]) if step in floor else None)} "
                f"| {_ratio(_wal(s), _wal(best) if best else None)} "
                f"| {_num(s.per_job(s.statements), 3)} | {_num(s.per_job(s.nested), 3)} "
                f"| {_num(s.per_job(s.transactions), 3)} "
                f"| {_num(s.per_job(s.inserted + s.updated))} "
                f"| {'n/a' if hot is None else f'{hot:.0f} %'} "
                f"| {_num(s.per_job(s.deleted))} "
                f"| {'-' if s.backends is None else s.backends} "
                f"| {_num(None if s.server_cpu is None else 1e6 * s.server_cpu / s.jobs, 1)} |"
            )
    dumped = [s for s in steps if s.records]
    if dumped:
        lines += [
            "",
            "## Where a job's WAL goes",
            "",
            "`pg_waldump --stats=record` over each step: the record types that make up "
            "nine tenths of it, bytes a job (full-page images included, after the step's "
            "checkpoint) and records a job in brackets.",
            "",
            "| step | system | layout | record types |",
            "|---|---|---|---|",
        ]
        for s in sorted(dumped, key=lambda s: list(STEPS).index(s.step)):
            lines.append(
                f"| {s.step} | {labels.get(s.system, s.system)} | {s.layout or '-'} "
                f"| {_top_records(s)} |"
            )
    lines += ["", "## Targets (issue 28)", "", *targets(steps), ""]
    return "\n".join(lines)


def _top_records(s: Step) -> str:
    ordered = sorted(s.records.items(), key=lambda item: -item[1][1])
    total = sum(value[1] for _, value in ordered) or 1
    shown, seen = [], 0
    for kind, (count, size, _) in ordered:
        if seen >= 0.9 * total:
            break
        seen += size
        shown.append(f"{kind} {size / s.jobs:,.0f} ({count / s.jobs:.2f})")
    return ", ".join(shown)


def targets(steps: Sequence[Step]) -> list[str]:
    """Issue 28's cost targets, each judged on this run's figures."""
    ours = {(s.step, s.layout): s for s in steps if s.system == "pgqueue"}
    floor = {s.step: s for s in steps if s.system == FLOOR}
    lines = []

    def judge(
        label: str, value: float | None, bound: float | None, detail: str, digits: int = 2
    ) -> None:
        if value is None or bound is None:
            lines.append(f"- n/a  {label}: {detail}")
            return
        verdict = "PASS" if value <= bound else "MISS"
        lines.append(
            f"- {verdict} {label}: {value:,.{digits}f} against {bound:,.{digits}f} ({detail})"
        )

    for (step, layout), s in ours.items():
        where = f"{step} {layout}".strip()
        if step in ("drain", "single"):
            best = best_peer(steps, step, _wal)
            judge(
                f"WAL a job at most the best peer's, {where}",
                _wal(s),
                _wal(best) if best else None,
                f"best peer {best.system} {best.layout}".strip() if best else "no peer",
                digits=0,
            )
        if step == "drain" and step in floor:
            judge(
                f"WAL a job at most 1.3x the floor's, {where}",
                _wal(s),
                1.3 * (_wal(floor[step]) or 0),
                f"floor {_wal(floor[step]):,.0f} B",
                digits=0,
            )
        if step in floor:
            bound = _statements(floor[step])
            judge(
                f"statements a job at most 1.2x the floor's, {where}",
                _statements(s),
                None if bound is None else 1.2 * bound,
                f"floor {_num(bound, 4)}",
                digits=4,
            )
        if step == "drain" and s.backends is not None:
            processes, slots = parse_layout(layout)
            judge(
                f"connections at most 2 a process plus one a slot, {where}",
                s.backends,
                processes * 2 + processes * slots,
                "every slot runs a job whose completion touches the database",
                digits=0,
            )
    return lines


# -- main ----------------------------------------------------------------------------

DEFAULT = Sizes(single=2_000, bulk=20_000, drain=10_000)
SMOKE = Sizes(single=50, bulk=200, drain=200)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    postgres_peers = [s.name for s in bench.SYSTEMS if s.redis is None and s.name != "pgqueue"]
    parser.add_argument(
        "--systems",
        default=None,
        help=f"comma-separated, from pgqueue,{','.join(postgres_peers)},{FLOOR} "
        "(default: all; --smoke: pgqueue,floor)",
    )
    parser.add_argument("--single", type=int, default=None, help="jobs enqueued one by one")
    parser.add_argument("--bulk", type=int, default=None, help="jobs enqueued in bulk")
    parser.add_argument("--drain", type=int, default=None, help="jobs drained per layout")
    parser.add_argument(
        "--batch",
        type=int,
        default=bench.CEILING_BATCH,
        help="jobs the floor's clients claim a round (default: %(default)s, a worker's own "
        "with 4 slots)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (the test suite's)")
    parser.add_argument(
        "--database-url",
        default=None,
        help="use this server (a superuser: CHECKPOINT) instead of starting one; "
        "statements are n/a unless it loads pg_stat_statements",
    )
    parser.add_argument("--results-dir", default=None, help="where to write cost.md/json")
    parser.add_argument(
        "--variant-sql",
        action="append",
        default=[],
        metavar="SQL",
        help="a statement run on django-pgqueue's and the floor's databases after their "
        "setup, to measure a variant of the schema (repeatable; recorded in the report), "
        "e.g. 'ALTER TABLE pgqueue_jobs SET (fillfactor = 70)'",
    )
    parser.add_argument(
        "--venv-dir",
        default=os.environ.get(
            "PGQUEUE_BENCH_VENVS", str(Path.home() / ".cache" / "pgqueue-bench" / "venvs")
        ),
    )
    args = parser.parse_args(argv)
    known = ["pgqueue", *postgres_peers, FLOOR]
    default = "pgqueue,floor" if args.smoke else ",".join(known)
    args.systems = [n.strip() for n in (args.systems or default).split(",") if n.strip()]
    unknown = sorted(set(args.systems) - set(known))
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {known}")
    base = SMOKE if args.smoke else DEFAULT
    args.sizes = Sizes(args.single or base.single, args.bulk or base.bulk, args.drain or base.drain)
    return args


def prepare(
    spec: bench.SystemSpec, admin_url: str, venv_dir: Path, variant: Sequence[str] = ()
) -> bench.Prepared:
    """Install, create a database for and set up one system; then run ``variant``'s
    statements there (django-pgqueue's schema and the floor's only)."""
    python = bench.ensure_venv(spec, venv_dir)
    dsn = bench.fresh_database(admin_url, f"cost_{spec.name}")
    path = spec.harness_path or ROOT
    bench.harness(python, spec.module, dsn, "setup", timeout=300, path=path)
    if variant and spec.name == "pgqueue":
        with bench._connect(dsn) as conn:
            for statement in variant:
                conn.execute(statement)
    return bench.Prepared(spec, python, dsn, history="", layouts=dict(spec.layouts))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ours = next(spec for spec in bench.SYSTEMS if spec.name == "pgqueue")
    specs = [
        ours if name == FLOOR else next(spec for spec in bench.SYSTEMS if spec.name == name)
        for name in args.systems
    ]
    sizes: Sizes = args.sizes
    steps: list[Step] = []
    labels = {FLOOR: "bare SQL (floor)"}
    meta: dict[str, Any] = {
        **bench.script_meta("bench/cost.py", args.database_url, SERVER_SETTINGS),
        "sizes": f"Single enqueue {sizes.single:,} jobs, bulk {sizes.bulk:,}, drains "
        f"{sizes.drain:,} with 4 and 16 slots; the floor's clients claim {args.batch} a round.",
    }
    if args.variant_sql:
        meta["sizes"] += " Schema variant: " + "; ".join(f"`{sql}`" for sql in args.variant_sql)
    with bench.postgres(args.database_url, SERVER_SETTINGS) as admin_url:
        with bench._connect(admin_url) as admin:
            meta["version"] = admin.execute("SHOW server_version").fetchone()[0]
            waldump = find_waldump(admin)
            if admin.execute("SHOW autovacuum").fetchone()[0] == "on":
                meta["server"] += " (autovacuum on: figures may include its work)"
        for name, spec in zip(args.systems, specs, strict=True):
            bench.log(f"{name}: preparing")
            try:
                system = prepare(spec, admin_url, Path(args.venv_dir), args.variant_sql)
            except (bench.Unavailable, bench.HarnessError) as exc:
                bench.log(f"{name}: unavailable: {exc}")
                continue
            if name != FLOOR:
                version = bench.distribution_version(system.python, spec.distribution)
                labels[name] = f"{spec.label} {version}"
            meter = Meter(admin_url, system.dsn, waldump)
            try:
                first = next(iter(spec.layouts))
                found = (
                    floor_steps(system, meter, sizes, args.batch)
                    if name == FLOOR
                    else system_steps(system, meter, sizes, [first, sixteen_slots(first)])
                )
                for step in found:
                    bench.log(
                        f"{name} {step.step} {step.layout}: {step.wal / step.jobs:,.0f} B WAL a job"
                    )
                    steps.append(step)
            except (bench.HarnessError, OSError, subprocess.SubprocessError) as exc:
                bench.log(f"{name}: FAILED: {exc}")
            finally:
                meter.close()
                bench.drop_database(admin_url, system.dsn)
    text = markdown(steps, labels, meta)
    if args.results_dir:
        data = {"meta": meta, "steps": [asdict(s) for s in steps]}
        write_results(args.results_dir, "cost", text, data)
    print(text)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
