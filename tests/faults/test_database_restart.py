"""Restart PostgreSQL (``pg_ctl restart``, fast then immediate) in the middle of a drain:
workers reconnect without help and no job is lost.

Runs on a dedicated cluster (conftest.py), never on the suite's shared server.
"""

from __future__ import annotations

import time

import pytest

from .fleet import Fleet, enqueue_sql, execution_figures, wait_until_drained

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
            wait_until_drained(conn, started + DEADLINE, fleet)
            elapsed = time.monotonic() - started
            fleet.assert_alive()
            result = execution_figures(conn)
    finally:
        output = fleet.stop()

    figures(**result, workers=WORKERS, restarts="+".join(modes), seconds=round(elapsed, 1))
    assert result["jobs"] == JOBS
    assert result["lost"] == 0, result
    assert result["overlaps"] == 0, result
    assert "database unavailable" in output  # the restarts did hit the workers
