"""The jobs admin given what it did not expect: searches and filters PostgreSQL cannot
compare, pages past an estimated count, bulk actions racing workers, jobs waiting for
their retry, ids of one minute, queues nothing names, and missing pages.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.messages import constants as message_levels
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import enqueue_many
from django_pgqueue.admin import EstimatedCountPaginator
from django_pgqueue.models import Job, JobQuerySet, QueueState
from tests.test_admin import CHANGELIST, OVERVIEW, change_url, messages_of, run_action

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(staff: Any) -> Any:
    """Staff who may see jobs and retry, cancel and run them now (the test client)."""
    return staff("view_job", "retry_job")


# -- searches and filters PostgreSQL cannot compare ---------------------------------------


@pytest.mark.parametrize(
    ("term", "reason"),
    [
        ("order_id=NaN", "NaN is not a JSON value PostgreSQL can store"),
        ("x=Infinity", "Infinity is not a JSON value PostgreSQL can store"),
        ("x=-Infinity", "-Infinity is not a JSON value PostgreSQL can store"),
        ("x=1e999999", "1e999999 is beyond the JSON numbers PostgreSQL can store"),
        ('{"a": NaN}', "NaN is not a JSON value PostgreSQL can store"),
        ('{"a": "\\u0000"}', "PostgreSQL cannot store a NUL character"),
        ('{"a": {"b": ["\\u0000"]}}', "PostgreSQL cannot store a NUL character"),
        ('{"a": "\\ud800"}', "PostgreSQL cannot store a lone surrogate"),
        ('{"\\udfff": 1}', "PostgreSQL cannot store a lone surrogate"),
        ('x="\\ud800"', "PostgreSQL cannot store a lone surrogate"),
        ('x=["ok", "\\udbff"]', "PostgreSQL cannot store a lone surrogate"),
    ],
)
def test_a_search_postgresql_cannot_compare_says_why_and_finds_nothing(
    client, operator, make_job, term, reason
):
    make_job(data={"order_id": 1, "x": 2, "a": "b"})

    response = client.get(reverse(CHANGELIST), {"q": term})

    assert response.status_code == 200
    assert response.context["cl"].result_count == 0
    ((level, message),) = messages_of(response)
    assert level == message_levels.ERROR
    assert f"Nothing can match the search “{term.strip()}”: {reason}" in message


def test_numbers_jsonb_can_store_are_still_searched(client, operator, make_job):
    found = make_job(data={"amount": 1e300, "count": 10**30})
    make_job(data={"amount": 1.5})

    for term in ("amount=1e300", "count=1000000000000000000000000000000"):
        response = client.get(reverse(CHANGELIST), {"q": term})
        assert [job.pk for job in response.context["cl"].result_list] == [found.pk], term


@pytest.mark.parametrize("parameter", ["queue", "job_type", "error"])
def test_a_nul_in_the_apps_filters_matches_nothing(client, operator, make_job, parameter):
    make_job()

    response = client.get(f"{reverse(CHANGELIST)}?{parameter}=%00")

    assert response.status_code == 200
    assert response.context["cl"].result_count == 0


# -- pages past an estimated count --------------------------------------------------------


@pytest.fixture
def underestimated(monkeypatch: Any, make_job: Any) -> list[Job]:
    """Nine jobs listed two a page, counted exactly up to 5 and estimated at 1 beyond:
    the count says 6 (three pages) where there are five pages."""
    monkeypatch.setattr(EstimatedCountPaginator, "exact_count_limit", 5)
    monkeypatch.setattr("django_pgqueue.admin.JobAdmin.list_per_page", 2)
    monkeypatch.setattr("django_pgqueue.admin.changelist.planner_estimate", lambda rows: 1)
    now = timezone.now()
    return [make_job(created_at=now - timedelta(seconds=i)) for i in range(9)]  # newest first


def test_every_page_past_an_estimate_is_reached_from_the_one_before(
    client, operator, underestimated
):
    seen = []
    page = 1
    while True:
        response = client.get(reverse(CHANGELIST), {"p": page})
        assert response.status_code == 200, page
        seen += [job.pk for job in response.context["cl"].result_list]
        if f"?p={page + 1}" not in response.content.decode():
            break
        page += 1

    assert seen == [job.pk for job in underestimated]
    assert page == 5
    assert response.context["cl"].paginator.count_is_estimate


def test_a_page_past_the_last_row_is_still_refused(client, operator, underestimated):
    response = client.get(reverse(CHANGELIST), {"p": 6})

    assert response.status_code == 302 and response["Location"].endswith("?e=1")


# -- what a bulk action reports -----------------------------------------------------------


def test_bulk_retry_reports_what_it_did_not_what_workers_did_after(
    client, operator, make_job, monkeypatch
):
    failed = [make_job(status="failed") for _ in range(4)]
    running = make_job(status="running", worker_id="w")
    retry = JobQuerySet.retry

    def retry_then_a_worker_fails_two(queryset: JobQuerySet) -> int:
        # As a worker claiming two of them at once and failing them again would.
        changed = retry(queryset)
        Job.objects.filter(pk__in=[failed[0].pk, failed[1].pk]).update(status="failed")
        return changed

    monkeypatch.setattr(JobQuerySet, "retry", retry_then_a_worker_fails_two)

    response = run_action(client, "retry_jobs", [*failed, running])

    assert messages_of(response) == [
        (message_levels.SUCCESS, "Retry: 4 changed, 1 skipped (not failed or cancelled).")
    ]


def test_bulk_retry_still_names_jobs_a_unique_key_holds_back(client, operator, make_job):
    make_job(status="pending", unique_key="k")
    held_back = make_job(status="failed", unique_key="k")
    free = make_job(status="failed")

    response = run_action(client, "retry_jobs", [held_back, free])

    assert messages_of(response)[0][1] == (
        "Retry: 1 changed, 0 skipped (not failed or cancelled). "
        "1 skipped (unique key held by an active job)."
    )


# -- a job waiting for its retry ----------------------------------------------------------


def test_a_job_waiting_for_its_retry_shows_when_it_is_due_not_its_last_attempt(
    client, operator, make_job
):
    earlier = timezone.now() - timedelta(seconds=30)
    job = make_job(
        status="pending",
        attempts=1,
        run_at=timezone.now() + timedelta(seconds=20),
        claimed_at=earlier,
        started_at=earlier,
    )

    page = client.get(change_url(job)).content.decode()
    listing = client.get(reverse(CHANGELIST)).content.decode()

    assert "due in 19s" in page or "due in 20s" in page
    assert "waited" not in page and "running for" not in page
    empty_start = f'data-pgqueue-job="{job.pk}" data-pgqueue-field="started" '
    assert f'{empty_start}data-pgqueue-format="short">-</span>' in listing
    assert f'{empty_start}data-pgqueue-format="full">-</span>' in page
    live = client.get(reverse("admin:django_pgqueue_job_live"), {"id": job.pk}).json()
    assert live["jobs"][0]["started_at"] == {"short": "", "full": ""}


# -- ids that tell jobs apart -------------------------------------------------------------


def test_the_id_column_tells_apart_jobs_of_the_same_minute(client, operator):
    jobs = enqueue_many([{"job_type": "tests.noop"} for _ in range(20)])

    listing = client.get(reverse(CHANGELIST)).content.decode()

    shown = {str(job.pk)[-12:] for job in jobs if f"…{str(job.pk)[-12:]}</code>" in listing}
    assert len(shown) == 20
    assert len({str(job.pk)[:8] for job in jobs}) < 20  # the old column: the same prefix


# -- queues nothing names, and missing pages ----------------------------------------------


def queue_action(queue: str, action: str) -> str:
    return reverse("admin:django_pgqueue_job_queue_action", args=[queue, action])


def test_a_queue_nothing_names_cannot_be_paused(client, operator, make_job):
    response = client.post(queue_action("no-such-queue", "pause"))

    assert response.status_code == 404
    assert "no-such-queue" in response.content.decode()
    assert not QueueState.objects.filter(name="no-such-queue").exists()
    assert "no-such-queue" not in client.get(reverse(OVERVIEW)).content.decode()


def test_a_queue_with_only_finished_jobs_can_be_paused_and_resumed(client, operator, make_job):
    make_job(status="completed", queue="reports")

    assert client.post(queue_action("reports", "pause")).status_code == 302
    assert QueueState.objects.get(name="reports").paused_at is not None
    assert client.post(queue_action("reports", "resume")).status_code == 302


@pytest.mark.parametrize(
    "url",
    [
        lambda: queue_action("default", "explode"),
        lambda: queue_action(" ", "pause"),
        lambda: reverse("admin:django_pgqueue_job_action", args=[uuid.uuid4(), "retry"]),
        lambda: reverse("admin:django_pgqueue_job_action", args=[uuid.uuid4(), "explode"]),
    ],
)
def test_the_apps_not_found_pages_say_what_was_not_found(client, operator, url):
    response = client.post(url())

    assert response.status_code == 404
    assert response.content.strip(), "an empty 404 page"
    content = response.content.decode()
    assert '<p class="errornote">No ' in content
    assert '<div class="breadcrumbs">' in content and reverse(CHANGELIST) in content


def test_a_nul_in_a_queue_action_is_not_found(client, operator):
    queue = quote("a\x00b")
    response = client.post(f"{reverse(CHANGELIST)}overview/queues/{queue}/pause/")

    assert response.status_code == 404
