"""The admin's errors page: failed jobs grouped by job type and error class, each group
linked to its jobs and retried whole with one button."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from django_pgqueue.models import Job

pytestmark = pytest.mark.django_db

ERRORS = "admin:django_pgqueue_job_errors"
RETRY = "admin:django_pgqueue_job_errors_retry"


@pytest.fixture
def failures(make_job):
    """Failed jobs of two types and three errors, and jobs that are not failed."""
    now = timezone.now()

    def failed(job_type, error, minutes_ago):
        return make_job(
            job_type=job_type,
            status="failed",
            last_error=error,
            completed_at=now - timedelta(minutes=minutes_ago),
        )

    jobs = {
        "timeouts": [failed("shop.charge", f"TimeoutError: gateway {n}", n) for n in (1, 2, 3)],
        "declined": [failed("shop.charge", "payments.CardDeclined: card 4242", 5)],
        "lost": [failed("shop.email", "worker w1 stopped heartbeating (last seen ...)", 9)],
    }
    make_job(job_type="shop.charge", status="completed", last_error="TimeoutError: old")
    make_job(job_type="shop.charge", status="pending", last_error="TimeoutError: retrying")
    return jobs


def rows(page) -> list[tuple[str, str, int, str]]:
    return [
        (group["job_type"], group["error_class"], group["jobs"], group["message"])
        for group in page.context["groups"]
    ]


def test_failed_jobs_are_grouped_by_type_and_error_class_largest_first(admin_client, failures):
    page = admin_client.get(reverse(ERRORS))

    assert page.status_code == 200
    assert rows(page) == [
        ("shop.charge", "TimeoutError", 3, "TimeoutError: gateway 1"),
        ("shop.charge", "payments.CardDeclined", 1, "payments.CardDeclined: card 4242"),
        ("shop.email", "", 1, "worker w1 stopped heartbeating (last seen ...)"),
    ]
    assert "(no exception class)" in page.content.decode()


def test_a_groups_link_lists_exactly_its_jobs(admin_client, failures):
    (timeouts, *_) = admin_client.get(reverse(ERRORS)).context["groups"]

    listed = admin_client.get(timeouts["url"])

    assert {job.pk for job in listed.context["cl"].result_list} == {
        job.pk for job in failures["timeouts"]
    }


def test_the_errors_filter_also_selects_errors_without_a_class(admin_client, failures):
    listed = admin_client.get(reverse("admin:django_pgqueue_job_changelist") + "?error=")

    assert [job.pk for job in listed.context["cl"].result_list] == [failures["lost"][0].pk]


def test_retrying_a_group_retries_its_jobs_only_and_records_each(staff, failures):
    client = staff("view_job", "retry_job")

    response = client.post(
        reverse(RETRY), {"job_type": "shop.charge", "error_class": "TimeoutError"}, follow=True
    )

    assert response.redirect_chain[-1][0] == reverse(ERRORS)
    statuses = {job.pk: job.status for job in Job.objects.all()}
    assert {statuses[job.pk] for job in failures["timeouts"]} == {"pending"}
    assert statuses[failures["declined"][0].pk] == "failed"
    assert statuses[failures["lost"][0].pk] == "failed"
    assert LogEntry.objects.filter(change_message="Retried.").count() == 3
    assert "Retry: 3 changed, 0 skipped" in response.content.decode()


def test_staff_who_may_only_view_see_the_groups_without_buttons(staff, failures):
    client = staff("view_job")

    page = client.get(reverse(ERRORS))
    refused = client.post(
        reverse(RETRY), {"job_type": "shop.charge", "error_class": "TimeoutError"}
    )

    assert page.status_code == 200 and page.context["retry_url"] is None
    assert "Retry all" not in page.content.decode()
    assert refused.status_code == 403
    assert Job.objects.filter(status="failed").count() == 5


@pytest.mark.parametrize("who", ["anonymous", "not staff", "staff without view_job"])
def test_others_cannot_see_the_page(client, django_user_model, staff, failures, who):
    if who == "not staff":
        client.force_login(django_user_model.objects.create_user(username="u", password="p"))
    elif who == "staff without view_job":
        client = staff()

    page = client.get(reverse(ERRORS))

    if who == "staff without view_job":
        assert page.status_code == 403
    else:
        assert page.status_code == 302 and "/login/" in page["Location"]


def test_retry_needs_a_post_and_a_group(admin_client):
    assert admin_client.get(reverse(RETRY)).status_code == 405
    assert admin_client.post(reverse(RETRY), {}).status_code == 404


def test_no_failed_jobs_says_so(admin_client, make_job):
    make_job(status="completed")

    page = admin_client.get(reverse(ERRORS))

    assert page.context["groups"] == []
    assert "No failed jobs." in page.content.decode()


def test_each_group_quotes_its_own_newest_error_when_moments_are_shared(admin_client, make_job):
    moment = timezone.now() - timedelta(minutes=5)
    for error, completed_at in (
        ("TimeoutError: the newest", moment + timedelta(minutes=4)),
        ("TimeoutError: older, at the other group's moment", moment),
        ("KeyError: 'sku'", moment),
    ):
        make_job(
            job_type="shop.charge", status="failed", last_error=error, completed_at=completed_at
        )

    page = admin_client.get(reverse(ERRORS))

    assert {(job_type, error): message for job_type, error, _, message in rows(page)} == {
        ("shop.charge", "TimeoutError"): "TimeoutError: the newest",
        ("shop.charge", "KeyError"): "KeyError: 'sku'",
    }
