"""An atomic handler that used the database records its completion in its own
transaction: its work and its completion commit together, once."""

from __future__ import annotations

import logging

import pytest

from django_pgqueue import enqueue
from django_pgqueue.models import JobStatus
from django_pgqueue.recovery import recover_stale_jobs
from tests.testapp.models import Execution
from tests.workers import WorkerProcess, database_url_for_tests

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_that_dies_right_after_its_handlers_commit_leaves_the_job_completed():
    held = enqueue("tests.dies_after_commit")

    worker = WorkerProcess("--burst", "--concurrency", "1")
    assert worker.wait(timeout=30) == 17, worker.output()

    held.refresh_from_db()
    assert (held.status, held.attempts, held.progress) == (JobStatus.COMPLETED, 1, 100)
    assert held.completed_at is not None
    # Nothing is left for recovery to run again: the work committed once.
    assert recover_stale_jobs(stale_after=0.001) == []
    assert Execution.objects.filter(job_id=held.id).count() == 1


def test_a_handler_whose_job_was_recovered_meanwhile_commits_nothing(caplog):
    held = enqueue("tests.loses_its_job", {"database_url": database_url_for_tests()})

    with caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"):
        _run_once()

    held.refresh_from_db()
    # The job is worker "other"'s: this attempt's writes were rolled back with it.
    assert (held.status, held.worker_id) == (JobStatus.RUNNING, "other")
    assert not Execution.objects.filter(job_id=held.id).exists()
    assert f"job {held.id} is no longer held by worker" in caplog.text


def test_without_effectively_once_the_writes_commit_and_the_completion_is_refused(caplog):
    held = enqueue("tests.loses_its_job_batched", {"database_url": database_url_for_tests()})

    with caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"):
        _run_once()

    held.refresh_from_db()
    assert (held.status, held.worker_id) == (JobStatus.RUNNING, "other")
    # Committed with the handler's transaction; its outcome, sent with the worker's
    # batch, found the job gone: the run is done, the job will run again (at least once).
    assert Execution.objects.filter(job_id=held.id).count() == 1
    assert f"job {held.id} was no longer held by" in caplog.text


def _run_once() -> None:
    from django_pgqueue.worker import Worker

    Worker(burst=True, concurrency=1).run()
