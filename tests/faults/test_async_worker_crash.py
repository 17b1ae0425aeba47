"""SIGKILL workers running async handlers mid-drain: every job completes, none runs
twice at once, and a job runs twice only when the worker of its first run died before
recording it (as tests/faults/test_worker_crash.py, on the event loop)."""

from __future__ import annotations

import os
import random

import pytest

from .fleet import Fleet, assert_nothing_lost, drain_through_kills, enqueue_sql

pytestmark = pytest.mark.django_db(transaction=True)

JOB_TYPE = "tests.durable_async"
JOBS = 2_000
WORKERS = 4
MIN_KILLS = 3
DEADLINE = 90.0  # seconds for the whole drain, kills included
ARGS = ("--concurrency", "1", "--async-concurrency", "20", "--poll-interval", "0.2")


def test_killed_async_workers_lose_no_job_and_never_overlap_runs(other_connection, figures):
    seed = int(os.environ.get("PGQUEUE_FAULTS_SEED", random.randrange(1 << 30)))
    enqueue_sql(other_connection, JOBS, sleep=0.02, job_type=JOB_TYPE)
    fleet = Fleet(WORKERS, args=ARGS, env={"PGQUEUE_TEST_ASYNC_JOBS": "1"})

    drain = drain_through_kills(
        other_connection, fleet, JOBS, random.Random(seed), DEADLINE, job_type=JOB_TYPE
    )

    figures(**drain.figures, workers=WORKERS, kills=drain.kills, seed=seed, seconds=drain.seconds)
    assert_nothing_lost(drain, fleet, JOBS, MIN_KILLS, once=False)
