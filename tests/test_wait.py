"""Waiting for a job's result: ``Job.wait()`` and ``await Job.await_result()``, woken by
NOTIFY on the awaited job's finish, polling as the fallback."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from django.db import connection, transaction

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.exceptions import (
    CancelledJobError,
    InvalidArgumentError,
    JobFailedError,
    JobNotFoundError,
    WaitTimeoutError,
)
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.sideconn import open_raw_connection
from django_pgqueue.worker import Worker
from tests.workers import worker_thread

pytestmark = pytest.mark.django_db(transaction=True)


def finish_later(job, *, seconds=0.3, status=JobStatus.COMPLETED, result="'42'", notify=True):
    """Finish ``job`` by SQL from another thread after ``seconds``; with ``notify=False``
    the same statement clears ``awaited``, so that no notification is sent."""

    def run():
        time.sleep(seconds)
        with open_raw_connection(connection.alias) as conn:
            conn.execute(
                f"UPDATE pgqueue_jobs SET status = %s, result = {result}::jsonb, "
                "last_error = CASE WHEN %s = 'completed' THEN '' ELSE 'boom' END, "
                "awaited = awaited AND %s WHERE id = %s",
                [status, status, notify, job.id],
            )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_wait_returns_the_result_of_a_job_a_worker_runs():
    job = enqueue("tests.returns", {"n": 3})

    with worker_thread(concurrency=1):
        assert job.wait(timeout=10) == {"doubled": 6}


def test_wait_on_a_finished_job_returns_at_once():
    job = enqueue("tests.returns", {"n": 1})
    Worker(burst=True).run()

    assert job.wait(timeout=0.1) == {"doubled": 2}


def test_a_finish_wakes_the_waiter_without_waiting_for_a_poll():
    job = enqueue("tests.record", delay=3600)
    finish_later(job)

    # A poll would come after 60 s, past the timeout: only the notification is in time.
    assert job.wait(timeout=10, poll_interval=60) == 42


def test_polling_finds_a_finish_that_sent_no_notification():
    job = enqueue("tests.record", delay=3600)
    finish_later(job, notify=False)

    assert job.wait(timeout=10, poll_interval=0.1) == 42


def test_a_failed_job_raises_job_failed_error_with_its_last_error():
    job = enqueue("tests.fail", max_attempts=1)
    Worker(burst=True).run()

    with pytest.raises(JobFailedError) as excinfo:
        job.wait(timeout=5)

    assert excinfo.value.job_id == job.id
    assert str(excinfo.value).startswith(f"job {job.id} (tests.fail) failed after 1 attempt(s): ")
    assert excinfo.value.error == Job.objects.get(pk=job.pk).last_error


def test_a_cancelled_job_raises_cancelled_job_error():
    job = enqueue("tests.record", delay=3600)
    Job.objects.filter(pk=job.pk).cancel()

    with pytest.raises(CancelledJobError, match=f"job {job.id} \\(tests.record\\) was cancelled"):
        job.wait(timeout=5)


def test_a_wait_past_its_timeout_raises_and_the_job_goes_on():
    job = enqueue("tests.record", delay=3600)

    with pytest.raises(WaitTimeoutError) as excinfo:
        job.wait(timeout=0.2, poll_interval=0.05)

    assert isinstance(excinfo.value, TimeoutError)
    assert "is pending, after 0 attempt(s)" in str(excinfo.value)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert job.awaited


def test_waiting_inside_the_transaction_that_enqueued_the_job_says_so():
    with transaction.atomic():
        job = enqueue("tests.record")
        with pytest.raises(JobNotFoundError, match="not committed yet"):
            job.wait(timeout=1)


def test_await_result_waits_without_a_thread():
    job = enqueue("tests.returns", {"n": 5})

    with worker_thread(concurrency=1):
        assert asyncio.run(job.await_result(timeout=10)) == {"doubled": 10}


def test_await_result_raises_as_wait_does():
    job = enqueue("tests.record", delay=3600)
    finish_later(job, status=JobStatus.FAILED, result="null")

    with pytest.raises(JobFailedError, match="boom"):
        asyncio.run(job.await_result(timeout=10, poll_interval=60))


def test_only_awaited_jobs_notify_when_they_finish():
    watched, _unwatched = enqueue_many([{"job_type": "tests.record"}] * 2)
    Job.objects.filter(pk=watched.pk).update(awaited=True)

    with open_raw_connection(connection.alias) as listener:
        listener.execute("LISTEN pgqueue_finished")
        Worker(burst=True).run()
        heard = [note.payload for note in listener.notifies(timeout=1.0)]

    assert heard == [str(watched.id)]
    assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 2


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": "soon"}, "timeout"),
        ({"poll_interval": 0}, "poll_interval"),
    ],
)
def test_bad_wait_arguments_are_refused_before_anything_is_written(options, field):
    job = enqueue("tests.record", delay=3600)

    with pytest.raises(InvalidArgumentError) as excinfo:
        job.wait(**options)

    assert excinfo.value.field == field
    job.refresh_from_db()
    assert not job.awaited
