"""A claimed row the worker cannot turn into Python values (a time PostgreSQL holds but
Python's ``datetime`` cannot, JSON with a number Python refuses), written by SQL outside
enqueue's validation: that job fails with a clear error, the rest of its batch runs, and
no job of the live worker is recovered as stale."""

import signal

import pytest
from django.db import connection

from django_pgqueue import enqueue_many
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.worker import Worker
from tests.testapp.models import Execution
from tests.workers import WorkerProcess, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# A number of 5,000 digits: valid jsonb, beyond Python's default limit on the digits of
# an int converted from a string (4,300).
HUGE_NUMBER = "1" * 5000


def enqueue_with_one_bad_row(column: str, value: str, count: int = 20):
    """``count`` jobs of ``tests.record`` with one attempt each; the middle one gets
    ``value`` in ``column`` by SQL, as enqueue would never write it."""
    jobs = enqueue_many([{"job_type": "tests.record", "max_attempts": 1} for _ in range(count)])
    bad = jobs[count // 2]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE pgqueue_jobs SET {column} = %s WHERE id = %s",
            [value, bad.id],
        )
    return [job.id for job in jobs if job.id != bad.id], bad.id


def state_of(job_id):
    """Status, attempts and last_error, read without decoding the row's other columns
    (the ORM could not read the bad value either)."""
    return Job.objects.filter(pk=job_id).values_list("status", "attempts", "last_error").get()


def assert_only_the_bad_job_failed(good, bad, column, shown):
    assert Job.objects.filter(pk__in=good, status=JobStatus.COMPLETED).count() == len(good)
    # Each good job's handler ran, once, on its first and only attempt.
    assert sorted(Execution.objects.values_list("job_id", flat=True)) == sorted(good)
    assert set(Execution.objects.values_list("attempt", flat=True)) == {1}
    status, attempts, last_error = state_of(bad)
    assert (status, attempts) == (JobStatus.FAILED, 1)
    assert last_error.startswith(f"UndecodableJobError: column {column} holds {shown}")
    assert "written outside enqueue's validation" in last_error
    assert "stopped heartbeating" not in last_error
    assert not Execution.objects.filter(job_id=bad).exists()


@pytest.mark.parametrize(
    ("column", "value", "shown"),
    [
        # Year 0 once converted to UTC: before datetime.min.
        ("run_at", "0001-01-01 00:00:00+14", "'0001-12-31 10:00:00+00 BC'"),
        ("run_at", "-infinity", "'-infinity'"),
        # Year 10000 in UTC: after datetime.max.
        ("created_at", "9999-12-31 23:00:00-14", "'10000-01-01 13:00:00+00'"),
        ("data", f'{{"n": {HUGE_NUMBER}}}', '\'{"n": 1111111111'),
    ],
    ids=["run_at-year-0", "run_at-infinity", "created_at-year-10000", "data-huge-number"],
)
def test_an_undecodable_row_fails_alone_and_the_rest_of_its_batch_runs(column, value, shown):
    good, bad = enqueue_with_one_bad_row(column, value)
    worker = Worker(burst=True, concurrency=4, batch_size=20)
    assert worker.run() == 0
    assert_only_the_bad_job_failed(good, bad, column, shown)
    assert worker.stats == {"completed": 19, "failed": 1}


def test_a_live_worker_process_never_loses_a_batch_with_an_undecodable_row_to_recovery():
    # tests/settings.py: STALE_AFTER 3s, RECOVER_INTERVAL 1s: a batch left unheartbeated
    # would be recovered (and, with one attempt, failed) within seconds.
    good, bad = enqueue_with_one_bad_row("run_at", "0001-01-01 00:00:00+14")
    worker = WorkerProcess("--poll-interval", "0.2", "--concurrency", "4")
    try:
        wait_for(
            lambda: (
                Job.objects.filter(status__in=[JobStatus.COMPLETED, JobStatus.FAILED]).count() == 20
            ),
            timeout=60,
        )
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
        output = worker.output()
    finally:
        worker.stop()
    assert_only_the_bad_job_failed(good, bad, "run_at", "'0001-12-31 10:00:00+00 BC'")
    assert "recovered stale job" not in output
    assert "could not record" not in output
