"""SIGKILL workers while they run a chord of 10,000 jobs: every member and the callback
complete, the callback is released once and never starts before the last member
finished, and nothing of the workflow is left waiting."""

from __future__ import annotations

import os
import random
import time

import pytest

from django_pgqueue import Step, chord

from .fleet import (
    JOB_TYPE,
    Fleet,
    duplicate_runs_by,
    execution_figures,
    kill_as_jobs_complete,
    wait_until_drained,
)

pytestmark = pytest.mark.django_db(transaction=True)

MEMBERS = 10_000
WORKERS = 4
MIN_KILLS = 3
DEADLINE = 90.0  # seconds for the whole workflow, kills included

_CALLBACK_AFTER_MEMBERS = """
SELECT (SELECT min(started_at) FROM testapp_execution WHERE job_id = %(callback)s)
     > (SELECT max(e.finished_at) FROM testapp_execution AS e
          JOIN pgqueue_jobs AS j ON j.id = e.job_id
         WHERE j.workflow_id = %(workflow)s AND j.id <> %(callback)s)
"""


def test_killed_workers_complete_a_chord_and_release_its_callback_once(other_connection, figures):
    seed = int(os.environ.get("PGQUEUE_FAULTS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    workflow = chord(
        [Step(JOB_TYPE, {"sleep": 0.002}) for _ in range(MEMBERS)], Step(JOB_TYPE)
    ).enqueue()
    callback = workflow.jobs[-1]
    fleet = Fleet(WORKERS).start()
    started = time.monotonic()
    deadline = started + DEADLINE
    try:
        kills = kill_as_jobs_complete(other_connection, fleet, MEMBERS, rng, deadline)
        wait_until_drained(other_connection, deadline, fleet)
        elapsed = time.monotonic() - started
        fleet.assert_alive()
        result = execution_figures(other_connection)
        repeated = duplicate_runs_by(other_connection)
        (after_members,) = other_connection.execute(
            _CALLBACK_AFTER_MEMBERS, {"callback": callback.id, "workflow": workflow.id}
        ).fetchone()
        (callback_runs,) = other_connection.execute(
            "SELECT count(*) FROM testapp_execution WHERE job_id = %s", [callback.id]
        ).fetchone()
        (left_waiting,) = other_connection.execute(
            "SELECT count(*) FROM pgqueue_job_waits"
        ).fetchone()
    finally:
        fleet.stop()

    figures(
        **result,
        members=MEMBERS,
        callback_runs=callback_runs,
        workers=WORKERS,
        kills=kills,
        seed=seed,
        seconds=round(elapsed, 1),
    )
    assert result["jobs"] == MEMBERS + 1
    assert result["lost"] == 0, result
    assert result["overlaps"] == 0, result
    assert after_members is True
    assert left_waiting == 0
    # Released once: one job, run once unless the worker running it was killed.
    callback_repeats = [worker for job_id, worker in repeated if job_id == callback.id]
    assert callback_runs == 1 + len(callback_repeats)
    assert {worker for _, worker in repeated} <= set(fleet.killed_ids), repeated
    assert kills >= MIN_KILLS, f"only {kills} kills before the deadline"
