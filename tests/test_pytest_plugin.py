"""The pytest fixtures the package registers through its ``pytest11`` entry point: used
here by name only, as a project's tests would, with nothing imported or configured."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_pgqueue import enqueue
from django_pgqueue.exceptions import JobFailedError
from django_pgqueue.models import Job, JobStatus


def test_pgqueue_immediate_runs_the_tests_jobs_as_they_commit(transactional_db, pgqueue_immediate):
    with transaction.atomic():
        enqueued = enqueue("tests.returns", {"n": 6})
        assert pgqueue_immediate == []

    assert [run.result for run in pgqueue_immediate] == [{"doubled": 12}]
    assert Job.objects.get(pk=enqueued.pk).status == JobStatus.COMPLETED


def test_pgqueue_immediate_raises_a_failed_attempt(transactional_db, pgqueue_immediate):
    with pytest.raises(JobFailedError, match="boom on attempt 1"):
        enqueue("tests.fail")


def test_pgqueue_immediate_with_the_db_fixture_runs_with_the_on_commit_callbacks(
    db, pgqueue_immediate, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        enqueued = enqueue("tests.returns", {"n": 1})

    assert Job.objects.get(pk=enqueued.pk).result == {"doubled": 2}


def test_pgqueue_worker_runs_a_burst_worker(transactional_db, pgqueue_worker):
    done = enqueue("tests.returns", {"n": 2})
    failed = enqueue("tests.fail_now")

    worker = pgqueue_worker(worker_id="fixture-worker")

    assert worker.stats == {"completed": 1, "failed": 1}
    assert Job.objects.get(pk=done.pk).result == {"doubled": 4}
    assert Job.objects.get(pk=failed.pk).status == JobStatus.FAILED
