"""Structured logging: the worker's records about a job carry its id, type, queue,
attempt and worker as attributes (``extra``), for JSON formatters."""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.logfields import JOB_FIELDS
from django_pgqueue.recovery import recover_stale_jobs
from django_pgqueue.worker import Worker
from django_pgqueue.worker.execution import Outcome
from django_pgqueue.worker.finishing import finish_statement
from tests.testapp import process_jobs

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


# -- A failed attempt: one record, with its traceback ---------------------------------


def test_a_retried_attempt_is_one_warning_with_the_handlers_traceback(caplog):
    retried = enqueue("tests.fail")

    with caplog.at_level(logging.DEBUG, logger="django_pgqueue"):
        Worker(burst=True, concurrency=1).run()

    (record,) = records_about(caplog, retried)
    assert record.levelname == "WARNING"
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)
    assert str(record.exc_info[1]) == "boom on attempt 1"
    text = logging.Formatter().format(record)
    assert "Traceback (most recent call last)" in text
    assert 'raise RuntimeError(f"boom on attempt {job.attempts}")' in text


def test_a_job_failing_for_good_is_one_error_with_the_handlers_traceback(caplog):
    failed = enqueue("tests.fail_now")

    with caplog.at_level(logging.DEBUG, logger="django_pgqueue"):
        Worker(burst=True, concurrency=1).run()

    (record,) = records_about(caplog, failed)
    assert record.levelname == "ERROR"
    assert record.exc_info is not None
    assert type(record.exc_info[1]).__name__ == "FailJob"
    assert 'raise FailJob("the input is unusable")' in logging.Formatter().format(record)


def test_a_cancellation_or_a_snooze_is_no_failure_and_has_no_traceback(caplog):
    snoozed = enqueue("tests.snooze", {"times": 1, "delay": 60})

    with caplog.at_level(logging.DEBUG, logger="django_pgqueue"):
        Worker(burst=True, concurrency=1).run()

    (record,) = records_about(caplog, snoozed)
    assert (record.levelname, record.exc_info) == ("INFO", None)


def test_a_process_isolated_failure_is_logged_once_with_its_childs_traceback(
    caplog, clean_registry, monkeypatch
):
    monkeypatch.setenv("PGQUEUE_TEST_PROCESS_JOBS", "1")
    process_jobs.register()
    failed = enqueue("tests.process.raises")

    with caplog.at_level(logging.DEBUG, logger="django_pgqueue"):
        Worker(burst=True, concurrency=1).run()

    (record,) = records_about(caplog, failed)
    assert record.levelname == "ERROR"
    message = record.getMessage()
    assert message.startswith(f"job {failed.id} (tests.process.raises) failed: ValueError")
    assert "Traceback (most recent call last)" in message
    assert 'raise ValueError(f"broken in process {os.getpid()}")' in message


def test_a_killed_child_is_one_record_per_attempt(caplog, clean_registry, monkeypatch):
    monkeypatch.setenv("PGQUEUE_TEST_PROCESS_JOBS", "1")
    process_jobs.register()
    exits = enqueue("tests.process.exits")

    with caplog.at_level(logging.DEBUG, logger="django_pgqueue"):
        for _ in range(20):
            Worker(burst=True, concurrency=1).run()
            exits.refresh_from_db()
            if exits.status == "failed":
                break
            time.sleep(0.05)

    records = records_about(caplog, exits)
    assert [(record.levelname, record.attempt) for record in records] == [
        ("WARNING", 1),
        ("ERROR", 2),
    ]
    assert "the process running the handler exited with status 3" in records[1].getMessage()


# -- The API's records -------------------------------------------------------------------


def test_enqueue_logs_each_job_it_inserts_with_its_fields_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger="django_pgqueue.enqueue"):
        one = enqueue("tests.returns", {"n": 1}, queue="mail")
        many = enqueue_many([{"job_type": "tests.noop"}, {"job_type": "tests.noop"}])

    for job, queue in [(one, "mail"), (many[0], "default"), (many[1], "default")]:
        (record,) = records_about(caplog, job)
        assert record.levelname == "DEBUG"
        assert (record.job_type, record.queue, record.attempt, record.worker_id) == (
            job.job_type,
            queue,
            0,
            None,
        )
        assert record.getMessage() == f"job {job.id} ({job.job_type}) enqueued on queue {queue}"


def test_a_unique_key_held_by_a_job_is_logged_about_that_job(caplog):
    holder = enqueue("tests.noop", unique_key="report:1")

    with caplog.at_level(logging.DEBUG, logger="django_pgqueue.enqueue"):
        assert enqueue("tests.noop", unique_key="report:1").id == holder.id

    (record,) = records_about(caplog, holder)
    assert record.getMessage() == f"unique_key 'report:1' is held by job {holder.id}: not enqueued"


def test_an_undecodable_jobs_record_names_it_with_the_columns_it_could_read(caplog):
    (bad,) = enqueue_many([{"job_type": "tests.noop", "queue": "mail", "max_attempts": 1}])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgqueue_jobs SET run_at = '-infinity' WHERE id = %s", [bad.id])

    with caplog.at_level(logging.ERROR, logger="django_pgqueue.worker"):
        Worker(burst=True, concurrency=1, worker_id="undecoding-worker").run()

    (record,) = records_about(caplog, bad)
    assert (record.job_type, record.queue, record.attempt, record.worker_id) == (
        "tests.noop",
        "mail",
        1,
        "undecoding-worker",
    )


def test_an_outcome_refused_because_the_job_was_recovered_names_the_job(caplog, make_job):
    stale = make_job(status="running", worker_id="w-lost", attempts=1)
    runner = Worker(burst=True, worker_id="w-lost")
    outcome = Outcome(stale.id, "completed", stale.claimed_at)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgqueue_jobs SET worker_id = 'w-new' WHERE id = %s", [stale.id])
        cursor.execute(*finish_statement([outcome], "w-lost"))
        runner._outcomes = [outcome]

        with caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"):
            runner._record_finished([outcome], cursor.cursor)

    (record,) = records_about(caplog, stale)
    assert (record.worker_id, record.job_type) == ("w-lost", None)
    assert "was no longer held by w-lost" in record.getMessage()
