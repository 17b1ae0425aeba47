"""Random interleavings of enqueue, claim, start, finish, release, worker death,
recovery, cancel and retry, all through the real SQL, keep the job state machine's
invariants (hypothesis; bounded: a fixed number of examples and steps)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from django_pgqueue import enqueue
from django_pgqueue.models import Job
from django_pgqueue.recovery import recover_stale_jobs
from django_pgqueue.worker import queries
from django_pgqueue.worker.execution import Outcome
from django_pgqueue.worker.finishing import finish_params

pytestmark = pytest.mark.django_db

WORKERS = st.sampled_from(["w1", "w2", "w3"])
EXAMPLES = 40
STEPS = 30

_INVARIANTS = """
SELECT id, status, worker_id, attempts, max_attempts, completed_at,
       jsonb_array_length(worker_ids)
  FROM pgqueue_jobs
 WHERE (status = 'pending' AND worker_id IS NOT NULL)
    OR (status IN ('claimed', 'running') AND worker_id IS NULL)
    OR attempts < 0 OR attempts > max_attempts
    OR (status IN ('completed', 'failed', 'cancelled')) <> (completed_at IS NOT NULL)
    OR jsonb_array_length(worker_ids) <> attempts
"""


class JobStateMachine(RuleBasedStateMachine):
    """One transaction (the ``db`` test's): ``now()`` is fixed, so every retry or
    recovery with no delay is due again at once."""

    @initialize()
    def empty_table(self) -> None:
        Job.objects.all().delete()
        self.enqueued = 0

    def _held(self, worker: str) -> list[tuple[Any, int, int]]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, attempts, max_attempts FROM pgqueue_jobs "
                "WHERE worker_id = %s AND status IN ('claimed', 'running')",
                [worker],
            )
            return cursor.fetchall()

    def _finish(self, worker: str, outcomes: list[tuple[Any, str, int]]) -> None:
        with connection.cursor() as cursor:
            # The claim each outcome ends: the one holding the job, as the worker knows.
            cursor.execute(
                "SELECT id, claimed_at FROM pgqueue_jobs WHERE id = ANY(%s)",
                [[job_id for job_id, _, _ in outcomes]],
            )
            claims = dict(cursor.fetchall())
            cursor.execute(
                queries.FINISH,
                # The worker's own parameter builder, so this stays the worker's statement.
                finish_params(
                    [
                        Outcome(job_id, status, claims[job_id], refund=refund, error="boom")
                        for job_id, status, refund in outcomes
                    ],
                    worker,
                ),
            )

    @rule(count=st.integers(1, 4), max_attempts=st.integers(1, 3))
    def enqueue_jobs(self, count: int, max_attempts: int) -> None:
        for _ in range(count):
            enqueue("tests.noop", max_attempts=max_attempts)
        self.enqueued += count

    @rule(
        worker=WORKERS,
        batch=st.integers(1, 5),
        start=st.booleans(),
        free=st.integers(0, 5),
        start_within=st.sampled_from([None, 0.5, 5.0]),
    )
    def claim(
        self, worker: str, batch: int, start: bool, free: int, start_within: float | None
    ) -> None:
        """Claim as the worker does (straight into running, with its free slots and how
        soon it starts a prefetched job), or as an SQL caller that starts its jobs later
        (claimed)."""
        with connection.cursor() as cursor:
            if start:
                cursor.execute(queries.CLAIM, [worker, None, batch, None, free, start_within, None])
            else:
                cursor.execute("SELECT * FROM claim_job_batch(%s, NULL, %s)", [worker, batch])

    @rule(worker=WORKERS)
    def start(self, worker: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE pgqueue_jobs SET status = 'running', started_at = now() "
                "WHERE worker_id = %s AND status = 'claimed'",
                [worker],
            )

    @rule(worker=WORKERS, outcome=st.sampled_from(["completed", "error", "cancelled"]))
    def finish(self, worker: str, outcome: str) -> None:
        """Record outcomes the way the worker decides them (execution.py)."""
        outcomes = []
        for job_id, attempts, max_attempts in self._held(worker):
            status = outcome
            if outcome == "error":
                status = "failed" if attempts >= max_attempts else "pending"
            outcomes.append((job_id, status, 0))
        if outcomes:
            self._finish(worker, outcomes)

    @rule(worker=WORKERS)
    def release_at_shutdown(self, worker: str) -> None:
        self._finish(worker, [(job_id, "pending", 1) for job_id, _, _ in self._held(worker)])

    @rule(worker=WORKERS)
    def die(self, worker: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE pgqueue_jobs SET heartbeat_at = now() - interval '1 hour' "
                "WHERE worker_id = %s AND status IN ('claimed', 'running')",
                [worker],
            )

    @rule()
    def recover(self) -> None:
        recover_stale_jobs(60)

    @rule(data=st.data())
    def cancel_some(self, data: st.DataObject) -> None:
        ids = list(Job.objects.values_list("id", flat=True))
        if ids:
            Job.objects.filter(pk__in=data.draw(st.lists(st.sampled_from(ids)))).cancel()

    @rule(data=st.data())
    def retry_some(self, data: st.DataObject) -> None:
        ids = list(Job.objects.values_list("id", flat=True))
        if ids:
            Job.objects.filter(pk__in=data.draw(st.lists(st.sampled_from(ids)))).retry()

    @invariant()
    def states_are_consistent(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(_INVARIANTS)
            assert cursor.fetchall() == []

    @invariant()
    def no_job_is_lost(self) -> None:
        assert Job.objects.count() == self.enqueued


#: Bounded and repeatable: the same examples on every run.
MACHINE_SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def test_random_interleavings_keep_the_state_machine_invariants(figures):
    run_state_machine_as_test(JobStateMachine, settings=MACHINE_SETTINGS)
    figures(examples=EXAMPLES, steps_per_example=STEPS)
