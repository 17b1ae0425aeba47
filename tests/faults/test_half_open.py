"""Half-open connections (scenario 2): a proxy between workers and PostgreSQL stops
carrying bytes without closing anything. Workers notice within
``PGQUEUE["RESPONSE_TIMEOUT"]``, reconnect when the path heals, and write no outcome
for a job recovered and run by another worker meanwhile; a listener whose connection
went silent reconnects instead of leaving an idle worker asleep until its next poll."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.workers import WorkerProcess, database_url_for_tests, wait_for

from .fleet import (
    Fleet,
    assert_each_ran_once,
    completed_count,
    enqueue_sql,
    execution_figures,
    wait_until_drained,
    workers_beating_since,
)
from .proxy import SilentProxy

pytestmark = pytest.mark.django_db(transaction=True)

RESPONSE_TIMEOUT = 2.0
#: Longer than STALE_AFTER (3 s in tests/settings.py) and a recovery round (1 s): the
#: direct worker recovers the silent workers' jobs and runs them meanwhile.
PARTITION_SECONDS = 8.0
JOBS = 3000
DEADLINE = 90.0
CUT = "no answer from the database to"
RELISTEN = "LISTEN connection lost"
LOST = re.compile(r"is no longer held by|was no longer held by")


@pytest.fixture
def proxy():
    silent = SilentProxy(database_url_for_tests()).start()
    yield silent
    silent.stop()


def _settings(**values: float) -> dict[str, str]:
    return {"PGQUEUE_TEST_SETTINGS": json.dumps({"RESPONSE_TIMEOUT": RESPONSE_TIMEOUT, **values})}


def test_a_partition_longer_than_stale_after_loses_and_repeats_nothing(
    proxy, other_connection, figures
):
    enqueue_sql(other_connection, JOBS, sleep=0.01)
    silent = Fleet(2, env={"DATABASE_URL": proxy.url(), **_settings()}, prefix="silent")
    silent.start()
    direct = Fleet(1, env=_settings(), prefix="direct").start()
    started = time.monotonic()
    try:
        wait_for(lambda: completed_count(other_connection) >= JOBS // 5, timeout=30)
        done_before = completed_count(other_connection)
        proxy.partition()
        partitioned = time.monotonic()
        noticed = wait_for(lambda: _all_noticed(silent), timeout=PARTITION_SECONDS)
        noticed_after = time.monotonic() - partitioned
        assert noticed
        time.sleep(max(PARTITION_SECONDS - (time.monotonic() - partitioned), 0))
        done_while_partitioned = completed_count(other_connection) - done_before
        recovered = _recovered_from(other_connection, silent)
        proxy.heal()
        healed = time.monotonic()
        wait_for(
            lambda: workers_beating_since(other_connection, silent, healed) == silent.size,
            timeout=30,
        )
        reconnected_after = time.monotonic() - healed
        wait_until_drained(other_connection, started + DEADLINE)
        elapsed = time.monotonic() - started
        silent.assert_alive()
        direct.assert_alive()
        result = execution_figures(other_connection)
        outputs = silent.outputs() + direct.outputs()
        refused = len(LOST.findall(outputs))
    finally:
        silent.stop()
        direct.stop()

    figures(
        **result,
        partition_seconds=PARTITION_SECONDS,
        response_timeout=RESPONSE_TIMEOUT,
        noticed_within=round(noticed_after, 2),
        reconnected_within=round(reconnected_after, 2),
        completed_while_partitioned=done_while_partitioned,
        recovered_from_silent_workers=recovered,
        outcomes_refused=refused,
        seconds=round(elapsed, 1),
    )
    # The silent workers' handlers that went on past the recovery had their completion,
    # and their work with it, refused: no job's work committed twice.
    assert_each_ran_once(result, JOBS, other_connection, outputs)
    assert recovered > 0  # the partition outlived STALE_AFTER: jobs changed hands
    assert noticed_after <= RESPONSE_TIMEOUT + 2


def test_a_silent_listener_is_replaced(proxy, other_connection, figures):
    """Every connection of an idle worker goes silent for good (new ones work): a
    statement on its listener's connection notices (the listener's probe, or a heartbeat
    sent on that connection), it listens again and hears the next enqueue long before
    its next poll."""
    poll_interval = 60.0
    worker = WorkerProcess(
        "--concurrency",
        "1",
        "--poll-interval",
        str(poll_interval),
        env={"DATABASE_URL": proxy.url(), **_settings(HEARTBEAT_INTERVAL=0.5)},
    )
    try:
        wait_for(lambda: "starting" in worker.output(), timeout=30)
        time.sleep(1)  # listening, and idle
        forgotten = proxy.forget_connections()
        silenced = time.monotonic()
        # The probe every HEARTBEAT_INTERVAL, cut after RESPONSE_TIMEOUT: a new LISTEN.
        wait_for(lambda: RELISTEN in worker.output())
        relistened_after = time.monotonic() - silenced
        enqueued = time.monotonic()
        other_connection.execute(
            "WITH inserted AS (INSERT INTO pgqueue_jobs (job_type, data) "
            "VALUES ('tests.durable', '{\"sleep\": 0}') RETURNING queue) "
            "SELECT pg_notify('pgqueue_jobs', queue) FROM inserted"
        )
        wait_for(lambda: execution_figures(other_connection)["completed"] == 1, timeout=20)
        ran_after = time.monotonic() - enqueued
        output = worker.output()
    finally:
        worker.stop()

    figures(
        connections_silenced=forgotten,
        relistened_within=round(relistened_after, 2),
        job_ran_within=round(ran_after, 2),
        poll_interval=poll_interval,
    )
    cut_by = ("the listener's probe", "the heartbeat's statements (on the listener's connection)")
    assert any(f"no answer from the database to {what}" in output for what in cut_by), output
    assert ran_after < poll_interval / 4, output[-3000:]


def _all_noticed(fleet: Fleet) -> bool:
    return all(CUT in process.output() for process in fleet.processes.values())


def _recovered_from(conn, fleet: Fleet) -> int:
    """Attempts of the silent workers that recovery ended while they were silent."""
    ids = [process.worker_id for process in fleet.processes.values()]
    row = conn.execute(
        "SELECT count(*) FROM pgqueue_job_attempts WHERE worker_id = ANY(%s) AND outcome = 'lost'",
        [ids],
    ).fetchone()
    return row[0]
