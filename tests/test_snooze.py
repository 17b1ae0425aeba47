"""Snooze: a handler reschedules its job without spending an attempt (``raise Snooze``),
counted on the job, capped by ``PGQUEUE["MAX_SNOOZES"]``."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from django_pgqueue import RetryJob, Snooze, enqueue, signals
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.worker import Worker
from django_pgqueue.worker.execution import RunningJob, failure_outcome
from tests.testapp.models import Execution

LONGER_THAN_1000_YEARS = 1001 * 365.25 * 86400


def run_until(job: Job, *statuses: JobStatus, rounds: int = 20) -> Job:
    """Run burst workers until ``job`` reaches one of ``statuses`` (at most ``rounds``)."""
    for _ in range(rounds):
        Worker(burst=True).run()
        job.refresh_from_db()
        if job.status in statuses:
            return job
    raise AssertionError(f"job still {job.status} after {rounds} burst runs")


# -- What a snooze does -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_snoozed_job_waits_its_delay_with_its_attempt_given_back():
    job = enqueue("tests.snooze", {"times": 1, "delay": 30})

    Worker(burst=True, worker_id="w-snooze").run()

    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert job.attempts == 0
    assert job.snoozes == 1
    assert job.worker_id is None
    assert job.worker_ids == []
    assert job.last_error == ""
    assert timedelta(seconds=30) <= job.run_at - job.claimed_at < timedelta(seconds=31)
    assert not Execution.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_job_with_one_attempt_can_snooze_again_and_again_then_complete():
    job = enqueue("tests.snooze", {"times": 3, "delay": 0})  # max_attempts=1

    job = run_until(job, JobStatus.COMPLETED, JobStatus.FAILED)

    assert job.status == JobStatus.COMPLETED
    assert (job.attempts, job.max_attempts, job.snoozes) == (1, 1, 3)
    assert list(Execution.objects.values_list("attempt", flat=True)) == [1]


@pytest.mark.django_db(transaction=True)
def test_a_snooze_sends_no_job_failed_signal():
    failures = []

    def receiver(sender, job, **kwargs):
        failures.append(job.id)

    signals.job_failed.connect(receiver)
    try:
        enqueue("tests.snooze", {"times": 1, "delay": 30})
        Worker(burst=True).run()
    finally:
        signals.job_failed.disconnect(receiver)

    assert failures == []


# -- The cap ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_snoozing_once_more_than_max_snoozes_fails_the_job_with_the_reason(pgqueue_settings):
    pgqueue_settings(MAX_SNOOZES=2)
    job = enqueue("tests.snooze", {"times": 5, "delay": 0})

    job = run_until(job, JobStatus.FAILED, JobStatus.COMPLETED)

    assert job.status == JobStatus.FAILED
    assert job.snoozes == 2
    assert job.last_error == (
        "Snooze: snoozed for 0s, but the job has already snoozed 2 time(s), the most "
        "PGQUEUE['MAX_SNOOZES'] allows (2)"
    )
    assert not Execution.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_with_max_snoozes_zero_a_snooze_fails_the_job(pgqueue_settings):
    pgqueue_settings(MAX_SNOOZES=0)
    job = enqueue("tests.snooze", {"times": 1, "delay": 30})

    Worker(burst=True).run()

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.snoozes == 0
    assert "the most PGQUEUE['MAX_SNOOZES'] allows (0)" in job.last_error


@pytest.mark.django_db
def test_retrying_a_failed_job_resets_its_snoozes(make_job):
    job = make_job(status=JobStatus.FAILED, snoozes=100, attempts=1)

    assert job.retry()

    job.refresh_from_db()
    assert (job.status, job.snoozes, job.attempts) == (JobStatus.PENDING, 0, 0)


# -- Bad delays ---------------------------------------------------------------------------


@pytest.mark.parametrize("exception", [Snooze, lambda delay: RetryJob(delay=delay)])
@pytest.mark.parametrize(
    ("delay", "message"),
    [
        (-1, "must be finite and not negative, got -1"),
        (timedelta(seconds=-5), "must be finite and not negative"),
        (math.nan, "must be finite and not negative, got nan"),
        (math.inf, "must be finite and not negative, got inf"),
        ("5", "must be a number of seconds or a timedelta, got str"),
        (True, "must be a number of seconds or a timedelta, got bool"),
        (None, "must be a number of seconds or a timedelta, got NoneType"),
    ],
)
def test_a_bad_delay_is_refused_where_the_exception_is_made(exception, delay, message):
    with pytest.raises(ValueError, match=message):
        exception(delay)


def test_a_snooze_takes_seconds_or_a_timedelta():
    assert Snooze(timedelta(minutes=2)).delay_seconds == 120.0
    assert Snooze(1.5).delay_seconds == 1.5
    assert str(Snooze(90)) == "snoozed for 90s"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("job_type", "data", "error"),
    [
        ("tests.snooze", {"delay": LONGER_THAN_1000_YEARS}, "Snooze: snoozed for"),
        ("tests.retry_later", {"delay": LONGER_THAN_1000_YEARS}, "RetryJob: not ready yet"),
    ],
    ids=["snooze", "retry"],
)
def test_a_delay_over_1000_years_fails_the_job_with_the_reason(job_type, data, error):
    job = enqueue(job_type, data)

    Worker(burst=True).run()

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.last_error.startswith(error)
    assert job.last_error.endswith(
        ": the delay is over the longest allowed, 1,000 years (31557600000 seconds)"
    )
    assert job.snoozes == 0


@pytest.mark.django_db(transaction=True)
def test_a_handler_that_snoozes_with_a_bad_delay_fails_its_attempt_with_the_reason():
    job = enqueue("tests.snooze", {"delay": -3})

    Worker(burst=True).run()

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED  # tests.snooze has one attempt
    assert job.last_error == "ValueError: Snooze delay must be finite and not negative, got -3"
    assert job.snoozes == 0


# -- Cancellation wins --------------------------------------------------------------------


@pytest.mark.django_db
def test_a_job_asked_to_stop_that_snoozes_ends_cancelled(make_job):
    job = make_job(job_type="tests.snooze", status=JobStatus.RUNNING, worker_id="w", attempts=1)
    running = RunningJob(job=job, definition=None)
    running.cancel_event.set()

    outcome = failure_outcome(running, Snooze(30))

    assert outcome.status == JobStatus.CANCELLED
    assert outcome.snoozed == 0
