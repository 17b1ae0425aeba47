"""Restart PostgreSQL (``pg_ctl restart``, fast then immediate) in the middle of a drain:
workers reconnect without help and no job is lost.

Runs on a dedicated cluster (conftest.py), never on the suite's shared server.
"""

from __future__ import annotations

import time

import pytest

from .fleet import Fleet, assert_each_ran_once, enqueue_sql, finish_drain, wait_until_drained

JOBS = 3000
WORKERS = 3
MODES = ("fast", "immediate")
DEADLINE = 60.0


@pytest.mark.parametrize("modes", [MODES], ids=["fast+immediate"])
def test_database_restarts_lose_no_job(cluster, figures, modes):
    with cluster.connect() as conn:
        enqueue_sql(conn, JOBS, sleep=0.002)
    fleet = Fleet(WORKERS, env={"DATABASE_URL": cluster.url}).start()
    started = time.monotonic()
    try:
        for mode in modes:
            with cluster.connect() as conn:  # wait until the drain is under way
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    done = conn.execute(
                        "SELECT count(*) FROM pgqueue_jobs WHERE status = 'completed'"
                    ).fetchone()
                    if done and done[0] >= JOBS * (modes.index(mode) + 1) // (len(modes) + 2):
                        break
                    time.sleep(0.1)
            cluster.cluster.restart(mode)
        with cluster.connect() as conn:
            result, elapsed = finish_drain(conn, fleet, started, DEADLINE)
    finally:
        output = fleet.stop()

    figures(**result, workers=WORKERS, restarts="+".join(modes), seconds=round(elapsed, 1))
    # A commit the restart cut after it was durable completed its job with it.
    assert_each_ran_once(result, JOBS)
    assert "database unavailable" in output  # the restarts did hit the workers


_ATOMIC_STEP_RUNS = """
SELECT count(*) FILTER (WHERE runs <> 1), coalesce(sum(runs), 0)::bigint
  FROM (SELECT j.id, count(e.id) AS runs
          FROM pgqueue_jobs AS j
          LEFT JOIN testapp_execution AS e
            ON e.job_id = j.id AND e.worker_id = 'step:middle'
         WHERE j.job_type = 'tests.stepped'
         GROUP BY j.id) AS per_job
"""


def test_database_restarts_never_repeat_an_atomic_step(cluster, figures):
    # tests.stepped: three durable steps, the middle one atomic and writing a row. A
    # restart may cut a step's commit, acknowledged or not: the retry finds its
    # checkpoint if it committed, and runs it if it did not; never both.
    jobs = JOBS // 3
    with cluster.connect() as conn:
        enqueue_sql(conn, jobs, job_type="tests.stepped")
    fleet = Fleet(WORKERS, env={"DATABASE_URL": cluster.url}).start()
    started = time.monotonic()
    try:
        for number, mode in enumerate(MODES, 1):
            with cluster.connect() as conn:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    (done,) = conn.execute(
                        "SELECT count(*) FROM pgqueue_job_steps WHERE name = 'middle'"
                    ).fetchone()
                    if done >= jobs * number // (len(MODES) + 2):
                        break
                    time.sleep(0.05)
            cluster.cluster.restart(mode)
        with cluster.connect() as conn:
            wait_until_drained(conn, started + DEADLINE, fleet, job_type="tests.stepped")
            elapsed = time.monotonic() - started
            fleet.assert_alive()
            (completed,) = conn.execute(
                "SELECT count(*) FROM pgqueue_jobs WHERE status = 'completed'"
            ).fetchone()
            not_once, atomic_runs = conn.execute(_ATOMIC_STEP_RUNS).fetchone()
            (plain_runs,) = conn.execute(
                "SELECT count(*) FROM testapp_execution WHERE worker_id IN "
                "('step:first', 'step:last')"
            ).fetchone()
    finally:
        output = fleet.stop()

    figures(
        jobs=jobs,
        completed=completed,
        atomic_step_runs=atomic_runs,
        plain_step_repeats=plain_runs - 2 * jobs,
        workers=WORKERS,
        restarts="+".join(MODES),
        seconds=round(elapsed, 1),
    )
    assert completed == jobs
    assert not_once == 0 and atomic_runs == jobs
    assert "database unavailable" in output
