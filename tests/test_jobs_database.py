"""``PGQUEUE["DATABASE"] = "jobs"`` and no database router: every public operation acts
on the ``jobs`` alias, and none of the app's rows lands in ``default``.

``default`` keeps what is not the queue's (users, sessions, the test app's orders). Each
test writes through one path (ORM, SQL, admin, a command, a worker) and reads through
another, so two rules for "which database holds the jobs" cannot both pass.
"""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.metrics import QueueCollector
from django_pgqueue.models import (
    ConcurrencyLimit,
    Job,
    JobEvent,
    JobStatus,
    PeriodicTick,
    QueueState,
    WorkerRecord,
)
from django_pgqueue.periodic import enqueue_due_ticks, schedules
from django_pgqueue.pruning import prune_jobs
from django_pgqueue.queues import paused_queues
from django_pgqueue.recovery import recover_stale_jobs
from django_pgqueue.stats import snapshot
from django_pgqueue.tasks_compat import TaskResultStatus
from django_pgqueue.worker import Worker
from tests.testapp import tasks as test_tasks

JOBS = "jobs"
BOTH = ["default", JOBS]
TABLES = (
    "pgqueue_jobs",
    "pgqueue_job_events",
    "pgqueue_workers",
    "pgqueue_queues",
    "pgqueue_limits",
    "pgqueue_periodic",
)

pytestmark = pytest.mark.django_db(databases=BOTH)
in_transactions = pytest.mark.django_db(databases=BOTH, transaction=True)

CHANGELIST = "admin:django_pgqueue_job_changelist"
OVERVIEW = "admin:django_pgqueue_job_overview"


@pytest.fixture(autouse=True)
def jobs_database(pgqueue_settings: Any) -> None:
    pgqueue_settings(DATABASE=JOBS)


def rows_in(alias: str) -> dict[str, int]:
    """The app's tables of ``alias`` that hold rows, with their row counts."""
    counts = {}
    with connections[alias].cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"SELECT count(*) FROM {table}")
            (count,) = cursor.fetchone()
            if count:
                counts[table] = count
    return counts


def in_jobs(job: Job | Any) -> Job:
    """The job as the ``jobs`` database holds it, named explicitly."""
    return Job.objects.using(JOBS).get(pk=getattr(job, "pk", job))


# -- the ORM ------------------------------------------------------------------------------


def test_enqueued_jobs_are_found_by_the_orm():
    job = enqueue("tests.noop", {"n": 1})

    assert job._state.db == JOBS
    assert Job.objects.get(pk=job.pk).data == {"n": 1}
    assert Job.objects.db == JOBS
    assert rows_in("default") == {}


def test_a_job_enqueued_with_using_stays_in_that_database():
    job = enqueue("tests.noop", using="default")

    assert job.cancel() is True

    assert Job.objects.using("default").get(pk=job.pk).status == JobStatus.CANCELLED
    assert not Job.objects.exists()  # nothing in the jobs database


def test_enqueue_many_writes_plain_and_unique_jobs_to_the_jobs_database():
    plain = enqueue_many([{"job_type": "tests.noop"}] * 3)
    unique = enqueue_many([{"job_type": "tests.noop", "unique_key": "k"}])

    assert Job.objects.count() == 4
    assert {job._state.db for job in [*plain, *unique]} == {JOBS}
    assert Job.objects.get(unique_key="k").pk == unique[0].pk
    assert rows_in("default") == {}


def test_models_created_and_saved_through_the_orm_go_to_the_jobs_database():
    created = Job.objects.create(job_type="tests.noop")
    saved = Job(job_type="tests.noop", queue="other")
    saved.save()
    saved.refresh_from_db()
    WorkerRecord.objects.create(worker_id="w", hostname="h", pid=1, concurrency=1)

    assert saved._state.db == JOBS
    assert {job.pk for job in Job.objects.using(JOBS)} == {created.pk, saved.pk}
    assert rows_in(JOBS) == {"pgqueue_jobs": 2, "pgqueue_workers": 1}
    assert rows_in("default") == {}

    saved.delete()
    assert rows_in(JOBS) == {"pgqueue_jobs": 1, "pgqueue_workers": 1}


def test_cancel_cancels_an_enqueued_job():
    job = enqueue("tests.noop")

    assert job.cancel() is True

    assert in_jobs(job).status == JobStatus.CANCELLED
    assert rows_in("default") == {}


def test_cancel_asks_a_running_job_to_stop_and_the_job_sees_it(make_job):
    job = make_job(status="running", worker_id="w")

    assert Job.objects.filter(pk=job.pk).cancel() == 1

    assert in_jobs(job).cancel_requested_at is not None
    assert job.is_cancel_requested() is True
    assert rows_in("default") == {}


def test_retry_puts_a_failed_job_back(make_job):
    job = make_job(status="failed", attempts=3, completed_at=timezone.now())

    assert job.retry() is True

    assert (in_jobs(job).status, in_jobs(job).attempts) == (JobStatus.PENDING, 0)
    assert rows_in("default") == {}


def test_run_now_makes_a_delayed_job_due():
    job = enqueue("tests.noop", delay=3600)

    assert Job.objects.filter(pk=job.pk).run_now() == 1

    assert in_jobs(job).run_at <= timezone.now()
    assert rows_in("default") == {}


@in_transactions  # set_progress commits on a side connection: the job must be committed
def test_progress_of_a_running_job_is_written_with_its_event(make_job):
    job = make_job(status="running", worker_id="w")

    assert job.set_progress(40, "halfway") is True

    assert (in_jobs(job).progress, in_jobs(job).current_stage) == (40, "halfway")
    assert list(job.events.values_list("progress", "stage")) == [(40, "halfway")]
    assert JobEvent.objects.using(JOBS).filter(job_id=job.pk).count() == 1
    assert JobEvent.objects.get().job == job
    assert rows_in("default") == {}


# -- the admin ----------------------------------------------------------------------------


def post_action(client: Client, action: str, *jobs: Job) -> Any:
    return client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [str(job.pk) for job in jobs], "index": "0"},
        follow=True,
    )


def test_admin_lists_and_shows_enqueued_jobs(admin_client):
    job = enqueue("tests.noop", queue="emails")

    listing = admin_client.get(reverse(CHANGELIST))
    filtered = admin_client.get(reverse(CHANGELIST), {"queue": "emails"})
    page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[job.pk]))
    live = admin_client.get(reverse("admin:django_pgqueue_job_live"), {"id": str(job.pk)})

    assert str(job.pk)[:8] in listing.content.decode()
    assert ("emails", "emails") in filtered.context["cl"].filter_specs[1].lookup_choices
    assert str(job.pk)[:8] in filtered.content.decode()
    assert page.status_code == 200
    assert [row["id"] for row in live.json()["jobs"]] == [str(job.pk)]


def test_admin_actions_retry_cancel_and_run_now(admin_client, make_job):
    failed = make_job(status="failed", completed_at=timezone.now())
    pending = enqueue("tests.noop")
    delayed = enqueue("tests.noop", delay=3600)

    post_action(admin_client, "retry_jobs", failed)
    post_action(admin_client, "cancel_jobs", pending)
    post_action(admin_client, "run_jobs_now", delayed)

    assert in_jobs(failed).status == JobStatus.PENDING
    assert in_jobs(pending).status == JobStatus.CANCELLED
    assert in_jobs(delayed).run_at <= timezone.now()
    assert rows_in("default") == {}


def test_admin_job_page_buttons_apply_their_action(admin_client):
    job = enqueue("tests.noop")

    response = admin_client.post(
        reverse("admin:django_pgqueue_job_action", args=[job.pk, "cancel"]), follow=True
    )

    assert response.status_code == 200
    assert in_jobs(job).status == JobStatus.CANCELLED


def test_admin_overview_counts_jobs_and_pauses_queues(admin_client):
    enqueue("tests.noop", queue="emails")
    WorkerRecord.objects.create(worker_id="w-1", hostname="h", pid=1, concurrency=1)

    admin_client.post(reverse("admin:django_pgqueue_job_queue_action", args=["emails", "pause"]))
    overview = admin_client.get(reverse(OVERVIEW))

    (emails,) = [row for row in overview.context["queues"] if row["queue"] == "emails"]
    assert emails["pending"] == 1
    assert emails["paused_at"]
    assert [row["record"].worker_id for row in overview.context["workers"]] == ["w-1"]
    assert paused_queues() == ["emails"]
    assert rows_in("default") == {}


# -- stats, metrics and commands ----------------------------------------------------------


def test_stats_count_jobs_and_workers_written_through_the_orm(make_job):
    make_job(queue="emails")
    make_job(queue="emails", status="running", worker_id="w-1", started_at=timezone.now())
    WorkerRecord.objects.create(worker_id="w-1", hostname="h", pid=1, concurrency=1)
    ConcurrencyLimit.objects.create(scope="queue", name="emails", declared=2)

    (emails,) = snapshot().queues

    assert (emails.name, emails.pending, emails.running, emails.max_running) == ("emails", 1, 1, 2)
    assert [worker.worker_id for worker in snapshot().workers] == ["w-1"]


def test_metrics_count_jobs_written_through_the_orm(make_job):
    make_job(queue="emails")

    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in QueueCollector().collect()
        for sample in family.samples
    }

    assert samples[("pgqueue_jobs", (("queue", "emails"), ("status", "pending")))] == 1


def test_status_command_shows_jobs_and_workers_written_through_the_orm(make_job):
    make_job(queue="emails")
    WorkerRecord.objects.create(worker_id="w-1", hostname="h", pid=1, concurrency=1)
    out = StringIO()

    call_command("pgqueue_status", "--json", stdout=out)

    shown = json.loads(out.getvalue())
    assert [(queue["name"], queue["pending"]) for queue in shown["queues"]] == [("emails", 1)]
    assert [worker["worker_id"] for worker in shown["workers"]] == ["w-1"]


def test_queue_command_pauses_queues_the_orm_sees():
    call_command("pgqueue_queue", "pause", "emails", stdout=StringIO())

    assert QueueState.objects.get(name="emails").paused_at is not None
    assert rows_in("default") == {}


def test_pruning_deletes_old_finished_jobs(make_job):
    old = timezone.now() - timedelta(days=30)
    make_job(status="completed", completed_at=old)
    make_job(status="cancelled", completed_at=old)
    kept = make_job(status="completed", completed_at=timezone.now())

    assert prune_jobs(older_than=86400) == 2

    assert list(Job.objects.values_list("pk", flat=True)) == [kept.pk]


def test_prune_command_deletes_old_finished_jobs(make_job):
    make_job(status="failed", completed_at=timezone.now() - timedelta(days=30))

    call_command("pgqueue_prune", "--older-than", "86400", "--include-failed", stdout=StringIO())

    assert not Job.objects.exists()


def test_recovery_returns_stale_jobs_to_pending(make_job):
    stale = timezone.now() - timedelta(hours=1)
    job = make_job(status="running", worker_id="gone", heartbeat_at=stale, attempts=1)

    (recovered,) = recover_stale_jobs()

    assert recovered.id == job.pk
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING


def test_recover_command_returns_stale_jobs_to_pending(make_job):
    stale = timezone.now() - timedelta(hours=1)
    job = make_job(status="claimed", worker_id="gone", heartbeat_at=stale, attempts=1)

    call_command("pgqueue_recover", stdout=StringIO())

    assert Job.objects.get(pk=job.pk).status == JobStatus.PENDING


def test_periodic_ticks_enqueue_jobs_the_orm_sees(pgqueue_settings):
    pgqueue_settings(SCHEDULE={"minutely": {"job_type": "tests.noop", "schedule": "* * * * *"}})
    enqueue_due_ticks()  # the first run records the tick
    PeriodicTick.objects.filter(name="minutely").update(
        last_tick=timezone.now() - timedelta(minutes=2)
    )

    (job,) = enqueue_due_ticks()

    assert Job.objects.get(pk=job.pk).job_type == "tests.noop"
    assert PeriodicTick.objects.get(name="minutely").last_job_id == job.pk
    assert rows_in("default") == {}


def test_schedule_command_lists_the_ticks_recorded(pgqueue_settings):
    pgqueue_settings(SCHEDULE={"minutely": {"job_type": "tests.noop", "schedule": "* * * * *"}})
    schedule = next(s for s in schedules() if s.name == "minutely")
    PeriodicTick.objects.create(
        name="minutely", schedule=schedule.signature, last_tick=timezone.now()
    )
    out = StringIO()

    call_command("pgqueue_schedule", stdout=out)

    assert "(recorded, not enqueued)" in out.getvalue()


# -- the Tasks backend ---------------------------------------------------------------------


def test_tasks_are_enqueued_and_read_back_from_the_jobs_database():
    result = test_tasks.noop.enqueue()

    Job.objects.get(pk=result.id).cancel()

    assert test_tasks.noop.get_result(result.id).status == TaskResultStatus.FAILED
    assert in_jobs(result.id).status == JobStatus.CANCELLED
    assert rows_in("default") == {}


# -- workers ------------------------------------------------------------------------------


@in_transactions
def test_a_worker_runs_jobs_and_their_progress_lands_in_the_jobs_database():
    job = enqueue("tests.progress")
    task = test_tasks.add.enqueue(1, 2)

    Worker(burst=True, concurrency=1, worker_id="w-jobs").run()

    job.refresh_from_db()
    assert (job.status, job.progress) == (JobStatus.COMPLETED, 100)
    assert job.events.count() == 4
    assert test_tasks.add.get_result(task.id).return_value == 3
    assert WorkerRecord.objects.get().worker_id == "w-jobs"
    assert rows_in("default") == {}
