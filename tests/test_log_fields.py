"""Structured logging: the worker's records about a job carry its id, type, queue,
attempt and worker as attributes (``extra``), for JSON formatters."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from django_pgqueue import enqueue
from django_pgqueue.logfields import JOB_FIELDS
from django_pgqueue.recovery import recover_stale_jobs
from django_pgqueue.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def records_about(caplog, job):
    return [record for record in caplog.records if getattr(record, "job_id", None) == str(job.id)]


def test_each_outcome_record_names_the_job_its_attempt_and_the_worker(caplog):
    completed = enqueue("tests.returns", {"n": 1})
    retried = enqueue("tests.fail", queue="mail")
    last_attempt = enqueue("tests.fail", max_attempts=1)
    failed = enqueue("tests.fail_now")

    with caplog.at_level(logging.DEBUG, logger="django_pgqueue.worker"):
        Worker(burst=True, concurrency=1, worker_id="logging-worker").run()

    (done,) = records_about(caplog, completed)
    assert (done.levelname, done.job_type, done.queue, done.attempt, done.worker_id) == (
        "DEBUG",
        "tests.returns",
        "default",
        1,
        "logging-worker",
    )
    (retry,) = records_about(caplog, retried)
    assert (retry.levelname, retry.attempt, retry.queue) == ("WARNING", 1, "mail")
    (last,) = records_about(caplog, last_attempt)
    assert (last.levelname, last.attempt) == ("ERROR", 1)
    (gave_up,) = records_about(caplog, failed)
    assert (gave_up.levelname, gave_up.job_type) == ("ERROR", "tests.fail_now")
    assert gave_up.getMessage().startswith(f"job {failed.id} (tests.fail_now) failed: ")


def test_the_fields_make_a_json_line_with_a_plain_formatter(caplog):
    job = enqueue("tests.returns", {"n": 2})

    with caplog.at_level(logging.DEBUG, logger="django_pgqueue.worker"):
        Worker(burst=True, concurrency=1, worker_id="json-worker").run()

    (record,) = records_about(caplog, job)
    line = json.dumps({name: getattr(record, name) for name in JOB_FIELDS})
    assert json.loads(line) == {
        "job_id": str(job.id),
        "job_type": "tests.returns",
        "queue": "default",
        "attempt": 1,
        "worker_id": "json-worker",
    }


def test_a_recovered_jobs_record_names_it_and_the_worker_it_leaves(caplog, make_job):
    stale = make_job(
        status="running",
        worker_id="gone-worker",
        attempts=1,
        heartbeat_at=timezone.now() - timedelta(hours=1),
    )

    with caplog.at_level(logging.WARNING, logger="django_pgqueue.recovery"):
        recover_stale_jobs(stale_after=60)

    (record,) = records_about(caplog, stale)
    assert (record.job_type, record.attempt, record.worker_id) == ("tests.noop", 1, "gone-worker")
