"""Waiting for a task's result through the Tasks backend: ``wait_for_result()`` and
``await_for_result()``, built on ``Job.wait()``'s notifications and polling.

The async tests run through ``async_to_sync``, as an async view is run: ``aget_result()``
then reads in the test's thread, on the connection the test database is torn down with."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from django_pgqueue import enqueue
from django_pgqueue.exceptions import InvalidArgumentError, WaitTimeoutError
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.tasks_compat import (
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
)
from django_pgqueue.worker import Worker
from tests.testapp import tasks as test_tasks
from tests.workers import worker_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def tasks_settings(settings: Any) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "django_pgqueue.backends.PgQueueBackend",
            "OPTIONS": {"MAX_ATTEMPTS": 2},
        }
    }


def run_burst_later(seconds: float = 0.3) -> threading.Thread:
    """A burst worker in another thread, started after ``seconds``."""

    def run() -> None:
        time.sleep(seconds)
        Worker(burst=True, concurrency=1).run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_wait_for_result_returns_the_successful_result_once_a_worker_ran_it():
    result = test_tasks.add.enqueue(2, 3)

    with worker_thread(concurrency=1):
        finished = default_task_backend.wait_for_result(result, timeout=10)

    assert finished.status == TaskResultStatus.SUCCESSFUL
    assert finished.return_value == 5
    assert finished.id == result.id
    assert result.status == TaskResultStatus.READY  # the result given is not changed


def test_the_finish_wakes_the_wait_before_any_poll():
    result = test_tasks.add.enqueue(1, 1)
    run_burst_later()

    # A poll would come after 60 s, past the timeout: only the notification is in time.
    finished = default_task_backend.wait_for_result(result.id, timeout=10, poll_interval=60)

    assert finished.return_value == 2


def test_a_retry_does_not_end_the_wait():
    result = test_tasks.succeed_on_attempt.enqueue(2)

    with worker_thread(concurrency=1):
        finished = default_task_backend.wait_for_result(result, timeout=20, poll_interval=0.2)

    assert finished.status == TaskResultStatus.SUCCESSFUL
    assert finished.return_value == 2


def test_a_failed_task_is_returned_failed_not_raised():
    result = test_tasks.failing_value_error.enqueue()

    with worker_thread(concurrency=1):
        finished = default_task_backend.wait_for_result(result, timeout=20, poll_interval=0.2)

    assert finished.status == TaskResultStatus.FAILED
    assert finished.errors[-1].exception_class_path == "builtins.ValueError"
    assert Job.objects.get(pk=result.id).attempts == 2


def test_a_cancelled_task_is_returned_failed():
    result = test_tasks.noop.using(run_after=time_in_an_hour()).enqueue()
    Job.objects.filter(pk=result.id).cancel()

    finished = default_task_backend.wait_for_result(result, timeout=5)

    assert finished.status == TaskResultStatus.FAILED


def test_a_wait_past_its_timeout_raises_and_the_task_goes_on():
    result = test_tasks.noop.using(run_after=time_in_an_hour()).enqueue()

    with pytest.raises(WaitTimeoutError, match="is pending"):
        default_task_backend.wait_for_result(result, timeout=0.2, poll_interval=0.05)

    assert default_task_backend.get_result(result.id).status == TaskResultStatus.READY


@pytest.mark.parametrize("result_id", ["not-a-uuid", "00000000-0000-0000-0000-000000000000"])
def test_an_unknown_result_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.wait_for_result(result_id, timeout=1)


def test_a_job_that_is_not_a_task_is_no_task_result():
    job = enqueue("tests.record")

    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.wait_for_result(str(job.id), timeout=1)

    assert not Job.objects.get(pk=job.pk).awaited  # refused before the wait began


def test_waiting_inside_the_transaction_that_enqueued_the_task_says_so():
    with transaction.atomic():
        result = test_tasks.noop.enqueue()
        with pytest.raises(TaskResultDoesNotExist, match="not committed yet"):
            default_task_backend.wait_for_result(result, timeout=1)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"poll_interval": 0}, "poll_interval"),
    ],
)
def test_bad_wait_arguments_are_refused_before_the_wait(options, field):
    result = test_tasks.noop.enqueue()

    with pytest.raises(InvalidArgumentError) as excinfo:
        default_task_backend.wait_for_result(result, **options)

    assert excinfo.value.field == field
    assert not Job.objects.get(pk=result.id).awaited


def test_await_for_result_returns_the_result_without_a_thread_waiting():
    result = test_tasks.add.enqueue(20, 22)

    with worker_thread(concurrency=1):
        finished = async_to_sync(default_task_backend.await_for_result)(result, timeout=10)

    assert finished.status == TaskResultStatus.SUCCESSFUL
    assert finished.return_value == 42


def test_await_for_result_returns_a_failed_task_and_raises_on_timeout():
    failing = test_tasks.failing_value_error.enqueue()
    waiting = test_tasks.noop.using(run_after=time_in_an_hour()).enqueue()

    with worker_thread(concurrency=1):
        finished = async_to_sync(default_task_backend.await_for_result)(
            failing, timeout=20, poll_interval=0.2
        )
    with pytest.raises(WaitTimeoutError):
        async_to_sync(default_task_backend.await_for_result)(waiting, timeout=0.2)

    assert finished.status == TaskResultStatus.FAILED
    assert Job.objects.get(pk=waiting.id).status == JobStatus.PENDING


def time_in_an_hour() -> datetime:
    return timezone.now() + timedelta(hours=1)
