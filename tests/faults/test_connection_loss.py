"""``pg_terminate_backend`` on every worker connection mid-drain: workers reconnect on
their own and no job is lost (tests/test_worker.py has the in-thread version)."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from .fleet import (
    Fleet,
    assert_each_ran_once,
    enqueue_sql,
    execution_figures,
    wait_until_drained,
)

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 3000
WORKERS = 3
CUTS = 4
CUT_EVERY = 1.5  # seconds
DEADLINE = 45.0


def test_terminated_backends_lose_no_job(other_connection, figures):
    enqueue_sql(other_connection, JOBS, sleep=0.002)
    fleet = Fleet(WORKERS).start()
    started = time.monotonic()
    terminated = 0
    try:
        for _ in range(CUTS):
            time.sleep(CUT_EVERY)
            row = other_connection.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
            terminated += row[0] if row else 0
        connection.close()  # the test's own Django connection was cut too
        wait_until_drained(other_connection, started + DEADLINE, fleet)
        elapsed = time.monotonic() - started
        fleet.assert_alive()
        result = execution_figures(other_connection)
    finally:
        fleet.stop()

    figures(
        **result,
        workers=WORKERS,
        cuts=CUTS,
        backends_terminated=terminated,
        seconds=round(elapsed, 1),
    )
    # Nobody died: every outcome was eventually written by the worker that ran the job.
    assert_each_ran_once(result, JOBS)
    assert terminated >= CUTS * WORKERS
