"""Lost commit acknowledgements: a handler's COMMIT is durable on the server, but the
server restarts before it answers. The worker sees a connection error; the job must not
run again, since its work committed.

The commits are held unanswered by making them wait for a synchronous standby that does
not exist (``synchronous_standby_names``): PostgreSQL writes such a commit to its WAL,
then waits for the standby before it acknowledges. An immediate restart then cuts every
waiting commit, which recovery replays.

Runs on a dedicated cluster (conftest.py), never on the suite's shared server.
"""

from __future__ import annotations

import time

from .fleet import Fleet, assert_each_ran_once, enqueue_sql, finish_drain

JOBS = 40
WORKERS = 2
SLOTS = 4
#: Long enough that every slot's handler is running when the commits begin to wait.
SLEEP = 0.5
DEADLINE = 60.0

_WAITING_COMMITS = (
    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND query = 'COMMIT'"
)


def test_a_commit_whose_acknowledgement_was_lost_does_not_run_its_job_again(cluster, figures):
    with cluster.connect() as conn:
        enqueue_sql(conn, JOBS, sleep=SLEEP)
    fleet = Fleet(
        WORKERS,
        args=("--concurrency", str(SLOTS), "--poll-interval", "0.2"),
        env={"DATABASE_URL": cluster.url},
    ).start()
    started = time.monotonic()
    try:
        with cluster.connect() as conn:
            _wait_for(conn, "SELECT count(*) FROM pgqueue_jobs WHERE status = 'running'", 1)
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'nowhere'")
            conn.execute("SELECT pg_reload_conf()")
            # Handlers end and commit; each commit is written, then waits, unanswered.
            cut = _wait_for(conn, _WAITING_COMMITS, WORKERS * SLOTS // 2)
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        cluster.cluster.restart("immediate")
        with cluster.connect() as conn:
            result, elapsed = finish_drain(conn, fleet, started, DEADLINE)
    finally:
        with cluster.connect() as conn:  # whatever happened above, for the next tests
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            conn.execute("SELECT pg_reload_conf()")
        output = fleet.stop()

    figures(**result, commits_unacknowledged=cut, workers=WORKERS, seconds=round(elapsed, 1))
    # Each cut commit completed its job with its work: none ran again.
    assert_each_ran_once(result, JOBS)
    assert "database unavailable" in output  # the restart did hit the workers


def _wait_for(conn, sql: str, at_least: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        (found,) = conn.execute(sql).fetchone()
        if found >= at_least or time.monotonic() > deadline:
            assert found >= at_least, f"{sql!r}: {found} < {at_least}"
            return int(found)
        time.sleep(0.02)
