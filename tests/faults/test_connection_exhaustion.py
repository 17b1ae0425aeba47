"""Connection exhaustion: other clients take every connection the server allows, and
the workers' own connections are cut, so that they must reconnect into a full server.

They log their failures and retry, without crashing and without losing a job: the jobs
they held are recovered or finished, and once connections are free again the drain
completes. A worker started while the server is full waits for a connection to
register. Runs on a dedicated cluster (conftest.py), never on the suite's shared server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import psycopg

from tests.workers import ROOT, WorkerProcess

from .fleet import Fleet, completed_count, enqueue_sql, execution_figures, wait_until_drained

JOBS = 2000
WORKERS = 2
HOLD_SECONDS = 5.0
DEADLINE = 90.0
SETTINGS = '{"STALE_AFTER": 2, "HEARTBEAT_INTERVAL": 0.3, "RECOVER_INTERVAL": 0.5}'


def take_every_connection(url: str) -> list[psycopg.Connection[Any]]:
    """Open connections until the server refuses one; return them."""
    taken: list[psycopg.Connection[Any]] = []
    while True:
        try:
            taken.append(psycopg.connect(url, autocommit=True, connect_timeout=5))
        except psycopg.OperationalError as exc:
            assert "too many clients" in str(exc) or "remaining connection slots" in str(exc)
            return taken


# An enqueue from Django, as a view would make one, while the server is full.
ENQUEUE = "from django_pgqueue import enqueue\nenqueue('tests.noop', {'during': 'the hold'})"


def enqueue_from_django(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c", ENQUEUE],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_workers_ride_out_a_server_out_of_connections(cluster, figures):
    env = {"DATABASE_URL": cluster.url, "PGQUEUE_TEST_SETTINGS": SETTINGS}
    control = cluster.connect()
    enqueue_sql(control, JOBS, sleep=0.002)
    fleet = Fleet(WORKERS, env=env).start()
    started = time.monotonic()
    hoard: list[psycopg.Connection[Any]] = []
    late = None
    try:
        while completed_count(control) < JOBS // 5 and time.monotonic() < started + 30:
            time.sleep(0.05)
        hoard = take_every_connection(cluster.url)
        ours = [control.info.backend_pid, *(conn.info.backend_pid for conn in hoard)]
        (cut,) = control.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = 'faults' AND pid <> ALL(%s)",
            [ours],
        ).fetchone()
        hoard += take_every_connection(cluster.url)  # the slots the cut freed
        late = WorkerProcess("--worker-id", "late", env=env)
        refused = enqueue_from_django(env)
        at_cut = completed_count(control)
        time.sleep(HOLD_SECONDS)
        during = completed_count(control) - at_cut
        (reconnected,) = control.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'faults' "
            "AND backend_type = 'client backend' AND pid <> ALL(%s)",
            [[control.info.backend_pid, *(conn.info.backend_pid for conn in hoard)]],
        ).fetchone()
        for conn in hoard:
            conn.close()
        hoard = []
        released = time.monotonic()
        wait_until_drained(control, started + DEADLINE, fleet)
        resumed_in = time.monotonic() - released
        fleet.assert_alive()
        assert late.process.poll() is None, late.output()[-3000:]
        registered_by = time.monotonic() + 30
        while time.monotonic() < registered_by:
            (registered,) = control.execute(
                "SELECT count(*) FROM pgqueue_workers WHERE worker_id = 'late'"
            ).fetchone()
            if registered:
                break
            time.sleep(0.1)
        late_registered_in = time.monotonic() - released
        outcome = execution_figures(control)
        (during_the_hold,) = control.execute(
            'SELECT count(*) FROM pgqueue_jobs WHERE data = \'{"during": "the hold"}\''
        ).fetchone()
    finally:
        for conn in hoard:
            conn.close()
        if late is not None:
            late.stop()
        fleet.stop()
        control.close()

    figures(
        workers=WORKERS,
        backends_cut=cut,
        connections_taken=len(ours) - 1,
        worker_connections_during_hold=reconnected,
        completed_during_hold=during,
        resumed_in_seconds=round(resumed_in, 1),
        late_worker_registered_in_seconds=round(late_registered_in, 1),
        **outcome,
    )
    assert cut > 0
    assert outcome["completed"] == JOBS and outcome["lost"] == 0
    assert outcome["overlaps"] == 0
    assert registered == 1  # the worker started while the server was full waited, then ran
    # enqueue() in a full server: Django's OperationalError, which names the cause, and
    # no job.
    assert refused.returncode != 0
    assert "OperationalError" in refused.stderr, refused.stderr[-3000:]
    assert "too many clients" in refused.stderr or "connection slots" in refused.stderr
    assert during_the_hold == 0
