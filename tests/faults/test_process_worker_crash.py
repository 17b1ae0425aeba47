"""SIGKILL workers running process-isolated handlers mid-drain: their children die with
them, every job completes, none runs twice at once, and a job runs twice only when the
worker of its first run died before recording it (as tests/faults/test_worker_crash.py,
in child processes)."""

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

JOB_TYPE = "tests.durable_process"
JOBS = 200
WORKERS = 4
MIN_KILLS = 3
DEADLINE = 90.0  # seconds for the whole drain, kills included


def test_killed_workers_with_child_processes_lose_no_job_and_never_overlap_runs(
    other_connection, figures
):
    seed = int(os.environ.get("PGQUEUE_FAULTS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    enqueue_sql(other_connection, JOBS, sleep=0.05, job_type=JOB_TYPE)
    fleet = Fleet(
        WORKERS,
        args=("--concurrency", "1", "--process-concurrency", "2", "--poll-interval", "0.2"),
        env={"PGQUEUE_TEST_PROCESS_JOBS": "1"},
    ).start()
    started = time.monotonic()
    deadline = started + DEADLINE
    try:
        kills = kill_as_jobs_complete(other_connection, fleet, JOBS, rng, deadline)
        wait_until_drained(other_connection, deadline, fleet, job_type=JOB_TYPE)
        elapsed = time.monotonic() - started
        fleet.assert_alive()
        result = execution_figures(other_connection, job_type=JOB_TYPE)
        repeated = duplicate_runs_by(other_connection)
    finally:
        fleet.stop()

    figures(**result, workers=WORKERS, kills=kills, seed=seed, seconds=round(elapsed, 1))
    assert result["jobs"] == JOBS
    assert result["lost"] == 0, result
    assert result["overlaps"] == 0, result
    assert {worker for _, worker in repeated} <= set(fleet.killed_ids), repeated
    assert result["duplicates"] == len(repeated)
    assert kills >= MIN_KILLS, f"only {kills} kills before the deadline"
