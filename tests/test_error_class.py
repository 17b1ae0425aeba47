"""``Job.error_class``: the exception class a job's ``last_error`` begins with, kept by the
database on every path that writes an error, and filled in by its migration."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_pgqueue import enqueue
from django_pgqueue.models import Job
from django_pgqueue.recovery import recover_stale_jobs
from django_pgqueue.schema import ERROR_CLASS_MAX_LENGTH
from django_pgqueue.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def reread(job: Job) -> Job:
    job.refresh_from_db()
    return job


def test_a_workers_failures_record_the_exception_class():
    spent = enqueue("tests.fail", max_attempts=1)
    retrying = enqueue("tests.fail")
    given_up = enqueue("tests.fail_now")
    completed = enqueue("tests.noop")

    Worker(burst=True, concurrency=1, worker_id="w-errors").run()

    assert (reread(spent).status, spent.error_class) == ("failed", "RuntimeError")
    assert (reread(retrying).status, retrying.error_class) == ("pending", "RuntimeError")
    assert reread(given_up).status == "failed"
    assert given_up.error_class == given_up.last_error.split(":")[0] != ""
    assert (reread(completed).status, completed.error_class) == ("completed", "")


def test_a_lost_workers_error_has_no_class_and_replaces_the_previous_one(make_job):
    lost = make_job(
        status="running",
        attempts=2,
        max_attempts=2,
        worker_id="w-gone",
        heartbeat_at=timezone.now() - timedelta(hours=1),
        last_error="RuntimeError: the first attempt's",
    )
    assert lost.error_class == "RuntimeError"

    (recovered,) = recover_stale_jobs(60)

    assert recovered.id == lost.id
    assert reread(lost).status == "failed"
    assert "w-gone" in lost.last_error
    assert lost.error_class == ""


@pytest.mark.parametrize(
    ("error", "error_class"),
    [
        ("ValueError: bad", "ValueError"),
        ("payments.gateway.CardDeclined: card 4242", "payments.gateway.CardDeclined"),
        ("Not run: it runs only after a failure", ""),
        ("ValueError", ""),
        (": no class", ""),
        ("9Lives: not a name", ""),
        ("x" * 300 + ": long", "x" * ERROR_CLASS_MAX_LENGTH),
    ],
)
def test_the_class_is_the_dotted_name_before_the_first_colon(make_job, error, error_class):
    assert make_job(status="failed", last_error=error).error_class == error_class


def test_the_migration_gives_jobs_failed_before_it_their_class():
    call_command("migrate", "django_pgqueue", "0035", verbosity=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO pgqueue_jobs (job_type, status, last_error) VALUES "
                "('tests.noop', 'failed', 'KeyError: sku'), ('tests.noop', 'completed', '')"
            )
    finally:
        call_command("migrate", "django_pgqueue", verbosity=0)

    assert sorted(Job.objects.values_list("status", "error_class")) == [
        ("completed", ""),
        ("failed", "KeyError"),
    ]
