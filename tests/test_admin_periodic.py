"""The admin's periodic jobs page: every schedule, from code and from settings, with its
next and last tick and the job its last tick made; staff may run one now."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import enqueue, job
from django_pgqueue.models import Job
from django_pgqueue.periodic import enqueue_due_ticks

pytestmark = pytest.mark.django_db

PAGE = "admin:django_pgqueue_job_periodic"


def run_url(name: str) -> str:
    return reverse("admin:django_pgqueue_job_periodic_run", args=[name])


@pytest.fixture
def schedules(clean_registry, pgqueue_settings):
    """A schedule from code (hourly) and one from settings (every five minutes)."""

    @job("tests.periodic.hourly", schedule="@hourly")
    def hourly(job_):
        pass

    pgqueue_settings(
        SCHEDULE={
            "digest": {
                "job_type": "tests.noop",
                "schedule": "*/5 * * * *",
                "timezone": "Europe/Paris",
                "unique_key": "digest",
            }
        }
    )


def test_the_page_lists_every_schedule_with_its_ticks_and_last_job(admin_client, schedules):
    now = timezone.now()
    enqueue_due_ticks(now=now - timedelta(minutes=11))  # first sight: registered
    (made,) = [ticked for ticked in enqueue_due_ticks(now=now) if ticked.job_type == "tests.noop"]

    page = admin_client.get(reverse(PAGE))

    assert page.status_code == 200
    rows = {row["name"]: row for row in page.context["schedules"]}
    assert sorted(rows) == ["digest", "tests.periodic.hourly"]
    digest = rows["digest"]
    assert (digest["cron"], digest["zone"], digest["source"]) == (
        "*/5 * * * *",
        "Europe/Paris",
        "PGQUEUE['SCHEDULE']",
    )
    assert digest["last_job"] == made.pk and digest["last_job_status"] == "pending"
    assert digest["next_tick"] and digest["last_tick"]
    assert rows["tests.periodic.hourly"]["source"] == "@job(schedule=...)"
    assert reverse("admin:django_pgqueue_job_change", args=[made.pk]) in page.content.decode()


def test_run_now_enqueues_the_schedules_job_and_records_it(staff, schedules):
    client = staff("view_job", "retry_job")

    response = client.post(run_url("digest"), follow=True)

    (made,) = Job.objects.filter(job_type="tests.noop")
    assert made.unique_key == "digest" and made.run_at <= timezone.now()
    assert f"Periodic job “digest” enqueued now: job {made.pk}." in response.content.decode()
    assert LogEntry.objects.get(object_id=str(made.pk)).change_message == (
        "Enqueued now from the periodic jobs page."
    )


def test_run_now_says_when_the_unique_key_is_held(admin_client, schedules):
    holder = enqueue("tests.noop", unique_key="digest")

    response = admin_client.post(run_url("digest"), follow=True)

    assert Job.objects.count() == 1
    assert f"not run: job {holder.pk} with its unique key is still pending" in (
        response.content.decode()
    )


def test_view_only_staff_see_no_button_and_cannot_run(staff, schedules):
    client = staff("view_job")

    page = client.get(reverse(PAGE))

    assert all(row["run_url"] == "" for row in page.context["schedules"])
    assert client.post(run_url("digest")).status_code == 403
    assert not Job.objects.exists()


def test_unknown_schedules_and_gets_are_refused(admin_client, schedules):
    assert admin_client.post(run_url("nope")).status_code == 404
    assert admin_client.get(run_url("digest")).status_code == 405


def test_no_schedule_says_so(admin_client):
    page = admin_client.get(reverse(PAGE))

    assert page.context["schedules"] == []
    assert "No periodic job is declared." in page.content.decode()
