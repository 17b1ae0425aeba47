"""Clock skew: workers whose clocks run ten minutes fast or slow (libfaketime, from
Debian's ``faketime`` package) take their time decisions on the database's clock.

A job delayed by the enqueuer runs when the database says it is due, not ten minutes
early or late; a durable sleep begun on a fast worker and resumed on a slow one lasts
its length on the database's clock (on the workers' clocks it lasted twenty minutes
more); a periodic schedule's tick is the database's latest; a fast worker's recovery
takes back no job of a live worker early; a prefetched job's ``started_at``, measured
by the worker, lies between its claim and its finish on the database's clock.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.availability import unavailable
from tests.workers import WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEW_SECONDS = 600
SETTINGS = {
    "STALE_AFTER": 2,
    "HEARTBEAT_INTERVAL": 0.2,
    "RECOVER_INTERVAL": 0.3,
    "SCHEDULE": {"minutely": {"job_type": "tests.noop", "schedule": "* * * * *"}},
}


def skewed_worker(seconds: int, worker_id: str) -> WorkerProcess:
    """A worker whose wall clock runs ``seconds`` ahead (behind, when negative). Its
    monotonic clock stays the kernel's, as on a host whose wall clock drifted (faked,
    libfaketime also breaks the waits of Python's threads)."""
    if not LIBFAKETIME.exists():
        unavailable("libfaketime is not installed (apt-get install faketime)")
    env = {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"{seconds:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PGQUEUE_TEST_SETTINGS": json.dumps(SETTINGS),
    }
    args = ("--concurrency", "4", "--poll-interval", "0.2", "--worker-id", worker_id)
    return WorkerProcess(*args, env=env)


def wait_for(condition, timeout: float, what: str, *workers: WorkerProcess) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            logs = "\n".join(worker.output()[-2000:] for worker in workers)
            pytest.fail(f"{what} within {timeout} s\n{logs}")
        time.sleep(0.1)


def test_skewed_workers_keep_the_databases_time(other_connection, figures):
    def one(sql, params=()):
        return other_connection.execute(sql, params).fetchone()

    (delayed,) = one(
        "INSERT INTO pgqueue_jobs (job_type, data, run_at) "
        "VALUES ('tests.noop', '{}', now() + interval '3 seconds') RETURNING id"
    )
    (napper,) = one(
        "INSERT INTO pgqueue_jobs (job_type, data) VALUES ('tests.naps', '{\"sleep\": 3}') "
        "RETURNING id"
    )
    (held,) = one(
        "INSERT INTO pgqueue_jobs (job_type, data) VALUES ('tests.db_sleeps', "
        "'{\"sleep\": 6}') RETURNING id"
    )
    fast = skewed_worker(SKEW_SECONDS, "fast")
    slow = None
    try:
        # The fast worker claims the three: the delayed one only once it is due, and
        # begins the sleep, which suspends its job; the long job heartbeats meanwhile.
        wait_for(
            lambda: (
                one(
                    "SELECT count(*) FROM pgqueue_job_attempts WHERE job_id = %s "
                    "AND outcome = 'suspended'",
                    [napper],
                )[0]
                == 1
            ),
            30,
            "the fast worker began the sleep",
            fast,
        )
        (wake_in,) = one(
            "SELECT extract(epoch FROM wake_at - now()) FROM pgqueue_job_steps "
            "WHERE job_id = %s AND name = 'nap'",
            [napper],
        )
        # The schedule's row is written by the worker's heartbeat thread, on its own
        # time: under load, after the sleep began.
        wait_for(
            lambda: one("SELECT count(*) FROM pgqueue_periodic WHERE name = 'minutely'")[0] == 1,
            30,
            "the fast worker enqueued the schedule's tick",
            fast,
        )
        (tick_age,) = one(
            "SELECT extract(epoch FROM now() - last_tick) FROM pgqueue_periodic "
            "WHERE name = 'minutely'"
        )
        wait_for(
            lambda: one("SELECT status FROM pgqueue_jobs WHERE id = %s", [held])[0] == "completed",
            30,
            "the long job completed",
            fast,
        )
        # A burst of jobs, most of which wait in the fast worker's prefetch buffer: each
        # records when a slot started it.
        burst = [
            row[0]
            for row in other_connection.execute(
                "INSERT INTO pgqueue_jobs (job_type, data) "
                "SELECT 'tests.noop', '{}' FROM generate_series(1, 60) RETURNING id"
            ).fetchall()
        ]
        wait_for(
            lambda: (
                one(
                    "SELECT count(*) FROM pgqueue_jobs WHERE id = ANY(%s) AND status = 'completed'",
                    [burst],
                )[0]
                == len(burst)
            ),
            30,
            "the burst completed",
            fast,
        )
        fast.stop()
        # A slow worker resumes the sleep, and recovers nothing of a live worker.
        slow = skewed_worker(-SKEW_SECONDS, "slow")
        wait_for(
            lambda: (
                one("SELECT status FROM pgqueue_jobs WHERE id = %s", [napper])[0] == "completed"
            ),
            30,
            "the sleeping job completed",
            slow,
        )
        wait_for(
            lambda: (
                one("SELECT status FROM pgqueue_jobs WHERE id = %s", [delayed])[0] == "completed"
            ),
            30,
            "the delayed job completed",
            slow,
        )
    finally:
        fast.stop()
        if slow is not None:
            slow.stop()

    (delayed_late, delayed_by) = one(
        "SELECT extract(epoch FROM completed_at - run_at), worker_id FROM pgqueue_jobs "
        "WHERE id = %s",
        [delayed],
    )
    (nap_seconds,) = one(
        "SELECT extract(epoch FROM j.completed_at - s.started_at) FROM pgqueue_jobs AS j "
        "JOIN pgqueue_job_steps AS s ON s.job_id = j.id AND s.name = 'nap' WHERE j.id = %s",
        [napper],
    )
    (lost,) = one("SELECT count(*) FROM pgqueue_job_attempts WHERE outcome = 'lost'")
    (started_off, started_after_claim) = one(
        "SELECT count(*) FILTER (WHERE started_at NOT BETWEEN claimed_at AND completed_at), "
        "count(*) FILTER (WHERE started_at > claimed_at) FROM pgqueue_jobs WHERE id = ANY(%s)",
        [burst],
    )
    figures(
        skew_seconds=SKEW_SECONDS,
        sleep_ends_in=round(float(wake_in), 2),
        sleep_lasted=round(float(nap_seconds), 2),
        tick_age=round(float(tick_age), 2),
        delayed_started_late_by=round(float(delayed_late), 2),
        delayed_run_by=delayed_by,
        lost=lost,
        burst_started_outside_claim_and_finish=started_off,
        burst_started_after_their_claim=started_after_claim,
    )
    assert 0 < wake_in <= 3  # its end on the database's clock, not ten minutes off
    assert 3 <= nap_seconds < 15  # not twenty minutes: the fast clock wrote, the slow read
    assert 0 <= tick_age < 60  # the database's latest minute, not one ten minutes off
    assert 0 <= delayed_late < 15  # due by the database, run then
    assert lost == 0  # the long job's heartbeats kept it from recovery
    # Prefetched jobs' starts, measured by the worker, are written on the database's
    # clock: between their claim and their finish, not ten minutes ahead.
    assert started_after_claim > 0 and started_off == 0
