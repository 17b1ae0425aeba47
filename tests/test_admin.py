"""The jobs admin through Django's test client: who may see and do what, the actions and
their reports, search, filters, counts, the job page, the overview and the live endpoint.

Browser tests of the same pages are in test_admin_browser.py.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import constants as message_levels
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import enqueue
from django_pgqueue.admin import HISTORY_SHOWN, LIVE_MAX_IDS, EstimatedCountPaginator
from django_pgqueue.models import ConcurrencyLimit, Job, JobEvent, RateLimit, WorkerRecord
from django_pgqueue.rollups import recount

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_pgqueue_job_changelist"
OVERVIEW = "admin:django_pgqueue_job_overview"
LIVE = "admin:django_pgqueue_job_live"


def change_url(job: Job) -> str:
    return reverse("admin:django_pgqueue_job_change", args=[job.pk])


def object_action_url(job: Job, action: str) -> str:
    return reverse("admin:django_pgqueue_job_action", args=[job.pk, action])


@pytest.fixture
def log_in(client: Client, django_user_model: Any) -> Callable[..., Any]:
    """Log ``client`` in as a new user: ``log_in("view_job", "retry_job", staff=True)``."""

    def make(*codenames: str, staff: bool = True, superuser: bool = False) -> Any:
        user = django_user_model.objects.create_user(
            username=f"user-{uuid.uuid4().hex[:8]}",
            password="password",
            is_staff=staff,
            is_superuser=superuser,
        )
        user.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="django_pgqueue", codename__in=codenames
            )
        )
        client.force_login(user)
        return user

    return make


@pytest.fixture
def operator(log_in: Callable[..., Any]) -> Any:
    """A staff user who may see jobs and retry, cancel and run them now."""
    return log_in("view_job", "retry_job")


def run_action(client: Client, action: str, jobs: list[Job], **extra: Any) -> Any:
    """Post a changelist action for ``jobs`` and follow the redirect."""
    return client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [str(job.pk) for job in jobs], "index": "0"},
        follow=True,
        **extra,
    )


def messages_of(response: Any) -> list[tuple[int, str]]:
    return [(message.level, message.message) for message in response.context["messages"]]


def statuses(*jobs: Job) -> list[str]:
    return [Job.objects.get(pk=job.pk).status for job in jobs]


# -- who may see what ---------------------------------------------------------------------


def every_page(job: Job) -> list[tuple[str, str]]:
    return [
        ("get", reverse(CHANGELIST)),
        ("get", change_url(job)),
        ("get", reverse(OVERVIEW)),
        ("get", f"{reverse(LIVE)}?id={job.pk}"),
        ("post", object_action_url(job, "retry")),
    ]


def test_anonymous_users_are_sent_to_the_login_page_and_see_nothing(client, make_job):
    job = make_job(status="failed", job_type="tests.secret", data={"token": "s3cret"})

    for method, url in every_page(job):
        response = getattr(client, method)(url)

        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("admin:login")), url
        assert b"s3cret" not in response.content and str(job.pk).encode() not in response.content
    assert statuses(job) == ["failed"]


def test_users_without_staff_status_are_sent_to_the_login_page(client, log_in, make_job):
    log_in("view_job", "retry_job", staff=False)
    job = make_job(status="failed")

    for method, url in every_page(job):
        response = getattr(client, method)(url)

        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("admin:login")), url
    assert statuses(job) == ["failed"]


def test_staff_without_the_view_permission_is_refused(client, log_in, make_job):
    log_in()
    job = make_job(status="failed")

    for method, url in every_page(job):
        assert getattr(client, method)(url).status_code == 403, url
    assert statuses(job) == ["failed"]


def test_staff_with_the_view_permission_sees_jobs_but_no_actions(client, log_in, make_job):
    log_in("view_job")
    job = make_job(status="failed", job_type="tests.visible")

    changelist = client.get(reverse(CHANGELIST))
    page = client.get(change_url(job))

    assert changelist.status_code == 200 and b"tests.visible" in changelist.content
    for action in (b"retry_jobs", b"cancel_jobs", b"run_jobs_now", b"delete_selected"):
        assert action not in changelist.content
    assert page.status_code == 200 and page.context["pgqueue_actions"] == []
    assert client.get(reverse(OVERVIEW)).status_code == 200
    assert client.get(f"{reverse(LIVE)}?id={job.pk}").status_code == 200


def test_staff_without_the_retry_permission_cannot_post_an_action(client, log_in, make_job):
    log_in("view_job")
    job = make_job(status="failed")

    run_action(client, "retry_jobs", [job])
    response = client.post(object_action_url(job, "retry"))

    assert response.status_code == 403
    assert statuses(job) == ["failed"]


def test_staff_with_the_retry_permission_gets_the_actions(client, operator, make_job):
    changelist = client.get(reverse(CHANGELIST))

    for action in (b"retry_jobs", b"cancel_jobs", b"run_jobs_now"):
        assert action in changelist.content
    assert b"delete_selected" not in changelist.content


def test_superusers_have_the_retry_permission(client, log_in, make_job):
    log_in(superuser=True)
    job = make_job(status="failed")

    response = run_action(client, "retry_jobs", [job])

    assert messages_of(response) == [
        (message_levels.SUCCESS, "Retry: 1 changed, 0 skipped (not failed or cancelled).")
    ]
    assert statuses(job) == ["pending"]


def test_jobs_cannot_be_added_edited_or_deleted_even_by_superusers(client, log_in, make_job):
    log_in(superuser=True)
    job = make_job(status="failed", job_type="tests.noop")

    add = client.get(reverse("admin:django_pgqueue_job_add"))
    edit = client.post(change_url(job), {"job_type": "tests.other", "status": "completed"})
    delete = client.post(reverse("admin:django_pgqueue_job_delete", args=[job.pk]), {"post": "yes"})
    page = client.get(change_url(job))

    assert (add.status_code, edit.status_code, delete.status_code) == (403, 403, 403)
    assert Job.objects.filter(pk=job.pk, job_type="tests.noop", status="failed").exists()
    assert b'name="_save"' not in page.content


def test_actions_need_a_csrf_token(operator, make_job):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    job = make_job(status="failed")

    changelist_post = client.post(
        reverse(CHANGELIST),
        {"action": "retry_jobs", "_selected_action": [str(job.pk)], "index": "0"},
    )
    object_post = client.post(object_action_url(job, "retry"))

    assert (changelist_post.status_code, object_post.status_code) == (403, 403)
    assert statuses(job) == ["failed"]


def test_object_actions_accept_only_post(client, operator, make_job):
    job = make_job(status="failed")

    assert client.get(object_action_url(job, "retry")).status_code == 405
    assert statuses(job) == ["failed"]


# -- actions ------------------------------------------------------------------------------


def test_retry_puts_failed_and_cancelled_jobs_back_and_skips_the_rest(client, operator, make_job):
    failed = make_job(status="failed", attempts=3, last_error="boom", worker_id="w")
    cancelled = make_job(status="cancelled", attempts=1)
    completed = make_job(status="completed", attempts=1)
    running = make_job(status="running", attempts=1, worker_id="w")

    response = run_action(client, "retry_jobs", [failed, cancelled, completed, running])

    assert messages_of(response) == [
        (message_levels.SUCCESS, "Retry: 2 changed, 2 skipped (not failed or cancelled).")
    ]
    assert statuses(failed, cancelled, completed, running) == [
        "pending",
        "pending",
        "completed",
        "running",
    ]
    failed.refresh_from_db()
    assert (failed.attempts, failed.worker_id) == (0, None)
    assert failed.run_at <= timezone.now()


def test_cancel_cancels_pending_jobs_asks_running_ones_and_skips_the_rest(
    client, operator, make_job
):
    pending = make_job(status="pending")
    running = make_job(status="running", worker_id="w")
    asked = make_job(status="running", worker_id="w", cancel_requested_at=timezone.now())
    completed = make_job(status="completed")

    response = run_action(client, "cancel_jobs", [pending, running, asked, completed])

    assert messages_of(response) == [
        (
            message_levels.SUCCESS,
            "Cancel: 2 changed (1 pending or waiting cancelled, 1 running asked to stop), "
            "2 skipped (finished, or already asked to stop).",
        )
    ]
    assert statuses(pending, running, completed) == ["cancelled", "running", "completed"]
    assert Job.objects.get(pk=running.pk).cancel_requested_at is not None


def test_run_now_makes_delayed_jobs_due_and_skips_the_rest(client, operator, make_job):
    delayed = make_job(status="pending", run_at=timezone.now() + timedelta(hours=1))
    due = make_job(status="pending")
    failed = make_job(status="failed", run_at=timezone.now() + timedelta(hours=1))

    response = run_action(client, "run_jobs_now", [delayed, due, failed])

    assert messages_of(response) == [
        (message_levels.SUCCESS, "Run now: 1 changed, 2 skipped (not delayed pending jobs).")
    ]
    assert Job.objects.get(pk=delayed.pk).run_at <= timezone.now()
    assert statuses(failed) == ["failed"]


def test_an_action_that_changes_nothing_warns(client, operator, make_job):
    completed = make_job(status="completed")

    response = run_action(client, "retry_jobs", [completed])

    assert messages_of(response) == [
        (message_levels.WARNING, "Retry: 0 changed, 1 skipped (not failed or cancelled).")
    ]


def test_an_action_on_every_matching_job_applies_to_the_filtered_list(client, operator, make_job):
    in_queue = [make_job(status="failed", queue="mail") for _ in range(3)]
    elsewhere = make_job(status="failed", queue="other")

    response = client.post(
        f"{reverse(CHANGELIST)}?queue=mail",
        {
            "action": "retry_jobs",
            "_selected_action": [str(in_queue[0].pk)],
            "select_across": "1",
            "index": "0",
        },
        follow=True,
    )

    assert messages_of(response)[0][1].startswith("Retry: 3 changed, 0 skipped")
    assert statuses(*in_queue, elsewhere) == ["pending", "pending", "pending", "failed"]


def test_a_job_page_offers_only_the_actions_that_apply(client, operator, make_job):
    cases = {
        "failed": make_job(status="failed"),
        "running": make_job(status="running", worker_id="w"),
        "delayed": make_job(status="pending", run_at=timezone.now() + timedelta(hours=1)),
        "completed": make_job(status="completed"),
    }

    offered = {
        name: [action["label"] for action in client.get(change_url(job)).context["pgqueue_actions"]]
        for name, job in cases.items()
    }

    assert offered == {
        "failed": ["Retry"],
        "running": ["Cancel"],
        "delayed": ["Cancel", "Run now"],
        "completed": [],
    }


def test_a_job_page_button_applies_its_action_and_returns_to_the_job(client, operator, make_job):
    job = make_job(status="failed")

    response = client.post(object_action_url(job, "retry"), follow=True)

    assert response.redirect_chain == [(change_url(job), 302)]
    assert messages_of(response) == [
        (message_levels.SUCCESS, "Retry: 1 changed, 0 skipped (not failed or cancelled).")
    ]
    assert statuses(job) == ["pending"]


def test_an_unknown_object_action_is_not_found(client, operator, make_job):
    job = make_job(status="failed")

    assert client.post(object_action_url(job, "explode")).status_code == 404
    missing = reverse("admin:django_pgqueue_job_action", args=[uuid.uuid4(), "retry"])
    assert client.post(missing).status_code == 404


# -- the changelist -----------------------------------------------------------------------


def test_changelist_shows_status_progress_attempts_and_worker(client, operator, make_job):
    job = make_job(
        status="running",
        progress=40,
        current_stage="resizing",
        attempts=2,
        max_attempts=5,
        worker_id="host:1:abc",
    )

    content = client.get(reverse(CHANGELIST)).content.decode()

    assert f'class="pgqueue-status pgqueue-status-running" data-pgqueue-job="{job.pk}"' in content
    assert 'aria-valuenow="40"' in content and "width: 40%" in content and "resizing" in content
    assert ">2 / 5<" in content and "host:1:abc" in content
    assert "django_pgqueue/admin/jobs.js" in content
    assert reverse(OVERVIEW) in content and reverse(LIVE) in content


def test_changelist_never_counts_the_whole_table(client, operator, make_job, monkeypatch):
    # More jobs than a page holds: a list of one page is counted from its rows.
    monkeypatch.setattr("django_pgqueue.admin.JobAdmin.list_per_page", 2)
    for _ in range(3):
        make_job(status="completed", queue="mail")

    with CaptureQueriesContext(connection) as queries:
        client.get(reverse(CHANGELIST))
        client.get(f"{reverse(CHANGELIST)}?status__exact=completed&queue=mail&q=tests")

    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert counts, "the changelist counted nothing"
    assert all("LIMIT" in sql.upper() for sql in counts), counts
    # Filter choices come from the newest jobs, never a DISTINCT over the whole table
    # (the rollups' small table of hours may be read whole).
    distinct = [q["sql"] for q in queries if "DISTINCT" in q["sql"].upper()]
    of_jobs = [sql for sql in distinct if "pgqueue_jobs" in sql]
    assert of_jobs and all("LIMIT" in sql.upper() for sql in of_jobs), distinct


def jobs_queries_of(queries, queue: str) -> list[str]:
    return [q["sql"] for q in queries if "pgqueue_jobs" in q["sql"] and f"'{queue}'" in q["sql"]]


def test_a_list_of_one_page_reads_its_jobs_once(client, operator, make_job):
    mail = [make_job(queue="mail") for _ in range(3)]
    make_job(queue="default")

    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(CHANGELIST), {"queue": "mail"})

    assert [job.pk for job in response.context["cl"].result_list] == [j.pk for j in mail[::-1]]
    assert "3 jobs" in response.content.decode()
    assert len(jobs_queries_of(queries, "mail")) == 1, jobs_queries_of(queries, "mail")


def test_a_list_of_several_pages_counts_them_and_shows_each(
    client, operator, make_job, monkeypatch
):
    monkeypatch.setattr("django_pgqueue.admin.JobAdmin.list_per_page", 2)
    mail = [make_job(queue="mail") for _ in range(3)][::-1]

    pages = [client.get(reverse(CHANGELIST), {"queue": "mail", "p": n}) for n in (1, 2)]

    assert [[job.pk for job in page.context["cl"].result_list] for page in pages] == [
        [mail[0].pk, mail[1].pk],
        [mail[2].pk],
    ]
    assert all("3 jobs" in page.content.decode() for page in pages)


def test_changelist_counts_exactly_up_to_the_limit(client, operator, make_job, monkeypatch):
    monkeypatch.setattr(EstimatedCountPaginator, "exact_count_limit", 5)
    for _ in range(5):
        make_job()

    content = client.get(reverse(CHANGELIST)).content.decode()

    assert "5 jobs" in content and "about" not in content


def test_changelist_estimates_beyond_the_limit_and_says_so(client, operator, make_job, monkeypatch):
    monkeypatch.setattr(EstimatedCountPaginator, "exact_count_limit", 5)
    monkeypatch.setattr("django_pgqueue.admin.JobAdmin.list_per_page", 2)
    for _ in range(8):
        make_job()

    response = client.get(reverse(CHANGELIST))

    paginator = response.context["cl"].paginator
    assert paginator.count_is_estimate and paginator.count >= 6
    assert "pgqueue-estimated" in response.content.decode()


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("order_id=42", {"int", "text"}),
        ('order_id="42"', {"text"}),
        ("order_id = 42", {"int", "text"}),
        ("email=a@example.com", {"email"}),
        ('{"customer": {"tier": "gold"}}', {"nested"}),
        ("flag=true", {"flag"}),
        ("report", {"report"}),
        ("{not json", set()),
        ("[1, 2]", set()),
    ],
)
def test_search_matches_payload_values_and_job_types(client, operator, make_job, term, expected):
    jobs = {
        "int": make_job(data={"order_id": 42}),
        "text": make_job(data={"order_id": "42"}),
        "email": make_job(data={"email": "a@example.com"}),
        "nested": make_job(data={"customer": {"tier": "gold", "id": 7}}),
        "flag": make_job(data={"flag": True}),
        "report": make_job(job_type="reports.build_monthly"),
        "other": make_job(data={"order_id": 43}),
    }

    found = {
        job.pk for job in client.get(reverse(CHANGELIST), {"q": term}).context["cl"].result_list
    }

    assert found == {jobs[name].pk for name in expected}


def test_search_by_id_finds_that_job(client, operator, make_job):
    job = make_job()
    make_job()

    response = client.get(reverse(CHANGELIST), {"q": f"  {job.pk}  "})

    assert [found.pk for found in response.context["cl"].result_list] == [job.pk]


def test_payload_search_uses_containment_served_by_the_gin_index(client, operator, make_job):
    make_job(data={"order_id": 42})

    with CaptureQueriesContext(connection) as queries:
        client.get(reverse(CHANGELIST), {"q": "order_id=42"})

    assert any('"data" @>' in q["sql"] for q in queries)


def test_filters_by_queue_job_type_and_status(client, operator, make_job):
    mail = make_job(queue="mail", job_type="shop.send_email", status="failed")
    make_job(queue="mail", job_type="shop.send_email", status="completed")
    make_job(queue="images", job_type="shop.make_thumbnail", status="failed")

    response = client.get(
        reverse(CHANGELIST),
        {"queue": "mail", "job_type": "shop.send_email", "status__exact": "failed"},
    )

    assert [job.pk for job in response.context["cl"].result_list] == [mail.pk]
    choices = {
        spec.title: [choice["display"] for choice in spec.choices(response.context["cl"])]
        for spec in response.context["cl"].filter_specs
    }
    assert {"mail", "images", "default"} <= set(choices["queue"])
    assert {"shop.send_email", "shop.make_thumbnail", "tests.progress"} <= set(choices["job type"])


# -- the job page -------------------------------------------------------------------------


def test_job_page_shows_every_field_read_only(client, operator, make_job):
    job = make_job(
        status="failed",
        data={"order_id": 42, "note": "<b>bold</b>"},
        result=None,
        last_error="RuntimeError: <boom>",
        last_traceback='Traceback (most recent call last):\n  File "x.py"\nRuntimeError: <boom>',
        attempts=3,
        worker_ids=["w1", "w2"],
    )

    content = client.get(change_url(job)).content.decode()

    assert "&quot;order_id&quot;: 42" in content
    assert "&lt;b&gt;bold&lt;/b&gt;" in content and "<b>bold</b>" not in content
    assert '<pre class="pgqueue-pre">Traceback (most recent call last):' in content
    assert "RuntimeError: &lt;boom&gt;</pre>" in content
    assert "w1, w2" in content
    form = content.split('id="job_form"')[1].split("</form>")[0]
    inputs = re.findall(r"<input[^>]*>", form)
    assert inputs and all('type="hidden"' in tag for tag in inputs), inputs
    assert "<textarea" not in form and "<select" not in form


def test_job_page_shows_how_many_times_the_job_snoozed(client, operator, make_job):
    job = make_job(status="pending", snoozes=7)

    content = client.get(change_url(job)).content.decode()

    assert re.search(r"<label>Snoozes:</label>\s*<div class=\"readonly\">7</div>", content)


def test_job_page_shows_the_concurrency_key_and_whether_the_job_is_held(client, operator, make_job):
    job = make_job(status="pending", concurrency_key="customer-42")
    Job.objects.filter(pk=job.pk).update(held=True)  # as a key at its limit holds it

    content = client.get(change_url(job)).content.decode()

    assert re.search(
        r"<label>Concurrency key:</label>\s*<div class=\"readonly\">customer-42</div>", content
    )
    assert re.search(
        r"<label>Held:</label>\s*<div class=\"readonly\"><img [^>]*alt=\"True\"", content
    )


def test_job_page_shows_whether_a_run_of_the_job_was_lost_with_its_worker(
    client, operator, make_job
):
    lost = make_job(status="pending", lost_with_worker=True)  # as recovery marks it
    fresh = make_job(status="pending")

    def shown(job):
        content = client.get(change_url(job)).content.decode()
        found = re.search(
            r"<label>Lost with worker:</label>\s*<div class=\"readonly\"><img [^>]*alt=\"(\w+)\"",
            content,
        )
        return found and found[1]

    assert (shown(lost), shown(fresh)) == ("True", "False")


def test_job_page_shows_the_newest_progress_events_oldest_first(client, operator, make_job):
    job = make_job(status="running", worker_id="w", events_count=HISTORY_SHOWN + 5)
    JobEvent.objects.bulk_create(
        JobEvent(job=job, progress=n % 101, stage=f"stage-{n:03d}")
        for n in range(HISTORY_SHOWN + 5)
    )

    content = client.get(change_url(job)).content.decode()

    shown = [f"stage-{n:03d}" for n in range(HISTORY_SHOWN + 5) if f"stage-{n:03d}" in content]
    assert shown == [f"stage-{n:03d}" for n in range(5, HISTORY_SHOWN + 5)]
    assert content.index("stage-005") < content.index(f"stage-{HISTORY_SHOWN + 4:03d}")
    assert f'<span class="pgqueue-history-total">{HISTORY_SHOWN + 5}</span>' in content


def test_job_page_shows_durations(client, operator, make_job):
    now = timezone.now()
    job = make_job(
        status="completed",
        run_at=now - timedelta(seconds=30),
        claimed_at=now - timedelta(seconds=20),
        started_at=now - timedelta(seconds=20),
        completed_at=now - timedelta(seconds=5),
    )

    content = client.get(change_url(job)).content.decode()

    assert "waited 10s after it was due; ran 15s" in content


# -- the overview -------------------------------------------------------------------------


def test_overview_counts_jobs_per_queue_and_status(client, operator, make_job):
    now = timezone.now()
    make_job(queue="mail", status="pending", run_at=now - timedelta(minutes=5))
    make_job(queue="mail", status="pending", run_at=now + timedelta(hours=1))
    just_now = make_job(queue="mail", status="completed", completed_at=now - timedelta(seconds=10))
    make_job(queue="mail", status="completed", completed_at=now - timedelta(minutes=10))
    make_job(queue="mail", status="completed", completed_at=now - timedelta(hours=2))
    make_job(queue="mail", status="failed", completed_at=now - timedelta(minutes=10))
    make_job(queue="mail", status="failed", completed_at=now - timedelta(days=3))
    make_job(queue="images", status="running", worker_id="w")
    recount(now - timedelta(days=2))  # what workers roll up, minute by minute
    # The last hour and day come from the rollups: the minutes that ended.
    rolled = int(just_now.completed_at < database_minute())

    response = client.get(reverse(OVERVIEW))

    rows = {row["queue"]: row for row in response.context["queues"]}
    mail = rows["mail"]
    assert (mail["pending"], mail["delayed"], mail["failed"]) == (2, 1, 2)
    assert mail["completed_last_minute"] == 1
    assert mail["completed_last_hour"] == 1 + rolled
    assert mail["completed_last_day"] == 2 + rolled
    assert mail["failed_last_hour"] == 1
    assert "completed" not in mail and "cancelled" not in mail  # never counted whole
    assert mail["oldest_due_wait"].startswith("5m")
    assert rows["images"]["running"] == 1 and rows["images"]["oldest_due_wait"] == ""
    totals = response.context["totals"]
    assert (totals["pending"], totals["running"], totals["failed"]) == (2, 1, 2)
    assert totals["completed_last_day"] == 2 + rolled
    content = response.content.decode()
    assert "?queue=mail&amp;status__exact=failed" in content


def test_overview_lists_workers_with_their_state_and_last_heartbeat(client, operator, make_job):
    now = timezone.now()
    WorkerRecord.objects.create(
        worker_id="alive:1", hostname="h1", pid=1, concurrency=4, heartbeat_at=now
    )
    WorkerRecord.objects.create(
        worker_id="silent:2",
        hostname="h2",
        pid=2,
        concurrency=2,
        queues=["mail"],
        heartbeat_at=now - timedelta(minutes=10),
    )
    WorkerRecord.objects.create(
        worker_id="gone:3", hostname="h3", pid=3, concurrency=1, stopped_at=now
    )
    make_job(status="running", worker_id="alive:1")

    response = client.get(reverse(OVERVIEW))

    workers = {row["record"].worker_id: row for row in response.context["workers"]}
    assert {name: row["state"] for name, row in workers.items()} == {
        "alive:1": "alive",
        "silent:2": "not responding",
        "gone:3": "stopped",
    }
    assert (workers["alive:1"]["held"], workers["silent:2"]["queues"]) == (1, "mail")
    assert workers["silent:2"]["last_seen"].startswith("10m")
    assert b"silent:2" in response.content


def test_the_app_index_links_to_the_overview(client, operator):
    response = client.get(reverse("admin:app_list", args=["django_pgqueue"]))

    assert reverse(OVERVIEW).encode() in response.content


# -- the live endpoint --------------------------------------------------------------------


def test_live_endpoint_returns_the_state_of_the_jobs_asked_for(client, operator, make_job):
    job = make_job(
        status="running", progress=75, current_stage="uploading", attempts=1, worker_id="w"
    )
    make_job(status="running")

    response = client.get(reverse(LIVE), {"id": [str(job.pk)]})

    assert response["Content-Type"] == "application/json"
    assert "no-cache" in response["Cache-Control"]
    (state,) = response.json()["jobs"]
    assert {key: state[key] for key in ("id", "status", "progress", "current_stage")} == {
        "id": str(job.pk),
        "status": "running",
        "progress": 75,
        "current_stage": "uploading",
    }
    assert (state["status_label"], state["finished"], state["worker_id"]) == (
        "Running",
        False,
        "w",
    )
    assert "history" not in response.json()


def test_live_endpoint_returns_the_history_of_one_job(client, operator, make_job):
    job = make_job(status="running", worker_id="w")
    JobEvent.objects.create(job=job, progress=25, stage="one")
    JobEvent.objects.create(job=job, progress=50, stage="two")

    response = client.get(reverse(LIVE), {"id": str(job.pk), "history": str(job.pk)})

    history = response.json()["history"]
    assert [(event["progress"], event["stage"]) for event in history] == [(25, "one"), (50, "two")]


def test_live_endpoint_rejects_what_is_not_a_job_id(client, operator):
    bad = client.get(reverse(LIVE), {"id": "1 OR 1=1"})
    too_many = client.get(
        reverse(LIVE), {"id": [str(uuid.uuid4()) for _ in range(LIVE_MAX_IDS + 1)]}
    )

    assert bad.status_code == 400 and "error" in json.loads(bad.content)
    assert too_many.status_code == 400


def test_overview_shows_queue_limits_with_links_to_edit_them(client, staff, make_job):
    from django_pgqueue.limits import override_limit
    from django_pgqueue.rate_limits import override_rate_limit

    make_job(queue="mail")
    make_job(queue="images")
    override_limit("queue", "mail", 3)
    override_rate_limit("queue", "mail", "100/s")
    override_rate_limit("queue", "reports", "5/m")  # no job: shown for its limit
    editor = staff(
        "view_job",
        "change_concurrencylimit",
        "add_concurrencylimit",
        "change_ratelimit",
        "add_ratelimit",
    )

    response = editor.get(reverse(OVERVIEW))

    rows = {row["queue"]: row for row in response.context["queues"]}
    assert (rows["mail"]["limit"], rows["mail"]["rate_limit"]) == (3, "100/s")
    assert rows["reports"]["rate_limit"] == "5/m"
    assert (rows["images"]["limit"], rows["images"]["rate_limit"]) == (None, None)
    limit = ConcurrencyLimit.objects.get(scope="queue", name="mail")
    rate = RateLimit.objects.get(scope="queue", name="mail")
    assert rows["mail"]["limit_url"] == reverse(
        "admin:django_pgqueue_concurrencylimit_change", args=[limit.pk]
    )
    assert rows["mail"]["rate_limit_url"] == reverse(
        "admin:django_pgqueue_ratelimit_change", args=[rate.pk]
    )
    # A queue without a rate limit links to the add form, for that queue.
    add = rows["images"]["rate_limit_url"]
    assert add.startswith(reverse("admin:django_pgqueue_ratelimit_add"))
    form = editor.get(add).content.decode()
    assert 'value="images"' in form
    content = response.content.decode()
    assert f'href="{rows["mail"]["rate_limit_url"]}"' in content and ">100/s</a>" in content


def test_overview_shows_limits_without_links_to_view_only_staff(client, staff, make_job):
    from django_pgqueue.rate_limits import override_rate_limit

    make_job(queue="mail")
    override_rate_limit("queue", "mail", "100/s")
    viewer = staff("view_job")

    response = viewer.get(reverse(OVERVIEW))

    [mail] = response.context["queues"]
    assert (mail["rate_limit"], mail["rate_limit_url"], mail["limit_url"]) == ("100/s", "", "")
    assert "/admin/django_pgqueue/ratelimit/" not in response.content.decode()


def database_minute():
    with connection.cursor() as cursor:
        cursor.execute("SELECT date_trunc('minute', statement_timestamp())")
        return cursor.fetchone()[0]


def test_a_search_by_part_of_a_job_type_reads_no_row_to_match_it(client, operator, make_job):
    record = make_job(job_type="tests.record")
    make_job(job_type="tests.noop")

    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(CHANGELIST), {"q": "RECORD"})

    assert [job.pk for job in response.context["cl"].result_list] == [record.pk]
    assert not [q["sql"] for q in queries if "LIKE" in q["sql"].upper()]


def test_only_indexed_columns_sort_all_jobs_and_every_column_sorts_active_ones(
    client, operator, make_job
):
    # Ids ordered against creation: neither the id nor the priority gives newest first.
    low = make_job(
        id=uuid.UUID(int=2**128 - 1), priority=1, created_at=timezone.now() - timedelta(minutes=1)
    )
    high = make_job(id=uuid.UUID(int=1), priority=900, created_at=timezone.now())
    columns = client.get(reverse(CHANGELIST)).context["cl"].list_display
    priority = columns.index("priority")  # after the actions' checkbox

    everything = client.get(reverse(CHANGELIST), {"o": str(priority)})
    pending = client.get(reverse(CHANGELIST), {"o": str(priority), "status__exact": "pending"})

    # Sorting all jobs by priority would read every row: the newest first instead.
    assert [job.pk for job in everything.context["cl"].result_list] == [high.pk, low.pk]
    assert "priority" not in everything.context["cl"].sortable_by
    assert [job.pk for job in pending.context["cl"].result_list] == [low.pk, high.pk]


def test_the_waiting_filter_lists_the_jobs_that_wait_for_others(client, operator):
    first = enqueue("tests.noop")
    waiting = enqueue("tests.noop", depends_on=[first])

    response = client.get(reverse(CHANGELIST), {"status__exact": "waiting"})

    assert [job.pk for job in response.context["cl"].result_list] == [waiting.pk]
