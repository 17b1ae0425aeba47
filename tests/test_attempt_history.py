"""A job's attempt history: every attempt that did not complete it is recorded with its
worker, times, outcome, error and traceback, by the statement that records its outcome;
the completing attempt is the job's own row. The admin shows them all."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import enqueue, job
from django_pgqueue.exceptions import RetryJob
from django_pgqueue.models import Job, JobAttempt, JobEvent, JobStatus
from django_pgqueue.recovery import recover_stale_jobs
from django_pgqueue.worker import Worker
from tests.workers import run_until_finished

pytestmark = pytest.mark.django_db(transaction=True)

#: The id of the burst workers that run the tests' jobs.
WORKER = "history-worker"


def history(job_: Job) -> list[tuple[int, str, str]]:
    return [
        (attempt.attempt, attempt.outcome, attempt.error)
        for attempt in JobAttempt.objects.filter(job=job_)
    ]


@pytest.fixture
def flaky(clean_registry):
    """``tests.flaky``: reports progress, then fails on its first attempt only."""

    @job("tests.flaky", max_attempts=3)
    def flaky_handler(job_):
        job_.set_progress(50, f"halfway, attempt {job_.attempts}")
        if job_.attempts == 1:
            raise RetryJob("the gateway is busy", delay=0.3)
        return "done"

    return flaky_handler


def test_each_failed_attempt_is_recorded_with_its_worker_times_and_traceback():
    failing = enqueue("tests.fail")

    run_until_finished(failing, worker_id=WORKER)

    assert history(failing) == [
        (1, "retried", "RuntimeError: boom on attempt 1"),
        (2, "retried", "RuntimeError: boom on attempt 2"),
        (3, "failed", "RuntimeError: boom on attempt 3"),
    ]
    for attempt in JobAttempt.objects.filter(job=failing):
        assert attempt.worker_id == WORKER
        assert attempt.started_at is not None and attempt.started_at <= attempt.ended_at
        assert attempt.duration is not None and attempt.duration >= 0
        assert f"boom on attempt {attempt.attempt}" in attempt.traceback
        assert attempt.traceback.startswith("Traceback (most recent call last)")


def test_tracebacks_are_not_stored_when_store_tracebacks_is_off(caplog):
    failing = enqueue("tests.fail")

    with override_settings(PGQUEUE={"STORE_TRACEBACKS": False}):
        done = run_until_finished(failing, worker_id=WORKER)

    assert done.status == JobStatus.FAILED
    assert done.last_error == "RuntimeError: boom on attempt 3"  # the error line stays
    assert done.last_traceback == ""
    assert [a.traceback for a in JobAttempt.objects.filter(job=failing)] == ["", "", ""]
    # The logs still carry it, for the team's own log retention.
    assert any(
        "Traceback (most recent call last)" in r.getMessage() for r in caplog.records
    ) or any(r.exc_info for r in caplog.records if "boom on attempt 3" in r.getMessage())


def test_a_completing_attempt_is_the_jobs_own_and_is_not_recorded(flaky):
    flaky_job = run_until_finished(enqueue("tests.flaky"), worker_id=WORKER)

    assert flaky_job.status == JobStatus.COMPLETED
    assert history(flaky_job) == [(1, "retried", "RetryJob: the gateway is busy")]
    assert flaky_job.attempts == 2 and flaky_job.worker_id == WORKER


def test_progress_events_name_their_attempt_and_a_retry_starts_without_a_stage(flaky):
    flaky_job = enqueue("tests.flaky")
    Worker(burst=True, concurrency=1).run()  # the first attempt only: the retry waits
    flaky_job.refresh_from_db()
    between = (flaky_job.status, flaky_job.progress, flaky_job.current_stage)

    run_until_finished(flaky_job, worker_id=WORKER)

    assert between[0] == JobStatus.PENDING
    assert between[1:] == (0, "")
    events = JobEvent.objects.filter(job=flaky_job).order_by("id")
    assert [(event.attempt, event.stage) for event in events] == [
        (1, "halfway, attempt 1"),
        (2, "halfway, attempt 2"),
    ]


def test_a_snooze_is_recorded_as_one(clean_registry):
    snoozing = enqueue("tests.snooze", {"times": 1, "delay": 0})

    run_until_finished(snoozing, worker_id=WORKER)

    assert [(number, outcome) for number, outcome, _ in history(snoozing)] == [(1, "snoozed")]


def test_recovery_records_the_attempt_a_lost_worker_was_running(make_job):
    long_ago = timezone.now() - timedelta(hours=1)
    running = make_job(
        status="running",
        worker_id="gone",
        attempts=1,
        started_at=long_ago,
        heartbeat_at=long_ago,
    )
    claimed = make_job(status="claimed", worker_id="gone", attempts=1, claimed_at=long_ago)

    recover_stale_jobs(stale_after=60)

    (lost,) = JobAttempt.objects.filter(job=running)
    assert (lost.attempt, lost.outcome, lost.worker_id) == (1, "lost", "gone")
    assert lost.started_at == long_ago
    assert lost.error.startswith("worker gone stopped heartbeating")
    assert not JobAttempt.objects.filter(job=claimed).exists()  # never started


def test_a_retry_from_the_admin_keeps_the_earlier_attempts(admin_client):
    failing = run_until_finished(enqueue("tests.fail", max_attempts=1), worker_id=WORKER)
    admin_client.post(reverse("admin:django_pgqueue_job_action", args=[failing.pk, "retry"]))

    run_until_finished(failing, worker_id="second-worker")

    assert [(a.attempt, a.worker_id) for a in JobAttempt.objects.filter(job=failing)] == [
        (1, WORKER),
        (1, "second-worker"),
    ]


def test_the_jobs_page_lists_every_attempt_with_its_error(flaky, admin_client):
    flaky_job = run_until_finished(enqueue("tests.flaky"), worker_id=WORKER)

    page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[flaky_job.pk]))

    html = page.content.decode()
    assert page.status_code == 200
    assert html.count('class="pgqueue-attempt ') == 2
    assert 'class="pgqueue-attempt pgqueue-attempt-retried"' in html
    assert "<summary>RetryJob: the gateway is busy</summary>" in html
    assert 'class="pgqueue-attempt pgqueue-attempt-completed"' in html


def test_deleting_a_job_deletes_its_attempts():
    failing = run_until_finished(enqueue("tests.fail", max_attempts=1), worker_id=WORKER)

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgqueue_jobs WHERE id = %s", [failing.pk])

    assert not JobAttempt.objects.exists()
