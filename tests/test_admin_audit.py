"""The admin's audit trail: every staff action on jobs and queues is recorded in Django's
admin log (``LogEntry``), with the user, for each object it changed, and shows in the
object's History."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import enqueue
from django_pgqueue.models import Job, QueueState

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_pgqueue_job_changelist"


@pytest.fixture
def operator(staff):
    """A client logged in as a staff user who may see and retry, cancel or run jobs."""
    return staff("view_job", "retry_job")


def act(client, action: str, jobs: list[Job]):
    return client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [str(job.pk) for job in jobs], "index": "0"},
        follow=True,
    )


def audit_of(model_object) -> list[tuple[str, str, int]]:
    """The admin log of one object: (user, message, flag), oldest first."""
    entries = LogEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(model_object),
        object_id=str(model_object.pk),
    ).order_by("action_time", "pk")
    return [(entry.user.username, entry.change_message, entry.action_flag) for entry in entries]


def test_retrying_records_each_retried_job_and_no_other(operator, make_job):
    failed = [make_job(status="failed", attempts=3) for _ in range(2)]
    completed = make_job(status="completed")

    act(operator, "retry_jobs", [*failed, completed])

    assert [audit_of(job) for job in failed] == [[("ops", "Retried.", CHANGE)]] * 2
    assert audit_of(completed) == []


def test_a_retry_that_a_held_unique_key_skips_is_not_recorded(operator, make_job):
    enqueue("tests.noop", unique_key="report")
    skipped = make_job(status="failed", unique_key="report")

    act(operator, "retry_jobs", [skipped])

    assert Job.objects.get(pk=skipped.pk).status == "failed"
    assert audit_of(skipped) == []


def test_cancelling_records_what_happened_to_each_job(operator, make_job):
    pending = make_job(status="pending")
    running = make_job(status="running", worker_id="w1", attempts=1)
    completed = make_job(status="completed")

    act(operator, "cancel_jobs", [pending, running, completed])

    assert audit_of(pending) == [("ops", "Cancelled.", CHANGE)]
    assert audit_of(running) == [("ops", "Asked to stop.", CHANGE)]
    assert audit_of(completed) == []


def test_running_now_records_the_delayed_jobs_it_made_due(operator, make_job):
    delayed = make_job(status="pending", run_at=timezone.now() + timedelta(hours=1))
    due = make_job(status="pending")

    act(operator, "run_jobs_now", [delayed, due])

    assert audit_of(delayed) == [("ops", "Made due now.", CHANGE)]
    assert audit_of(due) == []


def test_a_jobs_button_is_recorded_and_shows_in_the_jobs_history(operator, make_job):
    failed = make_job(status="failed", attempts=3)

    operator.post(reverse("admin:django_pgqueue_job_action", args=[failed.pk, "retry"]))
    history = operator.get(reverse("admin:django_pgqueue_job_history", args=[failed.pk]))

    assert audit_of(failed) == [("ops", "Retried.", CHANGE)]
    assert history.status_code == 200
    assert "Retried." in history.content.decode()


def test_pausing_and_resuming_a_queue_are_recorded_once_each(operator):
    enqueue("tests.noop", queue="emails")

    def queue_action(action: str) -> None:
        operator.post(reverse("admin:django_pgqueue_job_queue_action", args=["emails", action]))

    queue_action("pause")
    queue_action("pause")  # already paused: nothing changes, nothing is recorded
    queue_action("resume")

    state = QueueState.objects.get(name="emails")
    assert audit_of(state) == [("ops", "Paused.", CHANGE), ("ops", "Resumed.", CHANGE)]
