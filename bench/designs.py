"""What a job would cost the database under each candidate design of the jobs table,
in bare SQL: the measurement behind the choice of issue 28's "hot table" redesign.

    python bench/designs.py [--designs NAME,...] [--single N] [--drain N] [--batch B]
        [--rounds R] [--database-url URL] [--results-dir DIR] [--smoke]

Each design starts from django-pgqueue's migrated schema in a fresh database, changes
it as the design would (``Design.ddl``), and runs the two steps that the WAL targets
name, in bare SQL with nothing of the package on top: ``--single`` enqueues of one job
a transaction, and a drain of ``--drain`` due jobs by pgbench, 4 clients each claiming
up to ``--batch`` jobs a round and recording the previous round's completions in the
same transaction (bench/pgbench/claim_complete.sql's cycle, written for the design).
Around each step: a ``CHECKPOINT``, then the WAL written (``pg_current_wal_insert_lsn``); the
drain's rate is pgbench's. ``--rounds`` rounds, the designs interleaved in each. Writes
designs.md and designs.json into ``--results-dir`` when given. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import run as bench  # noqa: E402
from bench.common import write_results  # noqa: E402

SERVER_SETTINGS = ("autovacuum=off",)
CLAIM_SCRIPT = (ROOT / "bench" / "pgbench" / "claim_complete.sql").read_text()
FINISHED = "('completed', 'failed', 'cancelled')"
#: The indexes of today's table that only finished jobs have entries in.
FINISHED_INDEXES = (
    "idx_jobs_finished",
    "idx_jobs_finished_job_type",
    "idx_jobs_finished_queue",
    "idx_jobs_failed",
)
#: Today's indexes that only jobs waiting, pending or in flight have entries in.
ACTIVE_INDEXES = (
    "idx_jobs_claimable",
    "idx_jobs_keyed",
    "idx_jobs_keyed_in_flight",
    "idx_jobs_lost_in_flight",
    "idx_jobs_waiting",
    "idx_jobs_worker",
    "pgqueue_jobs_unique_key_active",
)
INSERT_JOB = "INSERT INTO pgqueue_jobs (id, job_type, data) VALUES ({id}, 'bench.noop', {data})"
FILL_JOBS = (
    "INSERT INTO pgqueue_jobs (job_type, data, created_at) "
    "SELECT 'bench.noop', jsonb_build_object('i', g), clock_timestamp() "
    "FROM generate_series(1, {jobs}) AS g"
)


@dataclass(frozen=True)
class Design:
    """A candidate layout of the jobs' tables, with the bare SQL of its steps."""

    name: str
    summary: str
    ddl: tuple[str, ...]
    #: One enqueue transaction's statements ({id}: the new job's id, {data}: its payload).
    enqueue: tuple[str, ...]
    #: Statements leaving {jobs} due jobs, analysed afterwards.
    fill: tuple[str, ...]
    #: The pgbench script of one worker cycle (:ids the last round's claim, :batch).
    cycle: str
    #: Completes what the clients' last rounds claimed.
    finish: str
    #: How many jobs finished.
    finished: str
    #: The tables to analyse after a fill.
    tables: tuple[str, ...] = ("pgqueue_jobs",)


TODAY = Design(
    "today",
    "the table as migrated: a job's claim and its completion each write a new version of "
    "its row (with an entry in every index whose condition it meets)",
    ddl=(),
    enqueue=(INSERT_JOB,),
    fill=(FILL_JOBS,),
    cycle=CLAIM_SCRIPT,
    finish="UPDATE pgqueue_jobs SET status = 'completed', progress = 100, "
    "completed_at = now() WHERE worker_id = 'pgbench' AND status = 'running'",
    finished="SELECT count(*) FROM pgqueue_jobs WHERE status = 'completed'",
)

#: History apart: the claim as today; the completion moves the row to a table of
#: finished jobs, which has the finished jobs' indexes (and the hot table no longer has).
_MOVE = """
WITH gone AS (
    DELETE FROM pgqueue_jobs
     WHERE id = ANY (:ids::uuid[]) AND worker_id = 'pgbench' AND status = 'running'
 RETURNING *
)
INSERT INTO pgqueue_history SELECT {columns} FROM gone;
"""
HISTORY = Design(
    "history",
    "finished jobs moved to a table of their own: the claim as today; the completion "
    "deletes the row from the hot table and inserts it, finished, into the history "
    "table, which has the finished jobs' indexes and the payload's GIN index",
    ddl=(
        *(f"DROP INDEX {name}" for name in FINISHED_INDEXES),
        "DROP TRIGGER pgqueue_jobs_delete_steps ON pgqueue_jobs",
        "CREATE TABLE pgqueue_history (LIKE pgqueue_jobs INCLUDING DEFAULTS)",
        "ALTER TABLE pgqueue_history ADD PRIMARY KEY (id)",
        "CREATE INDEX ON pgqueue_history (created_at, id)",
        "CREATE INDEX ON pgqueue_history (completed_at)",
        "CREATE INDEX ON pgqueue_history (queue)",
        "CREATE INDEX ON pgqueue_history (job_type)",
        "CREATE INDEX ON pgqueue_history (job_type, error_class, completed_at) "
        "INCLUDE (queue) WHERE status = 'failed'",
        "CREATE INDEX ON pgqueue_history USING gin (data jsonb_path_ops)",
    ),
    enqueue=(INSERT_JOB,),
    fill=(FILL_JOBS,),
    cycle=CLAIM_SCRIPT.replace(
        CLAIM_SCRIPT[CLAIM_SCRIPT.index("UPDATE pgqueue_jobs\n") : CLAIM_SCRIPT.index("WITH due")],
        _MOVE.lstrip(),
    ),
    finish="WITH gone AS (DELETE FROM pgqueue_jobs WHERE worker_id = 'pgbench' "
    "AND status = 'running' RETURNING *) INSERT INTO pgqueue_history SELECT {columns} "
    "FROM gone",
    finished="SELECT count(*) FROM pgqueue_history WHERE status = 'completed'",
)

#: The narrow tables of a job's way through the queue: waiting its turn, held by a
#: worker, and each attempt's outcome.
_NARROW_TABLES = (
    "CREATE TABLE pgqueue_ready (id uuid PRIMARY KEY, priority integer NOT NULL, "
    "run_at timestamptz NOT NULL, created_at timestamptz NOT NULL, "
    "queue varchar(100) NOT NULL, job_type varchar(200) NOT NULL)",
    "CREATE INDEX ON pgqueue_ready (priority DESC, run_at, created_at)",
    "CREATE TABLE pgqueue_running (id uuid PRIMARY KEY, worker_id varchar(255) NOT NULL, "
    "attempt integer NOT NULL, claimed_at timestamptz NOT NULL, "
    "heartbeat_at timestamptz NOT NULL)",
    "CREATE INDEX ON pgqueue_running (worker_id)",
)
_READY_FROM_JOBS = (
    "INSERT INTO pgqueue_ready SELECT id, priority, run_at, created_at, queue, job_type "
    "FROM pgqueue_jobs"
)
_CLAIM_NARROW = """
WITH due AS (
    SELECT id
      FROM pgqueue_ready
     WHERE run_at <= now()
     ORDER BY priority DESC, run_at, created_at
     LIMIT :batch
       FOR UPDATE SKIP LOCKED
), taken AS (
    DELETE FROM pgqueue_ready AS ready USING due WHERE ready.id = due.id RETURNING ready.id
), claimed AS (
    INSERT INTO pgqueue_running (id, worker_id, attempt, claimed_at, heartbeat_at)
    SELECT id, 'pgbench', 1, now(), now() FROM taken
 RETURNING id
)
SELECT coalesce(array_agg(id), '{}')::text AS ids FROM claimed
\\gset
COMMIT;
"""
_RECORD_OUTCOME = """
WITH done AS (
    DELETE FROM pgqueue_running
     WHERE id = ANY (:ids::uuid[]) AND worker_id = 'pgbench'
 RETURNING id, attempt, worker_id
)
INSERT INTO pgqueue_outcomes (job_id, attempt, status, completed_at, worker_id)
SELECT id, attempt, 'completed', now(), worker_id FROM done;
"""
OUTCOMES = Design(
    "outcomes",
    "the job's row written once, at enqueue, and never updated: the claim moves a narrow "
    "row from a ready table to a running table; the completion deletes it and inserts "
    "a narrow outcome row (status, time, worker) for the attempt; the job table keeps "
    "its primary key, `idx_jobs_created`, the payload's GIN index, and plain indexes on "
    "queue and job type (written once a job)",
    ddl=(
        *(f"DROP INDEX {name}" for name in FINISHED_INDEXES + ACTIVE_INDEXES),
        "CREATE INDEX ON pgqueue_jobs (queue)",
        "CREATE INDEX ON pgqueue_jobs (job_type)",
        "ALTER TABLE pgqueue_jobs SET (fillfactor = 100)",
        *_NARROW_TABLES,
        "CREATE TABLE pgqueue_outcomes (job_id uuid NOT NULL, attempt integer NOT NULL, "
        "status varchar(16) NOT NULL, completed_at timestamptz NOT NULL, "
        "worker_id varchar(255) NOT NULL, result jsonb, error text NOT NULL DEFAULT '', "
        "PRIMARY KEY (job_id, attempt))",
        "CREATE INDEX ON pgqueue_outcomes (completed_at)",
    ),
    enqueue=(
        INSERT_JOB,
        "INSERT INTO pgqueue_ready VALUES ({id}, 100, now(), now(), 'default', 'bench.noop')",
    ),
    fill=(FILL_JOBS, _READY_FROM_JOBS),
    cycle="BEGIN;" + _RECORD_OUTCOME + _CLAIM_NARROW,
    finish=_RECORD_OUTCOME.replace("id = ANY (:ids::uuid[]) AND ", ""),
    finished="SELECT count(*) FROM pgqueue_outcomes WHERE status = 'completed'",
    tables=("pgqueue_jobs", "pgqueue_ready"),
)

_COMPLETE_ROW = """
WITH done AS (
    DELETE FROM pgqueue_running
     WHERE id = ANY (:ids::uuid[]) AND worker_id = 'pgbench'
 RETURNING id, attempt, worker_id
)
UPDATE pgqueue_jobs AS jobs
   SET status = 'completed', progress = 100, completed_at = now(), attempts = done.attempt,
       worker_id = done.worker_id, worker_ids = jobs.worker_ids || to_jsonb(done.worker_id)
  FROM done
 WHERE jobs.id = done.id;
"""
NARROW_CLAIM = Design(
    "narrow-claim",
    "the claim as in `outcomes` (narrow ready and running rows), the outcome written on "
    "the job's row as today: one new version of it a job, at its completion, with the "
    "finished jobs' indexes as today",
    ddl=(
        *(f"DROP INDEX {name}" for name in ACTIVE_INDEXES),
        *_NARROW_TABLES,
    ),
    enqueue=OUTCOMES.enqueue,
    fill=OUTCOMES.fill,
    cycle="BEGIN;" + _COMPLETE_ROW + _CLAIM_NARROW,
    finish=_COMPLETE_ROW.replace("id = ANY (:ids::uuid[]) AND ", ""),
    finished="SELECT count(*) FROM pgqueue_jobs WHERE status = 'completed'",
    tables=OUTCOMES.tables,
)

DESIGNS = {design.name: design for design in (TODAY, HISTORY, NARROW_CLAIM, OUTCOMES)}


@dataclass
class Measured:
    """One design's figures, a value a round."""

    single_wal: list[float] = field(default_factory=list)
    drain_wal: list[float] = field(default_factory=list)
    drain_rate: list[float] = field(default_factory=list)


class Prepared:
    """A design set up in a database of its own, its statements made concrete."""

    def __init__(self, design: Design, admin_url: str) -> None:
        self.design = design
        self.admin_url = admin_url
        self.dsn = bench.fresh_database(admin_url, f"design_{design.name}")
        bench.harness(
            sys.executable, "bench.systems.harness_pgqueue", self.dsn, "setup", timeout=300
        )
        with bench._connect(self.dsn) as conn:
            for statement in design.ddl:
                conn.execute(statement)
            columns = self._history_columns(conn)
        self.cycle = design.cycle.replace("{columns}", columns)
        self.finish = design.finish.replace("{columns}", columns)

    @staticmethod
    def _history_columns(conn: Any) -> str:
        """pgqueue_jobs' columns as a finished row of them reads: the select list that
        moves a running job to the history table, completed."""
        finished = {"status": "'completed'", "progress": "100", "completed_at": "now()"}
        names = conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'pgqueue_jobs' ORDER BY ordinal_position"
        )
        return ", ".join(finished.get(name, f'"{name}"') for (name,) in names)

    def truncate(self, conn: Any) -> None:
        tables = conn.execute(
            "SELECT string_agg(quote_ident(tablename), ', ') FROM pg_tables "
            "WHERE tablename IN ('pgqueue_jobs', 'pgqueue_history', 'pgqueue_ready', "
            "'pgqueue_running', 'pgqueue_outcomes')"
        ).fetchone()[0]
        conn.execute(f"TRUNCATE {tables} CASCADE")

    def wal_of(self, conn: Any, step: Any) -> int:
        """WAL bytes ``step()`` wrote, from a checkpoint (its insert position: a server
        without ``synchronous_commit`` may not have written it out yet)."""
        position = "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
        conn.execute("CHECKPOINT")
        before = conn.execute(position).fetchone()[0]
        step()
        return int(conn.execute(position).fetchone()[0] - before)

    def single(self, jobs: int) -> float:
        """WAL bytes a job of ``jobs`` enqueues, one a transaction."""
        with bench._connect(self.dsn) as conn:
            self.truncate(conn)

            def enqueue() -> None:
                for i in range(jobs):
                    with conn.transaction():
                        for statement in self.design.enqueue:
                            conn.execute(
                                statement.format(id="%(id)s", data="%(data)s"),
                                {"id": _uuid7(), "data": json.dumps({"i": i})},
                            )

            return self.wal_of(conn, enqueue) / jobs

    def drain(self, jobs: int, batch: int) -> tuple[float, float]:
        """WAL bytes a job and jobs a second of a drain of ``jobs`` due jobs."""
        with bench._connect(self.dsn) as conn:
            self.truncate(conn)
            for statement in self.design.fill:
                conn.execute(statement.format(jobs=jobs))
            for table in self.design.tables:
                conn.execute(f"ANALYZE {table}")
            seconds: list[float] = []
            wal = self.wal_of(conn, lambda: seconds.append(self._pgbench(conn, jobs, batch)))
            finished = conn.execute(self.design.finished).fetchone()[0]
        if finished != jobs:
            raise bench.HarnessError(f"{self.design.name}: {finished} of {jobs} jobs finished")
        return wal / jobs, jobs / seconds[0]

    def _pgbench(self, conn: Any, jobs: int, batch: int) -> float:
        per_client = math.ceil(jobs / (bench.PGBENCH_CLIENTS * batch)) + 1
        with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
            script.write(self.cycle)
            script.flush()
            result = subprocess.run(
                [
                    *(bench.pgbench_binary(), "-n", "-M", "extended"),
                    *("-c", str(bench.PGBENCH_CLIENTS), "-j", "2", "-t", str(per_client)),
                    *("-D", f"batch={batch}", "-D", "ids={}", "-f", script.name, self.dsn),
                ],
                capture_output=True,
                text=True,
                timeout=1800,
                check=False,
            )
        match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", result.stdout)
        if result.returncode != 0 or not match:
            lines = (result.stderr or result.stdout).strip().splitlines() or ["pgbench failed"]
            raise bench.HarnessError(f"{self.design.name}: {lines[-1]}")
        seconds = bench.PGBENCH_CLIENTS * per_client / float(match.group(1))
        began = time.perf_counter()
        conn.execute(self.finish)
        return seconds + time.perf_counter() - began


def _uuid7() -> str:
    from django_pgqueue.jobrows import new_job_id

    return str(new_job_id())


def markdown(results: dict[str, Measured], meta: dict[str, Any]) -> str:
    today = results.get(TODAY.name)
    lines = [
        "# What a job costs under each candidate design (bare SQL)",
        "",
        f"{meta['started']}, commit `{meta['commit']}`, {meta['machine']}; {meta['server']}.",
        meta["sizes"],
        "",
        "| Design | Drain WAL (B/job) | Single enqueue WAL (B/job) | Drain (jobs/s) "
        "| Drain WAL vs today | Drain rate vs today |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, measured in results.items():
        wal = statistics.median(measured.drain_wal)
        rate = statistics.median(measured.drain_rate)
        single = statistics.median(measured.single_wal)
        wal_ratio = rate_ratio = ""
        if today and today.drain_wal:
            wal_ratio = f"{wal / statistics.median(today.drain_wal):.2f}x"
            rate_ratio = f"{rate / statistics.median(today.drain_rate):.2f}x"
        lines.append(
            f"| `{name}` | {wal:,.0f} | {single:,.0f} | {rate:,.0f} "
            f"({min(measured.drain_rate):,.0f}-{max(measured.drain_rate):,.0f}) "
            f"| {wal_ratio} | {rate_ratio} |"
        )
    lines += ["", "Designs:", ""]
    lines += [f"- `{name}`: {DESIGNS[name].summary}." for name in results]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--designs", default=",".join(DESIGNS), help="comma-separated")
    parser.add_argument("--single", type=int, default=2000, help="jobs enqueued one by one")
    parser.add_argument("--drain", type=int, default=20000, help="jobs drained a round")
    parser.add_argument("--batch", type=int, default=bench.CEILING_BATCH, help="claim size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (the test suite's)")
    parser.add_argument("--database-url", default=None, help="a superuser's (CHECKPOINT)")
    parser.add_argument("--results-dir", default=None, help="where to write designs.md/json")
    args = parser.parse_args(argv)
    if args.smoke:
        args.single, args.drain, args.rounds = 20, 500, 1
    args.designs = [name.strip() for name in args.designs.split(",") if name.strip()]
    unknown = sorted(set(args.designs) - set(DESIGNS))
    if unknown:
        parser.error(f"unknown designs {unknown}; choose from {list(DESIGNS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    meta: dict[str, Any] = {
        **bench.script_meta("bench/designs.py", args.database_url, SERVER_SETTINGS),
        "sizes": f"{args.rounds} rounds, the designs interleaved; single enqueue "
        f"{args.single:,} jobs; drains of {args.drain:,} jobs by {bench.PGBENCH_CLIENTS} "
        f"pgbench clients claiming up to {args.batch} a round. Each cell: the median.",
    }
    results = {name: Measured() for name in args.designs}
    with bench.postgres(args.database_url, SERVER_SETTINGS) as admin_url:
        prepared = [Prepared(DESIGNS[name], admin_url) for name in args.designs]
        for round_ in range(1, args.rounds + 1):
            for design in prepared:
                measured = results[design.design.name]
                measured.single_wal.append(design.single(args.single))
                wal, rate = design.drain(args.drain, args.batch)
                measured.drain_wal.append(wal)
                measured.drain_rate.append(rate)
                bench.log(
                    f"round {round_} {design.design.name}: single {measured.single_wal[-1]:,.0f}"
                    f" B, drain {wal:,.0f} B a job, {rate:,.0f} jobs/s"
                )
        for design in prepared:
            bench.drop_database(admin_url, design.dsn)
    text = markdown(results, meta)
    if args.results_dir:
        payload = {"meta": meta, "designs": {k: vars(v) for k, v in results.items()}}
        write_results(args.results_dir, "designs", text, payload)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
