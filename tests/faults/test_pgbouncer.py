"""The whole life of jobs through a real PgBouncer 1.18 in transaction pooling mode.

Many clients share a few server connections there: prepared statements must be off
(Django's default, ``prepare_threshold=None``, which our raw connections inherit) and
LISTEN hears nothing, so workers poll, or LISTEN on ``PGQUEUE['LISTEN_DATABASE']``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from django.db import connections

from django_pgqueue.sideconn import open_raw_connection
from tests.workers import ROOT

from .fleet import Fleet, finish_drain, wait_until_drained

JOBS = 1500
WORKERS = 3
DEADLINE = 45.0


def _enqueue_through(url: str, count: int) -> None:
    """``enqueue_many`` in a Django process whose database is ``url``."""
    code = (
        "from django_pgqueue import enqueue_many; "
        f"enqueue_many([{{'job_type': 'tests.durable'}}] * {count})"
    )
    subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c", code],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": url,
            "PYTHONPATH": str(ROOT),
        },
        check=True,
        timeout=60,
    )


def test_raw_connections_inherit_prepare_threshold_none(db):
    params = connections["default"].get_connection_params()
    assert params["prepare_threshold"] is None
    with open_raw_connection("default") as conn:
        assert conn.prepare_threshold is None


def test_drain_through_pgbouncer_in_transaction_mode_by_polling(cluster, pgbouncer, figures):
    url = pgbouncer.url("faults")
    _enqueue_through(url, JOBS)
    fleet = Fleet(WORKERS, env={"DATABASE_URL": url}).start()
    started = time.monotonic()
    try:
        with cluster.connect() as conn:
            result, elapsed = finish_drain(conn, fleet, started, DEADLINE)
            clients = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = 'faults'"
            ).fetchone()
    finally:
        output = fleet.stop()

    figures(**result, workers=WORKERS, pool_size=3, seconds=round(elapsed, 1))
    assert result["lost"] == 0 and result["overlaps"] == 0 and result["duplicates"] == 0
    assert result["attempts"] == JOBS  # no attempt failed on a shared server connection
    assert "prepared statement" not in output
    assert clients is not None and clients[0] <= 3 + 1  # the pool, and our own connection


def test_listen_database_wakes_workers_behind_pgbouncer(cluster, pgbouncer, figures):
    """With ``LISTEN_DATABASE`` on a direct connection, an idle worker polling every 10s
    starts a new job at once."""
    url = pgbouncer.url("faults")
    settings = {"LISTEN_DATABASE": "direct", "POLL_INTERVAL": 10}
    fleet = Fleet(
        1,
        args=("--concurrency", "2"),
        env={
            "DATABASE_URL": url,
            "PGQUEUE_TEST_DIRECT_URL": cluster.url,
            "PGQUEUE_TEST_SETTINGS": json.dumps(settings),
        },
    ).start()
    try:
        with cluster.connect() as conn:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # idle: registered and LISTENing directly
                listening = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%%'"
                ).fetchone()
                if listening and listening[0]:
                    break
                time.sleep(0.1)
            time.sleep(0.5)
            _enqueue_through(url, 1)
            wait_until_drained(conn, time.monotonic() + 8, fleet)
            latency = conn.execute(
                "SELECT extract(epoch FROM started_at - created_at) FROM pgqueue_jobs"
            ).fetchone()
    finally:
        fleet.stop()
    assert latency is not None
    figures(poll_interval=10, pickup_seconds=round(float(latency[0]), 3))
    assert float(latency[0]) < 2.0
