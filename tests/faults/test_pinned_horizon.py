"""A session pins the xmin horizon while jobs flow at a steady rate: an ``idle in
transaction`` session holding a transaction id, and a ``REPEATABLE READ`` report holding
a snapshot. Completions keep up with the offered load while it lasts, the workers name
the session, and nothing is lost. A reduced length of issue 22's ten-minute scenario:
``PGQUEUE_FAULTS_PIN_SECONDS`` sets each phase's length (before, pinned, after), and
``PGQUEUE_FAULTS_PINNED_SECONDS`` the pinned one's alone."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import psycopg
import pytest

from .fleet import Fleet

pytestmark = pytest.mark.django_db(transaction=True)

PHASE = float(os.environ.get("PGQUEUE_FAULTS_PIN_SECONDS", "8"))
PINNED = float(os.environ.get("PGQUEUE_FAULTS_PINNED_SECONDS", str(PHASE)))
RATE = 200  # jobs offered a second
TICK = 0.05
WORKERS = 2
SETTINGS = {"HORIZON_WARNING_AFTER": 2, "RECOVER_INTERVAL": 0.5, "HEARTBEAT_INTERVAL": 0.5}

_PHASE_FIGURES = """
SELECT count(*) FILTER (WHERE completed_at >= to_timestamp(%(start)s)
                          AND completed_at < to_timestamp(%(end)s)),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
         FILTER (WHERE created_at >= to_timestamp(%(start)s) AND created_at < to_timestamp(%(end)s))
  FROM pgqueue_jobs
"""

_TABLE = """
SELECT n_dead_tup, pg_total_relation_size('pgqueue_jobs')
  FROM pg_stat_user_tables WHERE relname = 'pgqueue_jobs'
"""


def _pin(conn: psycopg.Connection[Any], how: str) -> None:
    conn.autocommit = False
    if how == "idle in transaction":
        conn.execute("BEGIN")
        conn.execute("SELECT pg_current_xact_id()")  # takes a transaction id, then idles
    else:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM pgqueue_jobs")  # a report's snapshot


class SteadyLoad(threading.Thread):
    """Inserts ``RATE`` no-op jobs a second, in ticks, until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.offered = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        per_tick = int(RATE * TICK)
        with psycopg.connect(self.url, autocommit=True) as conn:
            next_tick = time.monotonic()
            while not self.stopping.is_set():
                conn.execute(
                    "INSERT INTO pgqueue_jobs (job_type, data) "
                    "SELECT 'tests.noop', '{}'::jsonb FROM generate_series(1, %s)",
                    [per_tick],
                )
                self.offered += per_tick
                next_tick += TICK
                time.sleep(max(next_tick - time.monotonic(), 0))


@pytest.mark.parametrize("how", ["idle in transaction", "repeatable read"])
def test_jobs_keep_flowing_while_a_session_pins_the_horizon(other_connection, figures, how):
    url = other_connection.info.dsn
    conn_url = psycopg.conninfo.make_conninfo(url)
    fleet = Fleet(WORKERS, env={"PGQUEUE_TEST_SETTINGS": json.dumps(SETTINGS)}).start()
    load = SteadyLoad(conn_url)
    phases: dict[str, dict[str, Any]] = {}
    pin = psycopg.connect(conn_url)
    try:
        time.sleep(2)  # the workers start
        load.start()
        for phase in ("before", "pinned", "after"):
            if phase == "pinned":
                _pin(pin, how)
            elif phase == "after":
                pin.rollback()
            start = time.time()
            time.sleep(PINNED if phase == "pinned" else PHASE)
            (dead, size) = other_connection.execute(_TABLE).fetchone()
            phases[phase] = {"start": start, "end": time.time(), "dead": dead, "size": size}
        load.stopping.set()
        load.join()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            (left,) = other_connection.execute(
                "SELECT count(*) FROM pgqueue_jobs WHERE status <> 'completed'"
            ).fetchone()
            if left == 0:
                break
            time.sleep(0.2)
        fleet.assert_alive()
        pin_pid = pin.info.backend_pid
    finally:
        load.stopping.set()
        pin.close()
        output = fleet.stop()

    result: dict[str, Any] = {
        "how": how,
        "rate_offered": RATE,
        "phase_seconds": PHASE,
        "pinned_seconds": PINNED,
    }
    for phase, window in phases.items():
        completed, p99 = other_connection.execute(_PHASE_FIGURES, window).fetchone()
        seconds = window["end"] - window["start"]
        result[f"{phase}_completed_per_second"] = round(completed / seconds, 1)
        result[f"{phase}_pickup_p99_ms"] = None if p99 is None else round(p99 * 1000, 1)
        result[f"{phase}_dead_tuples"] = window["dead"]
        result[f"{phase}_table_bytes"] = window["size"]
    (jobs, completed) = other_connection.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = 'completed') FROM pgqueue_jobs"
    ).fetchone()
    result.update(jobs=jobs, offered=load.offered, lost=jobs - completed, workers=WORKERS)
    figures(**result)

    assert jobs == load.offered and completed == jobs  # nothing lost
    # Completions keep up with the offered load while the horizon is pinned.
    assert result["pinned_completed_per_second"] >= 0.9 * RATE, result
    assert result["after_completed_per_second"] >= 0.9 * RATE, result
    # The workers named the session.
    assert f"backend pid {pin_pid} " in output and "xmin horizon" in output, output[-3000:]
