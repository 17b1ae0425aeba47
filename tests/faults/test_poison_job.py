"""A poison job: its handler kills the worker process running it (``os._exit``), every
time. It is not retried forever and does not take the fleet down in a loop: each crash
spends one attempt, counted by recovery, and once its attempts are spent recovery fails
it with the reason, while the other jobs keep flowing through the restarted workers.

A job running beside it when it kills the process dies with it and spends an attempt
too, but only once: recovery marks the running jobs it takes back from a dead worker
(``lost_with_worker``, recover_stale_jobs_v4.sql), and a worker holds at most one such
job at a time (claim_job_batch_v10.sql), so the poison never runs again beside a job
that died with it. Before that claim, such a job died with the poison in each of its
attempts and failed with it in about one run in ten (2 of 19), even with recovered jobs
due after a random delay each (recover_stale_jobs_v3.sql). Nothing but the poison may
fail, and nothing may be lost."""

from __future__ import annotations

import json
import time

import pytest

from .fleet import Fleet, enqueue_sql, wait_until_drained

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = 2
JOBS = 500
DEADLINE = 90.0
SETTINGS = {"STALE_AFTER": 1, "HEARTBEAT_INTERVAL": 0.2, "RECOVER_INTERVAL": 0.3}

# How many runs of each other job were lost with its worker, when any was.
_DIED_WITH_A_WORKER = """
SELECT a.job_id, count(*)
  FROM pgqueue_job_attempts AS a
  JOIN pgqueue_jobs AS j ON j.id = a.job_id
 WHERE j.job_type = 'tests.durable' AND a.outcome = 'lost'
 GROUP BY a.job_id
"""


def test_a_job_that_kills_its_worker_ends_failed_and_the_rest_flow(other_connection, figures):
    enqueue_sql(other_connection, JOBS, sleep=0.002)
    (poison_id,) = other_connection.execute(
        "INSERT INTO pgqueue_jobs (job_type, data, max_attempts) "
        "VALUES ('tests.poison', '{}'::jsonb, 3) RETURNING id"
    ).fetchone()
    fleet = Fleet(WORKERS, env={"PGQUEUE_TEST_SETTINGS": json.dumps(SETTINGS)}).start()
    started = time.monotonic()
    deaths = 0
    try:
        while time.monotonic() < started + DEADLINE:
            deaths += fleet.restart_dead()
            (status,) = other_connection.execute(
                "SELECT status FROM pgqueue_jobs WHERE id = %s", [poison_id]
            ).fetchone()
            if status == "failed":
                break
            time.sleep(0.1)
        wait_until_drained(other_connection, started + DEADLINE, fleet)
        elapsed = time.monotonic() - started
        poison = other_connection.execute(
            "SELECT status, attempts, last_error FROM pgqueue_jobs WHERE id = %s", [poison_id]
        ).fetchone()
        lost = other_connection.execute(
            "SELECT count(*) FROM pgqueue_job_attempts WHERE job_id = %s AND outcome = 'lost'",
            [poison_id],
        ).fetchone()[0]
        (completed,) = other_connection.execute(
            "SELECT count(*) FROM pgqueue_jobs WHERE job_type = 'tests.durable' "
            "AND status = 'completed'"
        ).fetchone()
        died = dict(other_connection.execute(_DIED_WITH_A_WORKER).fetchall())
    finally:
        fleet.stop()

    figures(
        jobs=JOBS,
        completed=completed,
        others_lost_with_a_worker=len(died),
        others_died_twice=sum(1 for runs in died.values() if runs > 1),
        poison_status=poison[0],
        poison_attempts=poison[1],
        worker_deaths=deaths,
        workers=WORKERS,
        seconds=round(elapsed, 1),
    )
    status, attempts, last_error = poison
    assert (status, attempts) == ("failed", 3)
    assert "stopped heartbeating" in last_error and "attempt 3 of 3" in last_error
    assert lost == 3  # each attempt is in the job's history, as lost with its worker
    assert deaths == 3  # one worker per attempt, no crash loop after it failed
    assert completed == JOBS  # every other job, none failed with the poison
    # A job that died beside the poison died once: never again beside it.
    assert set(died.values()) <= {1}, died
