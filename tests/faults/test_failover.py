"""Failover (scenario 1): a primary with a streaming standby, workers connected to both
through one multi-host connection string (libpq's ``target_session_attrs=read-write``
finds the one that takes writes). Mid-drain the primary stops hard and the standby is
promoted: the workers find the new primary on their own, and nothing committed is lost
or run twice at once. With synchronous replication nothing acknowledged can be lost;
with asynchronous replication the commits the old primary acknowledged but had not
shipped are gone with it (docs/explanation/guarantees.md#failover)."""

from __future__ import annotations

import glob
import json
import time

import pytest

from tests.availability import unavailable

from .fleet import (
    Fleet,
    assert_each_ran_once,
    completed_count,
    enqueue_sql,
    execution_figures,
    wait_until_drained,
    workers_beating_since,
)
from .replicated import (
    Standby,
    database_url,
    make_synchronous,
    primary_with_database,
    wait_until_streaming,
    writable,
)

JOBS = 3000
WORKERS = 3
DEADLINE = 90.0


@pytest.fixture
def replicated():
    if not glob.glob("/usr/lib/postgresql/*/bin/pg_basebackup"):
        unavailable("no system PostgreSQL (apt-get install postgresql)")
    primary = primary_with_database()
    standby = None
    try:
        standby = Standby(primary).start()
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


#: Jobs enqueued on the old primary while the standby was behind (async-behind).
MARKERS = 10
MARKER = "tests.noop"


@pytest.mark.parametrize("replication", ["sync", "async", "async-behind"])
def test_a_failover_mid_drain_loses_nothing_committed(replicated, figures, replication):
    primary, standby = replicated
    if replication == "sync":
        make_synchronous(primary)
    wait_until_streaming(primary, "sync" if replication == "sync" else "async")
    with writable(database_url(primary)) as conn:
        enqueue_sql(conn, JOBS, sleep=0.002)
    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
    fleet = Fleet(
        WORKERS,
        env={
            "DATABASE_URL": database_url(primary),
            "PGQUEUE_TEST_HOSTS": hosts,
            "PGQUEUE_TEST_SETTINGS": json.dumps({"RESPONSE_TIMEOUT": 5}),
        },
    ).start()
    started = time.monotonic()
    try:
        with writable(database_url(primary)) as conn:
            _wait_for_completed(conn, JOBS // 3)
            if replication == "async-behind":
                # Shipping stops: what the old primary acknowledges from now on is lost
                # with it, the completions of a second's jobs and a few enqueues.
                standby.fall_behind()
                wait_until_streaming(primary, None)
                time.sleep(1)
                for _ in range(MARKERS):
                    conn.execute("INSERT INTO pgqueue_jobs (job_type) VALUES (%s)", [MARKER])
            done_before = completed_count(conn)
        failed_at = time.monotonic()
        primary.stop()  # pg_ctl stop -m immediate: no shutdown checkpoint, no goodbye
        standby.promote()
        promoted = time.monotonic() - failed_at
        with writable(standby.url()) as conn:
            done_at_promotion = completed_count(conn)
            _wait_for_completed(conn, done_at_promotion + 1)
            resumed = time.monotonic() - failed_at
            wait_until_drained(conn, started + DEADLINE)
            elapsed = time.monotonic() - started
            fleet.assert_alive()
            result = execution_figures(conn)
            reconnected = workers_beating_since(conn, fleet, failed_at)
            (markers,) = conn.execute(
                "SELECT count(*) FROM pgqueue_jobs WHERE job_type = %s", [MARKER]
            ).fetchone()
    finally:
        output = fleet.stop()

    figures(
        **result,
        replication=replication,
        workers=WORKERS,
        completed_before=done_before,
        completed_on_the_standby_at_promotion=done_at_promotion,
        completions_lost=max(done_before - done_at_promotion, 0),
        enqueues_lost=MARKERS - markers if replication == "async-behind" else 0,
        promote_seconds=round(promoted, 2),
        resumed_after=round(resumed, 2),
        workers_reconnected=reconnected,
        seconds=round(elapsed, 1),
    )
    # Work and completion commit together: on the new primary, either both or neither.
    assert_each_ran_once(result, JOBS)
    assert reconnected == WORKERS, output[-3000:]
    if replication == "async-behind":
        # Exactly what asynchronous replication may lose: the completions and enqueues
        # the old primary acknowledged and never shipped. The completed jobs ran again
        # (their work was lost with their completion: no duplicate), the enqueues are gone.
        assert done_at_promotion < done_before
        assert markers == 0
    else:
        # Nothing the old primary acknowledged is missing on the standby.
        assert done_at_promotion >= done_before


def _wait_for_completed(conn, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while completed_count(conn) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {count} jobs completed within {timeout}s")
        time.sleep(0.05)
