"""A job taken back from a worker (recovery thought it silent) and claimed again by the
same worker while its earlier attempt still ran: the earlier attempt's outcome is not
recorded over the later one's."""

from __future__ import annotations

import logging

import pytest
from django.db import connection, transaction

from django_pgqueue import enqueue
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.recovery import recover_stale_jobs
from tests.testapp.jobs import gate_cancel_requested, gate_open, gate_reached
from tests.testapp.models import Execution
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def gates():
    gate_reached.clear()
    gate_open.clear()
    gate_cancel_requested.clear()
    yield
    for event in list(gate_open.values()):
        event.set()  # no handler left waiting


@pytest.mark.parametrize(
    ("job_type", "then"),
    [
        ("tests.gated", "return"),  # FINISH_COMPLETED, in the worker's batch
        ("tests.gated", "result"),  # FINISH
        ("tests.gated", "raise"),  # FINISH, a retry
        ("tests.gated_atomic", None),  # in the handler's transaction
    ],
)
def test_the_earlier_attempt_of_a_job_claimed_again_by_its_worker_records_nothing(
    job_type, then, caplog
):
    job = enqueue(job_type, {"then": then})
    with (
        caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"),
        worker_thread(concurrency=2, poll_interval=0.05) as worker,
    ):
        assert gate_reached[1].wait(timeout=15)
        _recover_as_if_silent(job)
        # The worker's heartbeat finds the job gone and asks attempt 1 to stop; the
        # worker, a slot free, claims the job again: attempt 2 runs beside attempt 1.
        assert gate_reached[2].wait(timeout=15)
        gate_open[1].set()
        wait_for(
            lambda: (
                f"job {job.id} was no longer held" in caplog.text
                or _job(job).status != JobStatus.RUNNING
            )
        )
        # Attempt 2 still holds the job, and its heartbeat still goes on.
        beat = _job(job).heartbeat_at
        wait_for(lambda: _job(job).heartbeat_at > beat, timeout=5)
        held = _job(job)
        assert (held.status, held.attempts, held.worker_id) == (
            JobStatus.RUNNING,
            2,
            worker.worker_id,
        )
        gate_open[2].set()
        wait_for(lambda: _job(job).status != JobStatus.RUNNING)

    done = _job(job)
    if then == "raise":
        assert (done.status, done.attempts, done.last_error) == (
            JobStatus.PENDING,
            2,
            "RuntimeError: attempt 2 failed",
        )
    else:
        assert (done.status, done.attempts) == (JobStatus.COMPLETED, 2)
        assert done.result == (2 if then == "result" else None)
    if job_type == "tests.gated_atomic":
        # Attempt 1's writes were rolled back with its refused completion.
        assert list(Execution.objects.filter(job_id=job.id).values_list("attempt", flat=True)) == [
            2
        ]
    # Attempt 1 was asked to stop once the job was claimed again, whether or not the
    # heartbeat had found the job gone before; attempt 2 never was.
    assert gate_cancel_requested == {1: True, 2: False}
    outcomes = list(done.attempt_history.values_list("attempt", "outcome"))
    assert outcomes[0] == (1, "lost")
    assert (1, "cancelled") not in outcomes and (1, "retried") not in outcomes


def _recover_as_if_silent(job: Job) -> None:
    """What recovery does to a running job whose worker stopped heartbeating, now."""
    # One transaction: the worker's heartbeat waits for it rather than come between.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_jobs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s",
            [job.id],
        )
        assert [row.id for row in recover_stale_jobs(stale_after=60)] == [job.id]
        cursor.execute("UPDATE pgqueue_jobs SET run_at = now() WHERE id = %s", [job.id])


def _job(job: Job) -> Job:
    return Job.objects.get(id=job.id)
