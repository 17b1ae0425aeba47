"""The admin's periodic jobs page: every schedule, from code and from settings, with its
next and last tick and the job its last tick made; staff may run one now."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import enqueue, job
from django_pgqueue.models import Job, PeriodicTick, StoredSchedule
from django_pgqueue.periodic import enqueue_due_ticks, paused_schedules
from django_pgqueue.stored_schedules import save_schedule

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
    assert "No periodic job is declared or stored." in page.content.decode()


# Pause and resume ----------------------------------------------------------------------


def pause_url(name: str, action: str = "pause") -> str:
    return reverse(f"admin:django_pgqueue_job_periodic_{action}", args=[name])


def test_pause_and_resume_from_the_page_are_reported_and_audited(staff, schedules):
    client = staff("view_job", "retry_job")

    paused = client.post(pause_url("digest"), follow=True)

    assert "Periodic job “digest” paused: no tick is enqueued until it is resumed." in (
        paused.content.decode()
    )
    (row,) = [row for row in paused.context["schedules"] if row["name"] == "digest"]
    assert row["paused_since"] and row["next_tick"] == ""
    assert row["pause_url"] == pause_url("digest", "resume")
    assert set(paused_schedules()) == {"digest"}
    assert "was already paused" in client.post(pause_url("digest"), follow=True).content.decode()

    resumed = client.post(pause_url("digest", "resume"), follow=True)

    assert "Periodic job “digest” resumed: it runs from its next tick." in (
        resumed.content.decode()
    )
    assert paused_schedules() == {}
    tick = PeriodicTick.objects.get(name="digest")
    history = LogEntry.objects.filter(object_id="digest").order_by("action_time")
    assert [entry.change_message for entry in history] == [
        "Paused from the periodic jobs page.",
        "Resumed from the periodic jobs page.",
    ]
    assert all(entry.get_edited_object() == tick for entry in history)


def test_pausing_needs_the_retry_permission_a_post_and_a_known_name(staff, schedules):
    client = staff("view_job")

    page = client.get(reverse(PAGE))

    assert all(row["pause_url"] == "" for row in page.context["schedules"])
    assert client.post(pause_url("digest")).status_code == 403
    assert paused_schedules() == {}


def test_pausing_an_unknown_schedule_or_with_get_is_refused(admin_client, schedules):
    assert admin_client.post(pause_url("nope")).status_code == 404
    assert admin_client.post(pause_url("nope", "resume")).status_code == 404
    assert admin_client.get(pause_url("digest")).status_code == 405
    assert paused_schedules() == {}


# Stored schedules ----------------------------------------------------------------------


ADD = "admin:django_pgqueue_storedschedule_add"


def form(**fields: str) -> dict[str, str]:
    return {
        "name": "export",
        "job_type": "tests.noop",
        "schedule": "*/5 * * * *",
        "timezone": "",
        "data": "{}",
        "queue": "",
        "priority": "",
        "max_attempts": "",
        "unique_key": "",
        **fields,
    }


def test_staff_add_a_schedule_that_workers_then_tick(staff):
    client = staff("view_job", "add_storedschedule", "change_storedschedule")

    response = client.post(reverse(ADD), form(data='{"format": "csv"}', queue="reports"))

    assert response.status_code == 302
    row = StoredSchedule.objects.get()
    assert (row.name, row.data, row.queue, row.priority) == (
        "export",
        {"format": "csv"},
        "reports",
        None,
    )
    assert LogEntry.objects.get(object_id=str(row.pk)).is_addition()
    now = timezone.now()
    enqueue_due_ticks(now=now)
    (job,) = enqueue_due_ticks(now=now + timedelta(minutes=5))
    assert (job.data, job.queue) == ({"format": "csv"}, "reports")

    page = client.get(reverse(PAGE))
    (listed,) = page.context["schedules"]
    assert listed["source"] == "the admin (stored)"
    assert listed["edit_url"] == reverse(
        "admin:django_pgqueue_storedschedule_change", args=[row.pk]
    )
    assert page.context["add_url"] == reverse(ADD)


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"schedule": "61 * * * *"}, "schedule", "is not a valid cron expression"),
        ({"timezone": "Mars/Olympus"}, "timezone", "must be an IANA time zone name"),
        ({"data": '{"a": NaN}'}, "data", "is nan, not a JSON number"),
        ({"data": "[1, 2]"}, "data", "must be a dict"),
        ({"name": "digest"}, "name", "the code or settings declare a schedule named"),
        ({"job_type": "tests.nobody"}, "job_type", "Select a valid choice"),
        ({"queue": "no spaces"}, "queue", ""),
        ({"priority": "100000"}, "priority", ""),
    ],
)
def test_a_bad_schedule_is_a_form_error_on_its_field(
    admin_client, schedules, fields, field, message
):
    response = admin_client.post(reverse(ADD), form(**fields))

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field]
    assert message in " ".join(errors[field])
    assert not StoredSchedule.objects.exists()


def test_changing_keeps_the_name_and_deleting_drops_the_ticks(admin_client):
    row = save_schedule("export", "tests.noop", "*/5 * * * *")
    enqueue_due_ticks()
    change = reverse("admin:django_pgqueue_storedschedule_change", args=[row.pk])

    response = admin_client.post(change, form(name="renamed", schedule="@daily"))

    assert response.status_code == 302
    row.refresh_from_db()
    assert (row.name, row.schedule) == ("export", "@daily")
    delete = reverse("admin:django_pgqueue_storedschedule_delete", args=[row.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert not StoredSchedule.objects.exists()
    assert not PeriodicTick.objects.filter(name="export").exists()


@pytest.mark.parametrize(
    ("permissions", "add", "change", "view"),
    [
        ((), 403, 403, 403),
        (("view_storedschedule",), 403, 200, 200),
        (("view_storedschedule", "change_storedschedule"), 403, 200, 200),
        (("add_storedschedule", "change_storedschedule"), 200, 200, 200),
    ],
)
def test_stored_schedules_follow_their_model_permissions(staff, permissions, add, change, view):
    row = save_schedule("export", "tests.noop", "*/5 * * * *")
    client = staff(*permissions)

    assert client.get(reverse(ADD)).status_code == add
    change_url = reverse("admin:django_pgqueue_storedschedule_change", args=[row.pk])
    assert client.get(change_url).status_code == change
    listing = client.get(reverse("admin:django_pgqueue_storedschedule_changelist"))
    assert listing.status_code == view
    if "change_storedschedule" not in permissions:
        client.post(change_url, form(schedule="@daily"))
        row.refresh_from_db()
        assert row.schedule == "*/5 * * * *"


def test_anonymous_and_non_staff_users_reach_no_stored_schedule(client, django_user_model):
    row = save_schedule("export", "tests.noop", "*/5 * * * *")
    urls = [
        reverse(ADD),
        reverse("admin:django_pgqueue_storedschedule_change", args=[row.pk]),
        reverse("admin:django_pgqueue_storedschedule_changelist"),
    ]
    for url in urls:
        assert client.get(url).status_code == 302  # to the login page
    user = django_user_model.objects.create_user(username="visitor", password="pw")
    client.force_login(user)
    for url in urls:
        assert client.get(url).status_code == 302
    assert client.post(pause_url("export")).status_code == 302
    assert paused_schedules() == {}


def test_an_ignored_stored_schedule_is_named_on_the_page(admin_client, schedules):
    StoredSchedule.objects.create(name="digest", job_type="tests.noop", schedule="@daily")

    page = admin_client.get(reverse(PAGE))

    assert "Stored schedule “digest” is ignored: the code or settings declare" in (
        page.content.decode()
    )


def test_pausing_and_adding_schedules_need_a_csrf_token(django_user_model, schedules):
    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    assert client.post(pause_url("digest")).status_code == 403
    assert client.post(reverse(ADD), form()).status_code == 403

    assert paused_schedules() == {}
    assert not StoredSchedule.objects.exists()
