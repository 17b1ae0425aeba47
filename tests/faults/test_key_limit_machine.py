"""Random interleavings of the job state machine's steps with jobs under a per-key
limit (tests/faults/test_state_machine.py's steps, plus enqueues of keyed jobs, limit
changes and the sweep), all through the real SQL: a claim never takes a key past its
limit, held jobs are always pending jobs of a key, and after the sweep no key with room
leaves a job held (hypothesis; bounded)."""

from __future__ import annotations

import pytest
from django.db import connection
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule, run_state_machine_as_test

from django_pgqueue import enqueue_many, registry
from django_pgqueue.limits import override_limit
from django_pgqueue.recovery import release_held_jobs
from tests.testapp import keyed_jobs

from .test_state_machine import EXAMPLES, MACHINE_SETTINGS, STEPS, JobStateMachine

pytestmark = pytest.mark.django_db

TENANT_JOB = "tests.per_tenant"

# Keys with more jobs claimed or running than their limit allows.
_OVER_LIMIT = """
SELECT j.concurrency_key, count(*), l.max_running
  FROM pgqueue_jobs AS j JOIN pgqueue_limits AS l ON l.scope = 'key' AND l.name = j.job_type
 WHERE j.status IN ('claimed', 'running') AND j.concurrency_key IS NOT NULL
 GROUP BY j.concurrency_key, l.max_running
HAVING count(*) > l.max_running
"""

# Held jobs that are not pending jobs of a key.
_HELD_ASTRAY = """
SELECT id, status, concurrency_key FROM pgqueue_jobs
 WHERE held AND (status <> 'pending' OR concurrency_key IS NULL)
"""

# Keys that hold a job while they have fewer visible due jobs than their limit.
_STRANDED = """
SELECT h.concurrency_key
  FROM (SELECT DISTINCT job_type, concurrency_key FROM pgqueue_jobs
         WHERE status = 'pending' AND held) AS h
  JOIN pgqueue_limits AS l ON l.scope = 'key' AND l.name = h.job_type
 WHERE l.max_running > (
        SELECT count(*) FROM pgqueue_jobs AS v
         WHERE v.job_type = h.job_type AND v.concurrency_key = h.concurrency_key
           AND v.status = 'pending' AND NOT v.held AND v.run_at <= clock_timestamp())
"""


class KeyedJobStateMachine(JobStateMachine):
    """The job state machine, with jobs of ``tests.per_tenant`` (keys ``a`` to ``c``)."""

    @initialize(limit=st.integers(1, 3))
    def declare_the_limit(self, limit: int) -> None:
        registry.register(keyed_jobs.per_tenant)
        override_limit("key", TENANT_JOB, limit)
        # Lowering a limit never stops running jobs: only claims made since count.
        self.limit_lowered = False

    def teardown(self) -> None:
        registry.unregister(TENANT_JOB)

    def _over_limit(self) -> list[tuple[str, int, int]]:
        with connection.cursor() as cursor:
            cursor.execute(_OVER_LIMIT)
            return cursor.fetchall()

    @rule(tenants=st.lists(st.sampled_from("abc"), min_size=1, max_size=6))
    def enqueue_keyed_jobs(self, tenants: list[str]) -> None:
        enqueue_many(
            [{"job_type": TENANT_JOB, "data": {"tenant": t}, "max_attempts": 2} for t in tenants]
        )
        self.enqueued += len(tenants)

    @rule(limit=st.integers(1, 3))
    def change_the_limit(self, limit: int) -> None:
        override_limit("key", TENANT_JOB, limit)
        # A lowered limit never stops running jobs: a key over it is no claim's doing.
        self.limit_lowered = self.limit_lowered or bool(self._over_limit())

    @rule()
    def sweep(self) -> None:
        release_held_jobs()
        with connection.cursor() as cursor:
            cursor.execute(_STRANDED)
            assert cursor.fetchall() == []

    @invariant()
    def no_key_runs_more_jobs_than_its_limit(self) -> None:
        if not self.limit_lowered:
            assert self._over_limit() == []

    @invariant()
    def held_jobs_are_pending_jobs_of_a_key(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(_HELD_ASTRAY)
            assert cursor.fetchall() == []


def test_random_interleavings_keep_per_key_limits(figures):
    run_state_machine_as_test(KeyedJobStateMachine, settings=MACHINE_SETTINGS)
    figures(examples=EXAMPLES, steps_per_example=STEPS)
