"""SIGKILL workers while they run 10,000 jobs of three durable steps, the middle one
atomic: every job completes, every atomic step's row exists exactly once, and the
plain steps run at least once (their repeats are counted and reported)."""

from __future__ import annotations

import os
import random

import pytest

from .fleet import Fleet, drain_through_kills, enqueue_sql

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 10_000
WORKERS = 4
MIN_KILLS = 3
DEADLINE = 150.0  # seconds for the whole drain, kills included
JOB_TYPE = "tests.stepped"

_FIGURES = """
SELECT (SELECT count(*) FROM pgqueue_jobs WHERE job_type = %(t)s),
       (SELECT count(*) FROM pgqueue_jobs WHERE job_type = %(t)s AND status = 'completed'),
       (SELECT count(*) FROM testapp_execution WHERE worker_id = 'step:first'),
       (SELECT count(*) FROM testapp_execution WHERE worker_id = 'step:middle'),
       (SELECT count(*) FROM testapp_execution WHERE worker_id = 'step:last'),
       (SELECT count(*) FROM (SELECT job_id FROM testapp_execution
                               WHERE worker_id = 'step:middle'
                               GROUP BY job_id HAVING count(*) <> 1) AS twice),
       (SELECT count(*) FROM pgqueue_jobs AS j WHERE j.job_type = %(t)s
           AND NOT EXISTS (SELECT 1 FROM testapp_execution AS e
                            WHERE e.job_id = j.id AND e.worker_id = 'step:middle')),
       (SELECT count(*) FROM pgqueue_job_steps),
       (SELECT coalesce(sum(attempts), 0) FROM pgqueue_jobs WHERE job_type = %(t)s)
"""


def test_killed_workers_never_repeat_an_atomic_step(other_connection, figures):
    seed = int(os.environ.get("PGQUEUE_FAULTS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    enqueue_sql(other_connection, JOBS, job_type=JOB_TYPE)
    drain = drain_through_kills(
        other_connection, Fleet(WORKERS), JOBS, rng, DEADLINE, job_type=JOB_TYPE
    )
    row = other_connection.execute(_FIGURES, {"t": JOB_TYPE}).fetchone()
    kills, elapsed = drain.kills, drain.seconds

    assert row is not None
    jobs, completed, first, middle, last, middle_not_once, middle_missing, checkpoints, att = row
    figures(
        jobs=jobs,
        completed=completed,
        first_step_runs=first,
        atomic_step_runs=middle,
        last_step_runs=last,
        plain_step_repeats=first + last - 2 * JOBS,
        checkpoints=checkpoints,
        attempts=att,
        workers=WORKERS,
        kills=kills,
        seed=seed,
        seconds=elapsed,
    )
    assert jobs == JOBS and completed == JOBS
    assert middle_not_once == 0 and middle_missing == 0 and middle == JOBS
    assert first >= JOBS and last >= JOBS  # at least once
    assert checkpoints == 3 * JOBS
    assert kills >= MIN_KILLS, f"only {kills} kills before the deadline"
