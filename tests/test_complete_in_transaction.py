"""``pgqueue_complete_in_transaction()``: an atomic handler's completion, in its own
transaction (sql/complete_in_transaction_v2.sql)."""

from __future__ import annotations

import pytest
from django.db import connection

from django_pgqueue.models import Job, JobStatus

pytestmark = pytest.mark.django_db

WORKER = "worker-1"


def complete(job_id, claimed_at, worker_id=WORKER) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pgqueue_complete_in_transaction(%s, %s, %s, 'NaN')",
            [job_id, claimed_at, worker_id],
        )
        return cursor.fetchone()[0]


def running_job(**values) -> Job:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_jobs (job_type, status, worker_id, attempts, claimed_at, "
            "started_at, heartbeat_at) VALUES ('tests.noop', 'running', %s, 1, now(), now(), "
            "now()) RETURNING id",
            [values.get("worker_id", WORKER)],
        )
        (job_id,) = cursor.fetchone()
    return Job.objects.get(id=job_id)


def test_it_completes_the_job_its_claim_holds():
    job = running_job()

    assert complete(job.id, job.claimed_at) is True

    job.refresh_from_db()
    assert (job.status, job.progress) == (JobStatus.COMPLETED, 100)
    assert job.completed_at is not None


@pytest.mark.parametrize(
    "change",
    [
        "claimed_at = claimed_at + interval '1 second'",  # claimed again since
        "worker_id = 'worker-2'",
        "status = 'pending', worker_id = NULL",
        "status = 'completed'",
    ],
    ids=["a-later-claim", "another-worker", "recovered", "finished"],
)
def test_it_refuses_a_job_its_claim_no_longer_holds(change):
    job = running_job()
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE pgqueue_jobs SET {change} WHERE id = %s", [job.id])
    before = Job.objects.get(id=job.id)

    assert complete(job.id, job.claimed_at) is False

    after = Job.objects.get(id=job.id)
    assert (after.status, after.completed_at) == (before.status, before.completed_at)
