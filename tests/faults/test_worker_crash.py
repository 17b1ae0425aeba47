"""SIGKILL workers mid-drain: every job completes, none runs twice at once, and a job
runs twice only when the worker of its first run died before recording it."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest

from .fleet import Fleet, duplicate_runs_by, enqueue_sql, execution_figures, wait_until_drained

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 10_000
WORKERS = 4
# A worker is killed each time about another tenth of the jobs has completed, up to 80 %:
# tied to progress, not to the clock, so a fast machine cannot finish the drain between
# two kills. The last fifth is left for recovery to finish.
KILL_AT = [tenth / 10 for tenth in range(1, 9)]
MIN_KILLS = 3
DEADLINE = 60.0  # seconds for the whole drain, kills included


def test_killed_workers_lose_no_job_and_never_overlap_runs(other_connection, figures):
    seed = int(os.environ.get("PGQUEUE_FAULTS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    enqueue_sql(other_connection, JOBS, sleep=0.002)
    fleet = Fleet(WORKERS).start()
    started = time.monotonic()
    deadline = started + DEADLINE
    try:
        kills = 0
        for fraction in KILL_AT:
            # Somewhere in this tenth, at random: kills land on workers in every state.
            threshold = (fraction + rng.uniform(-0.04, 0.04)) * JOBS
            if not wait_for_completed(other_connection, threshold, deadline):
                break
            fleet.kill_and_replace(rng.randrange(WORKERS))
            kills += 1
        wait_until_drained(other_connection, deadline, fleet)
        elapsed = time.monotonic() - started
        fleet.assert_alive()
        result = execution_figures(other_connection)
        repeated = duplicate_runs_by(other_connection)
    finally:
        fleet.stop()

    figures(
        **result,
        workers=WORKERS,
        kills=kills,
        seed=seed,
        seconds=round(elapsed, 1),
    )
    assert result["jobs"] == JOBS
    assert result["lost"] == 0, result
    assert result["overlaps"] == 0, result
    # At-least-once: a run is repeated only if its worker was killed before the outcome
    # was written (its transaction had committed, the FINISH had not).
    assert {worker for _, worker in repeated} <= set(fleet.killed_ids), repeated
    assert result["duplicates"] == len(repeated)
    assert kills >= MIN_KILLS, f"only {kills} kills before the deadline"


def wait_for_completed(conn: Any, count: float, deadline: float) -> bool:
    """Wait until at least ``count`` jobs completed; False if the deadline came first."""
    while time.monotonic() < deadline:
        (completed,) = conn.execute(
            "SELECT count(*) FROM pgqueue_jobs WHERE status = 'completed'"
        ).fetchone()
        if completed >= count:
            return True
        time.sleep(0.02)
    return False
