"""Progress events: one per ``set_progress``, written by the same statement, kept bounded,
deleted with their job."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_pgqueue.models import Job, JobEvent
from django_pgqueue.schema import EVENTS_KEPT

# Committed rows: set_progress writes on a side connection when the caller is in a
# transaction, and that connection sees only committed jobs.
pytestmark = pytest.mark.django_db(transaction=True)


def history(job):
    return list(JobEvent.objects.filter(job=job).order_by("id").values_list("progress", "stage"))


def test_set_progress_records_an_event_with_the_progress_and_stage(make_job):
    job = make_job(status="running", worker_id="w", attempts=1)

    job.set_progress(10, "download")
    job.set_progress(20)

    # A call without a stage records the stage the job is at.
    assert history(job) == [(10, "download"), (20, "download")]
    assert JobEvent.objects.filter(job=job).first().created_at is not None


def test_set_progress_writes_progress_and_event_in_one_statement(
    make_job, django_assert_num_queries
):
    job = make_job(status="running", worker_id="w", attempts=1)

    with django_assert_num_queries(1):
        assert job.set_progress(40, "resizing") is True

    assert history(job) == [(40, "resizing")]


@pytest.mark.parametrize("status", ["pending", "completed", "failed", "cancelled"])
def test_set_progress_of_a_job_not_held_records_no_event(make_job, status):
    job = make_job(status=status, worker_id="w", attempts=1)

    assert job.set_progress(50, "late") is False

    assert history(job) == []


def test_set_progress_from_a_worker_that_lost_the_job_records_no_event(make_job):
    job = make_job(status="running", worker_id="w", attempts=1)
    Job.objects.filter(pk=job.pk).update(worker_id="other")

    assert job.set_progress(50) is False

    assert history(job) == []


def test_history_is_trimmed_to_the_newest_events(make_job):
    job = make_job(status="running", worker_id="w", attempts=1)

    for n in range(1, 2 * EVENTS_KEPT + 11):
        job.set_progress(n % 101, f"step {n}")

    stages = [stage for _, stage in history(job)]
    # Event 2 * EVENTS_KEPT trimmed the history to the newest EVENTS_KEPT, itself included.
    assert len(stages) == EVENTS_KEPT + 10
    assert stages[0] == f"step {EVENTS_KEPT + 1}"
    assert stages[-1] == f"step {2 * EVENTS_KEPT + 10}"
    job.refresh_from_db()
    assert job.events_count == 2 * EVENTS_KEPT + 10


def test_a_job_never_keeps_more_than_twice_the_kept_events(make_job):
    job = make_job(status="running", worker_id="w", attempts=1)

    counts = []
    for n in range(1, 3 * EVENTS_KEPT + 1):
        job.set_progress(n % 101)
        counts.append(JobEvent.objects.filter(job=job).count())

    assert max(counts) < 2 * EVENTS_KEPT
    assert counts[-1] == EVENTS_KEPT


def test_deleting_jobs_through_the_orm_is_one_statement_and_deletes_their_events(make_job):
    job = make_job(status="running", worker_id="w", attempts=1)
    job.set_progress(50, "half")
    other = make_job(status="running", worker_id="w", attempts=1)
    other.set_progress(10)

    with CaptureQueriesContext(connection) as queries:
        Job.objects.filter(pk=job.pk).delete()

    # Django neither loads the jobs nor deletes their events itself: the database does.
    statements = [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) == 1 and statements[0].startswith('DELETE FROM "pgqueue_jobs"')

    assert history(job) == []
    assert history(other) == [(10, "")]


def test_deleting_a_job_with_sql_deletes_its_events(make_job):
    job = make_job(status="running", worker_id="w", attempts=1)
    job.set_progress(50, "half")

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgqueue_jobs WHERE id = %s", [job.pk])

    assert history(job) == []
