"""SIGKILL workers mid-drain: every job completes, none runs twice at once, and a job
runs twice only when the worker of its first run died before recording it."""

from __future__ import annotations

import os
import random
import time

import pytest

from .fleet import (
    Fleet,
    duplicate_runs_by,
    enqueue_sql,
    execution_figures,
    kill_as_jobs_complete,
    wait_until_drained,
)

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 10_000
WORKERS = 4
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
        kills = kill_as_jobs_complete(other_connection, fleet, JOBS, rng, deadline)
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
