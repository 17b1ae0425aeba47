"""SIGKILL workers mid-drain: every job completes, none runs twice at once, and no job's
writes commit twice: its atomic handler's completion commits with them."""

from __future__ import annotations

import os
import random

import pytest

from .fleet import Fleet, assert_nothing_lost, drain_through_kills, enqueue_sql

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 10_000
WORKERS = 4
MIN_KILLS = 3
DEADLINE = 60.0  # seconds for the whole drain, kills included


def test_killed_workers_lose_no_job_and_never_overlap_runs(other_connection, figures):
    seed = int(os.environ.get("PGQUEUE_FAULTS_SEED", random.randrange(1 << 30)))
    enqueue_sql(other_connection, JOBS, sleep=0.002)
    fleet = Fleet(WORKERS)

    drain = drain_through_kills(other_connection, fleet, JOBS, random.Random(seed), DEADLINE)

    figures(**drain.figures, workers=WORKERS, kills=drain.kills, seed=seed, seconds=drain.seconds)
    # Effectively once: a run whose transaction committed also completed its job (the
    # outcome is written in that transaction), so a killed worker's job runs again only
    # if its writes rolled back.
    assert_nothing_lost(drain, fleet, JOBS, MIN_KILLS, once=True)
