"""Worker processes under attack, and the figures that tell whether a job was lost or
run twice at once."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tests.workers import WorkerProcess

JOB_TYPE = "tests.durable"


@dataclass
class Fleet:
    """``size`` ``pgqueue_worker`` processes; a killed one is replaced by a new one."""

    size: int
    args: tuple[str, ...] = ("--concurrency", "4", "--poll-interval", "0.2")
    env: dict[str, str] | None = None
    processes: dict[int, WorkerProcess] = field(default_factory=dict)
    generation: int = 0
    killed_ids: list[str] = field(default_factory=list)
    retired: list[WorkerProcess] = field(default_factory=list)
    #: The workers' ids start with it: fleets side by side need different ones.
    prefix: str = "w"

    def _spawn(self, slot: int) -> None:
        self.generation += 1
        worker_id = f"{self.prefix}{slot}-{self.generation}"
        process = WorkerProcess(*self.args, "--worker-id", worker_id, env=self.env)
        process.worker_id = worker_id  # type: ignore[attr-defined]
        self.processes[slot] = process

    def start(self) -> Fleet:
        for slot in range(self.size):
            self._spawn(slot)
        return self

    def kill_and_replace(self, slot: int) -> str:
        """SIGKILL the worker in ``slot`` and start a new one; return the killed id."""
        process = self.processes[slot]
        process.signal(signal.SIGKILL)
        process.wait(timeout=10)
        self.killed_ids.append(process.worker_id)  # type: ignore[attr-defined]
        self.retired.append(process)
        self._spawn(slot)
        return process.worker_id  # type: ignore[attr-defined]

    def restart_dead(self) -> int:
        """Start a new worker in each slot whose process exited, as systemd or Kubernetes
        would; return how many."""
        dead = [slot for slot, p in self.processes.items() if p.process.poll() is not None]
        for slot in dead:
            self.retired.append(self.processes[slot])
            self._spawn(slot)
        return len(dead)

    def assert_alive(self) -> None:
        for process in self.processes.values():
            assert process.process.poll() is None, process.output()[-3000:]

    def outputs(self) -> str:
        return "\n".join(p.output() for p in [*self.retired, *self.processes.values()])

    def stop(self) -> str:
        """Stop every process; return their combined output."""
        output = self.outputs()
        for process in [*self.processes.values(), *self.retired]:
            process.stop()
        return output


def enqueue_sql(
    conn: psycopg.Connection[Any], count: int, sleep: float = 0.0, job_type: str = JOB_TYPE
) -> None:
    """Insert ``count`` due ``tests.durable`` jobs (or ``job_type``) in one statement
    (no NOTIFY: workers find them by polling, as after a restart)."""
    conn.execute(
        "INSERT INTO pgqueue_jobs (job_type, data) "
        "SELECT %s, jsonb_build_object('sleep', %s::float8) FROM generate_series(1, %s)",
        [job_type, sleep, count],
    )


_FIGURES = """
WITH runs AS (
    SELECT job_id, worker_id, started_at, finished_at,
           lead(started_at) OVER (PARTITION BY job_id ORDER BY started_at) AS next_start
      FROM testapp_execution
)
SELECT (SELECT count(*) FROM pgqueue_jobs WHERE job_type = %(t)s),
       (SELECT count(*) FROM pgqueue_jobs WHERE job_type = %(t)s AND status = 'completed'),
       (SELECT count(*) FROM pgqueue_jobs j WHERE job_type = %(t)s
           AND NOT EXISTS (SELECT 1 FROM testapp_execution e WHERE e.job_id = j.id)),
       (SELECT count(*) FROM runs),
       (SELECT count(DISTINCT job_id) FROM runs),
       (SELECT count(*) FROM runs WHERE next_start < finished_at),
       (SELECT coalesce(sum(attempts), 0) FROM pgqueue_jobs WHERE job_type = %(t)s)
"""


def finish_drain(
    conn: psycopg.Connection[Any], fleet: Fleet, started: float, deadline: float
) -> tuple[dict[str, int], float]:
    """Wait until the fleet's drain, begun at ``started`` (``time.monotonic()``), is
    over, ``deadline`` seconds from then at most; check that every worker lived through
    it; return its ``execution_figures()`` and the seconds it took."""
    wait_until_drained(conn, started + deadline, fleet)
    elapsed = time.monotonic() - started
    fleet.assert_alive()
    return execution_figures(conn), elapsed


def execution_figures(conn: psycopg.Connection[Any], job_type: str = JOB_TYPE) -> dict[str, int]:
    """Jobs, completed, lost (not completed or never run), executions, duplicates,
    overlaps (a run of a job starting before its previous run ended), attempts."""
    row = conn.execute(_FIGURES, {"t": job_type}).fetchone()
    assert row is not None
    jobs, completed, never_run, executions, distinct, overlaps, attempts = row
    return {
        "jobs": jobs,
        "completed": completed,
        "lost": jobs - completed + never_run,
        "executions": executions,
        "duplicates": executions - distinct,
        "overlaps": overlaps,
        "attempts": attempts,
    }


def assert_each_ran_once(
    result: dict[str, int],
    jobs: int,
    conn: psycopg.Connection[Any] | None = None,
    outputs: str = "",
) -> None:
    """Of ``execution_figures()``: all ``jobs`` completed, no run of a job began before
    its previous run ended, and no run's writes are there twice. Given ``conn`` (and the
    workers' ``outputs``), a failure tells the story of each job that did not complete."""
    story = f"{result}\n{unfinished_jobs(conn, outputs)}" if conn is not None else result
    assert result["jobs"] == jobs, story
    assert result["lost"] == 0, story
    assert result["overlaps"] == 0, story
    assert result["duplicates"] == 0, story


def unfinished_jobs(
    conn: psycopg.Connection[Any], outputs: str = "", job_type: str = JOB_TYPE
) -> str:
    """Each job of ``job_type`` not completed or never run: its row, its attempts, and
    the lines of the workers' ``outputs`` that name it."""
    jobs = conn.execute(
        "SELECT id, status, attempts, max_attempts, worker_ids, lost_with_worker, "
        "       last_error, created_at, claimed_at, started_at, completed_at"
        "  FROM pgqueue_jobs j WHERE job_type = %s AND (status <> 'completed' OR NOT EXISTS"
        "       (SELECT 1 FROM testapp_execution e WHERE e.job_id = j.id))",
        [job_type],
    ).fetchall()
    lines = []
    for job in jobs:
        lines.append(f"job {job}")
        for attempt in conn.execute(
            "SELECT attempt, worker_id, outcome, started_at, ended_at, error"
            "  FROM pgqueue_job_attempts WHERE job_id = %s ORDER BY id",
            [job[0]],
        ):
            lines.append(f"  attempt {attempt}")
        lines += [f"  log: {line}" for line in outputs.splitlines() if str(job[0]) in line]
    return "\n".join(lines)


def completed_count(conn: psycopg.Connection[Any]) -> int:
    """How many jobs are completed."""
    row = conn.execute("SELECT count(*) FROM pgqueue_jobs WHERE status = 'completed'").fetchone()
    return int(row[0]) if row else 0


def workers_beating_since(conn: psycopg.Connection[Any], fleet: Fleet, moment: float) -> int:
    """How many of ``fleet``'s workers beat after ``moment`` (``time.monotonic()``)."""
    ids = [process.worker_id for process in fleet.processes.values()]  # type: ignore[attr-defined]
    ago = time.monotonic() - moment
    row = conn.execute(
        "SELECT count(*) FROM pgqueue_workers WHERE worker_id = ANY(%s) "
        "AND heartbeat_at > now() - make_interval(secs => %s)",
        [ids, ago],
    ).fetchone()
    return int(row[0]) if row else 0


def duplicate_runs_by(conn: psycopg.Connection[Any]) -> list[tuple[Any, str]]:
    """(job id, worker id) of every run of a job but its last: the runs that were
    repeated, whose workers must have died before recording the outcome."""
    return conn.execute(
        "SELECT job_id, worker_id FROM ("
        "  SELECT job_id, worker_id,"
        "         row_number() OVER (PARTITION BY job_id ORDER BY started_at DESC) AS n"
        "    FROM testapp_execution) runs WHERE n > 1"
    ).fetchall()


def wait_until_drained(
    conn: psycopg.Connection[Any],
    deadline: float,
    fleet: Fleet | None = None,
    job_type: str = JOB_TYPE,
) -> None:
    """Wait until every ``tests.durable`` job (or ``job_type``) is finished, or fail at
    ``deadline``."""
    while time.monotonic() < deadline:
        left = conn.execute(
            "SELECT count(*) FROM pgqueue_jobs WHERE job_type = %s "
            "AND status NOT IN ('completed', 'failed', 'cancelled')",
            [job_type],
        ).fetchone()
        if left is not None and left[0] == 0:
            return
        time.sleep(0.2)
    status = conn.execute("SELECT status, count(*) FROM pgqueue_jobs GROUP BY status").fetchall()
    raise AssertionError(
        f"not drained by the deadline: {status}\n"
        + (fleet.outputs()[-4000:] if fleet is not None else "")
    )


#: A worker is killed each time about another tenth of the jobs has completed, up to
#: 80 %: tied to progress, not to the clock, so a fast machine cannot finish the drain
#: between two kills. The last fifth is left for recovery to finish.
KILL_AT = [tenth / 10 for tenth in range(1, 9)]


def kill_as_jobs_complete(
    conn: psycopg.Connection[Any], fleet: Fleet, jobs: int, rng: Any, deadline: float
) -> int:
    """Kill (and replace) a random worker of ``fleet`` at each fraction of ``KILL_AT``
    of ``jobs`` completed, somewhere in that tenth at random (kills land on workers in
    every state); return how many were killed before ``deadline``."""
    kills = 0
    for fraction in KILL_AT:
        threshold = (fraction + rng.uniform(-0.04, 0.04)) * jobs
        if not wait_for_completed(conn, threshold, deadline):
            break
        fleet.kill_and_replace(rng.randrange(fleet.size))
        kills += 1
    return kills


def wait_for_completed(conn: psycopg.Connection[Any], count: float, deadline: float) -> bool:
    """Wait until at least ``count`` jobs completed; False if the deadline came first."""
    while time.monotonic() < deadline:
        (completed,) = conn.execute(
            "SELECT count(*) FROM pgqueue_jobs WHERE status = 'completed'"
        ).fetchone()
        if completed >= count:
            return True
        time.sleep(0.02)
    return False


@dataclass
class CrashDrain:
    """What a drain through killed workers left: its figures (``execution_figures``),
    the repeated runs (``duplicate_runs_by``), the kills and the seconds it took."""

    figures: dict[str, int]
    repeated: list[tuple[Any, str]]
    kills: int
    seconds: float


def drain_through_kills(
    conn: psycopg.Connection[Any],
    fleet: Fleet,
    jobs: int,
    rng: Any,
    deadline_seconds: float,
    job_type: str = JOB_TYPE,
) -> CrashDrain:
    """Start ``fleet``, kill a worker at each tenth of ``jobs`` completed
    (``kill_as_jobs_complete``), wait until every job is finished, stop the fleet."""
    fleet.start()
    started = time.monotonic()
    deadline = started + deadline_seconds
    try:
        kills = kill_as_jobs_complete(conn, fleet, jobs, rng, deadline)
        wait_until_drained(conn, deadline, fleet, job_type=job_type)
        seconds = time.monotonic() - started
        fleet.assert_alive()
        figures = execution_figures(conn, job_type)
        repeated = duplicate_runs_by(conn)
    finally:
        fleet.stop()
    return CrashDrain(figures, repeated, kills, round(seconds, 1))


def assert_nothing_lost(
    drain: CrashDrain, fleet: Fleet, jobs: int, min_kills: int, *, once: bool
) -> None:
    """Every job completed, no two runs of one job overlapped, and a run was repeated
    only when the worker of the run before was killed before recording it (at least
    once: each repeat is a run whose writes committed before its outcome did). ``once``:
    the handler is atomic, and its completion commits with its writes, so no run's
    writes are there twice (effectively once)."""
    result = drain.figures
    assert result["jobs"] == jobs
    assert result["lost"] == 0, result
    assert result["overlaps"] == 0, result
    assert {worker for _, worker in drain.repeated} <= set(fleet.killed_ids), drain.repeated
    assert result["duplicates"] == len(drain.repeated)
    if once:
        assert result["duplicates"] == 0, drain.repeated
    assert drain.kills >= min_kills, f"only {drain.kills} kills before the deadline"
