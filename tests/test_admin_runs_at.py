"""The job list's "runs at" column and the status of a job asked to stop: a retrying or
delayed job does not look due, and a cancellation request shows until it is done."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_pgqueue_job_changelist"


def cells(admin_client, column: str) -> dict:
    """Each listed job's cell in ``column`` (a display method of the list), by id."""
    page = admin_client.get(reverse(CHANGELIST))
    model_admin = page.context["cl"].model_admin
    display = getattr(model_admin, column)
    return {job.pk: str(display(job)) for job in page.context["cl"].result_list}


def test_runs_at_says_when_a_pending_job_is_due(admin_client, make_job):
    now = timezone.now()
    delayed = make_job(status="pending", run_at=now + timedelta(hours=2))
    retrying = make_job(
        status="pending",
        attempts=1,
        run_at=now + timedelta(minutes=5),
        started_at=now - timedelta(minutes=1),
        last_error="TimeoutError: gateway",
    )
    due = make_job(status="pending", run_at=now - timedelta(seconds=5))
    running = make_job(status="running", worker_id="w", started_at=now)
    waiting = make_job(status="waiting")

    shown = cells(admin_client, "runs_at")

    assert ">in 2h" in shown[delayed.pk] or ">in 1h 59m" in shown[delayed.pk]
    assert ">in 5m" in shown[retrying.pk] or ">in 4m" in shown[retrying.pk]
    assert ">due<" in shown[due.pk]
    assert shown[running.pk] == ""
    assert shown[waiting.pk] == "after its dependencies"


def test_a_job_asked_to_stop_says_so_until_it_stops(admin_client, make_job):
    asked = make_job(
        status="running",
        worker_id="w",
        started_at=timezone.now(),
        cancel_requested_at=timezone.now(),
    )
    plain = make_job(status="running", worker_id="w", started_at=timezone.now())

    badges = cells(admin_client, "status_badge")
    live = admin_client.get(
        reverse("admin:django_pgqueue_job_live"), {"id": [str(asked.pk), str(plain.pk)]}
    ).json()

    assert ">Running, cancel requested<" in badges[asked.pk]
    assert ">Running<" in badges[plain.pk]
    labels = {job["id"]: job["status_label"] for job in live["jobs"]}
    assert labels == {str(asked.pk): "Running, cancel requested", str(plain.pk): "Running"}
