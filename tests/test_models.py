"""The Job model: progress written at once, state transitions, database constraints."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from django_pgqueue import InvalidJobError
from django_pgqueue.models import Job

pytestmark = pytest.mark.django_db


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def progress_seen_by(other_connection, job):
    return other_connection.execute(
        "SELECT progress, current_stage, events_count FROM pgqueue_jobs WHERE id = %s", [job.id]
    ).fetchone()


# -- set_progress -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_set_progress_is_visible_to_others_while_the_caller_is_inside_a_transaction(
    other_connection, make_job
):
    job = make_job(status="running", worker_id="w")

    with transaction.atomic():
        job.set_progress(40, "resizing")
        assert progress_seen_by(other_connection, job) == (40, "resizing", 1)


@pytest.mark.django_db(transaction=True)
def test_set_progress_survives_the_rollback_of_the_callers_transaction(other_connection, make_job):
    job = make_job(status="running", worker_id="w")

    with pytest.raises(RuntimeError), transaction.atomic():
        job.set_progress(75, "uploading")
        raise RuntimeError("handler failed")

    assert progress_seen_by(other_connection, job) == (75, "uploading", 1)


@pytest.mark.django_db(transaction=True)
def test_set_progress_outside_a_transaction_is_visible_at_once(other_connection, make_job):
    job = make_job(status="running", worker_id="w")

    job.set_progress(10, "start")

    assert progress_seen_by(other_connection, job) == (10, "start", 1)


@pytest.mark.django_db(transaction=True)
def test_set_progress_counts_events_and_keeps_the_stage_when_none_is_given(
    other_connection, make_job
):
    job = make_job(status="running", worker_id="w")

    with transaction.atomic():
        job.set_progress(10, "download")
        job.set_progress(20)
        job.set_progress(30)

    assert progress_seen_by(other_connection, job) == (30, "download", 3)
    assert (job.progress, job.current_stage, job.events_count) == (30, "download", 3)


@pytest.mark.parametrize("status", ["pending", "completed", "failed", "cancelled"])
def test_set_progress_of_a_job_not_claimed_or_running_writes_nothing(status, make_job):
    job = make_job(status=status)

    assert job.set_progress(50, "late") is False

    job.refresh_from_db()
    assert (job.progress, job.current_stage, job.events_count) == (0, "", 0)


def test_set_progress_from_a_worker_that_lost_the_job_writes_nothing(make_job):
    job = make_job(status="running", worker_id="old-worker")
    Job.objects.filter(pk=job.pk).update(worker_id="new-worker")

    assert job.set_progress(50) is False


@pytest.mark.parametrize(
    "percent", [-1, 101, 50.0, "50", True, None], ids=lambda value: repr(value)
)
def test_set_progress_rejects_a_percent_outside_0_to_100(percent, make_job):
    job = make_job(status="running", worker_id="w")

    with pytest.raises(InvalidJobError) as excinfo:
        job.set_progress(percent)

    assert excinfo.value.field == "percent"
    job.refresh_from_db()
    assert (job.progress, job.events_count) == (0, 0)


@pytest.mark.parametrize(
    "stage", ["s" * 201, 5, "nul\x00", "half \ud800"], ids=["too-long", "int", "nul", "surrogate"]
)
def test_set_progress_rejects_an_invalid_stage(stage, make_job):
    job = make_job(status="running", worker_id="w")

    with pytest.raises(InvalidJobError) as excinfo:
        job.set_progress(50, stage)

    assert excinfo.value.field == "stage"
    job.refresh_from_db()
    assert (job.progress, job.current_stage, job.events_count) == (0, "", 0)


# -- cancel, retry, run_now -------------------------------------------------------------


@pytest.fixture
def one_of_each(make_job):
    """A job in every status, keyed by status; held jobs belong to worker ``w``."""
    return {
        status: make_job(status=status, worker_id="w" if status in ("claimed", "running") else None)
        for status in ("pending", "claimed", "running", "completed", "failed", "cancelled")
    }


def reloaded(jobs):
    return {key: Job.objects.get(pk=job.pk) for key, job in jobs.items()}


def test_cancel_cancels_pending_jobs_and_asks_held_ones_to_stop(one_of_each):
    assert Job.objects.all().cancel() == 3

    after = reloaded(one_of_each)
    assert after["pending"].status == "cancelled"
    assert after["pending"].completed_at is not None
    for status in ("claimed", "running"):
        assert after[status].status == status
        assert after[status].cancel_requested_at is not None
    for status in ("completed", "failed", "cancelled"):
        assert after[status].status == status
        assert after[status].cancel_requested_at is None


def test_cancelling_again_changes_and_counts_nothing(one_of_each):
    def states():
        return [
            (job.status, job.completed_at, job.cancel_requested_at)
            for job in reloaded(one_of_each).values()
        ]

    Job.objects.all().cancel()
    first = states()

    assert Job.objects.all().cancel() == 0
    assert states() == first


def test_cancel_only_touches_the_jobs_selected(make_job):
    chosen, other = make_job(), make_job()

    assert Job.objects.filter(pk=chosen.pk).cancel() == 1
    assert Job.objects.get(pk=other.pk).status == "pending"


def test_job_cancel_and_retry_say_whether_the_job_was_eligible(make_job):
    job = make_job()

    assert job.retry() is False
    assert job.cancel() is True
    assert job.cancel() is False
    assert job.retry() is True
    assert Job.objects.get(pk=job.pk).status == "pending"


def test_retry_puts_failed_and_cancelled_jobs_back_to_pending_from_scratch(make_job):
    now = db_now()
    earlier = now - timedelta(hours=1)
    spent = dict(
        attempts=3,
        max_attempts=3,
        worker_id="w",
        claimed_at=earlier,
        started_at=earlier,
        heartbeat_at=earlier,
        completed_at=earlier,
        progress=60,
        run_at=earlier,
    )
    failed = make_job(status="failed", last_error="boom", **spent)
    cancelled = make_job(status="cancelled", cancel_requested_at=earlier, **spent)
    completed = make_job(status="completed", **spent)

    assert Job.objects.all().retry() == 2

    for job in (failed, cancelled):
        job.refresh_from_db()
        assert (job.status, job.attempts, job.progress, job.worker_id) == ("pending", 0, 0, None)
        assert job.run_at >= now
        assert [
            job.claimed_at,
            job.started_at,
            job.heartbeat_at,
            job.completed_at,
            job.cancel_requested_at,
        ] == [None] * 5
    completed.refresh_from_db()
    assert (completed.status, completed.attempts) == ("completed", 3)


def test_retry_leaves_jobs_that_are_not_finished_unsuccessfully_alone(one_of_each):
    for status in ("failed", "cancelled"):
        one_of_each.pop(status).delete()
    before = reloaded(one_of_each)

    assert Job.objects.all().retry() == 0
    assert {key: job.status for key, job in reloaded(one_of_each).items()} == {
        key: job.status for key, job in before.items()
    }


def test_run_now_makes_delayed_pending_jobs_due_at_once(make_job):
    later = db_now() + timedelta(hours=1)
    delayed = make_job(run_at=later)
    due = make_job()
    cancelled = make_job(status="cancelled", run_at=later)

    assert Job.objects.all().run_now() == 1

    delayed.refresh_from_db()
    assert db_now() <= delayed.run_at < db_now() + timedelta(seconds=5)
    assert Job.objects.get(pk=due.pk).run_at == due.run_at
    assert Job.objects.get(pk=cancelled.pk).run_at == later


# -- Constraints in the database --------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "value", "constraint"),
    [
        ("status", "bogus", "pgqueue_jobs_status_valid"),
        ("status", "", "pgqueue_jobs_status_valid"),
        ("progress", 101, "pgqueue_jobs_progress_percent"),
        ("progress", -1, "pgqueue_jobs_progress_percent"),
        ("priority", 1001, "pgqueue_jobs_priority_range"),
        ("priority", -1, "pgqueue_jobs_priority_range"),
        ("max_attempts", 0, "pgqueue_jobs_max_attempts_positive"),
        ("attempts", -1, "pgqueue_jobs_attempts_not_negative"),
    ],
)
def test_database_rejects_invalid_values_written_with_raw_sql(make_job, column, value, constraint):
    job = make_job()

    with (
        pytest.raises(IntegrityError, match=constraint),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(f"UPDATE pgqueue_jobs SET {column} = %s WHERE id = %s", [value, job.pk])

    job.refresh_from_db()
    assert (job.status, job.progress, job.priority) == ("pending", 0, 100)


def test_set_progress_from_an_earlier_attempt_writes_nothing(make_job):
    job = make_job(status="running", worker_id="w", attempts=1)
    Job.objects.filter(pk=job.pk).update(attempts=2)  # recovered, then claimed again by "w"

    assert job.set_progress(50) is False
