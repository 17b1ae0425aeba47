"""Pausing and resuming queues: the API, the claim, a real worker, the command, the admin."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_pgqueue import enqueue, pause_queue, resume_queue
from django_pgqueue.exceptions import InvalidArgumentError
from django_pgqueue.models import ConcurrencyLimit, Job, JobStatus, QueueState
from django_pgqueue.queues import known_queues, paused_queues
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db

OVERVIEW = "admin:django_pgqueue_job_overview"


def claim(batch_size: int = 10) -> list[Job]:
    """Call ``claim_job_batch`` as a worker serving every queue does."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM claim_job_batch('w', NULL, %s, NULL)", [batch_size])
        columns = [column.name for column in cursor.description]
        return [Job.from_row(columns, row, connection.alias) for row in cursor.fetchall()]


def status_of(job: Job) -> str:
    job.refresh_from_db()
    return job.status


# -- The API ------------------------------------------------------------------------------


def test_pause_and_resume_report_whether_they_changed_anything():
    assert pause_queue("video") is True
    assert pause_queue("video") is False
    assert paused_queues() == ["video"]

    assert resume_queue("video") is True
    assert resume_queue("video") is False
    assert paused_queues() == []


def test_resuming_a_queue_that_was_never_paused_changes_nothing():
    assert resume_queue("never-paused") is False
    assert not QueueState.objects.exists()


def test_a_queue_can_be_paused_before_it_has_jobs_and_is_then_known():
    pause_queue("future")

    assert "future" in known_queues()
    assert QueueState.objects.get(name="future").paused_at is not None


def test_known_queues_include_queues_with_jobs_or_limits_and_the_default(make_job):
    make_job(queue="emails")
    ConcurrencyLimit.objects.create(scope="queue", name="video", declared=2)

    assert {"default", "emails", "video"} <= set(known_queues())


@pytest.mark.parametrize("name", ["", "has space", "-leading-dash", "x" * 101, 7])
def test_invalid_queue_names_are_rejected_before_anything_is_written(name):
    with pytest.raises(InvalidArgumentError):
        pause_queue(name)
    with pytest.raises(InvalidArgumentError):
        resume_queue(name)
    assert not QueueState.objects.exists()


# -- The claim ----------------------------------------------------------------------------


def test_jobs_of_a_paused_queue_are_not_claimed_but_other_queues_are(make_job):
    paused = make_job(queue="video")
    other = make_job(queue="emails")
    pause_queue("video")

    assert [job.id for job in claim()] == [other.id]
    assert status_of(paused) == JobStatus.PENDING


def test_jobs_of_a_resumed_queue_are_claimed_again(make_job):
    job = make_job(queue="video")
    pause_queue("video")
    assert claim() == []

    resume_queue("video")

    assert [claimed.id for claimed in claim()] == [job.id]


def test_pausing_does_not_touch_jobs_already_running(make_job):
    running = make_job(queue="video", status="running", worker_id="w")
    pause_queue("video")

    assert status_of(running) == JobStatus.RUNNING


# -- Waking workers -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_resume_notifies_workers_of_the_queue(other_connection):
    pause_queue("video")
    other_connection.execute("LISTEN pgqueue_jobs")

    resume_queue("video")

    assert [n.payload for n in other_connection.notifies(timeout=5, stop_after=1)] == ["video"]


@pytest.mark.django_db(transaction=True)
def test_resume_does_not_notify_when_notify_is_off(other_connection, pgqueue_settings):
    pause_queue("video")
    other_connection.execute("LISTEN pgqueue_jobs")
    pgqueue_settings(NOTIFY=False)

    resume_queue("video")

    assert list(other_connection.notifies(timeout=0.5, stop_after=1)) == []


@pytest.mark.django_db(transaction=True)
def test_a_worker_skips_a_paused_queue_and_runs_it_promptly_once_resumed():
    pause_queue("video")
    paused = enqueue("tests.record", queue="video")
    other = enqueue("tests.record", queue="emails")

    # A long poll interval: only the NOTIFY sent by resume_queue can wake the worker.
    with worker_thread(poll_interval=30, concurrency=2):
        wait_for(lambda: status_of(other) == JobStatus.COMPLETED)
        assert status_of(paused) == JobStatus.PENDING

        resume_queue("video")

        wait_for(lambda: status_of(paused) == JobStatus.COMPLETED, timeout=10)


# -- The command --------------------------------------------------------------------------


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("pgqueue_queue", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_command_pauses_and_resumes_several_queues(make_job):
    make_job(queue="video")
    make_job(queue="images")

    out, err = run("pause", "video", "images")
    assert out.splitlines() == ["video: paused", "images: paused"]
    assert err == ""
    assert paused_queues() == ["images", "video"]

    out, _ = run("resume", "video")
    assert out.splitlines() == ["video: resumed"]
    assert paused_queues() == ["images"]


def test_command_says_when_nothing_changed():
    run("pause", "video")
    assert run("pause", "video")[0].strip() == "video: already paused"
    run("resume", "video")
    assert run("resume", "video")[0].strip() == "video: was not paused"


def test_command_warns_when_pausing_a_queue_nothing_uses(make_job):
    out, err = run("pause", "vidoe")

    assert out.strip() == "vidoe: paused"
    assert "queue 'vidoe' has no pending or running jobs, and no job type or limit" in err


def test_command_rejects_a_bad_name_and_changes_nothing():
    with pytest.raises(CommandError, match="is not a valid queue name") as excinfo:
        run("pause", "video", "bad name")

    assert "Nothing was changed" in str(excinfo.value)
    assert paused_queues() == []


def test_command_lists_queues_with_state_counts_and_limit(make_job):
    make_job(queue="video")
    make_job(queue="video", status="running", worker_id="w")
    make_job(queue="emails", status="completed")
    ConcurrencyLimit.objects.create(scope="queue", name="video", declared=2)
    pause_queue("video")

    out, _ = run("list")

    lines = out.splitlines()
    assert lines[0].split() == ["QUEUE", "STATE", "PENDING", "RUNNING", "LIMIT"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["video"].split()[1:3] == ["paused", "since"]
    assert rows["video"].split()[-3:] == ["1", "1", "2"]
    assert rows["default"].split()[1:] == ["active", "0", "0", "-"]
    assert "emails" not in rows  # only finished jobs, no state, no limit


# -- The admin overview -------------------------------------------------------------------


@pytest.fixture
def log_in(client: Client, django_user_model: Any) -> Callable[..., Any]:
    """Log ``client`` in as a new staff user with the given permission codenames."""

    def make(*codenames: str) -> Any:
        user = django_user_model.objects.create_user(
            username=f"user-{uuid.uuid4().hex[:8]}", password="password", is_staff=True
        )
        user.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="django_pgqueue", codename__in=codenames
            )
        )
        client.force_login(user)
        return user

    return make


def queue_action_url(queue: str, action: str) -> str:
    return reverse("admin:django_pgqueue_job_queue_action", args=[queue, action])


def test_overview_shows_paused_state_limit_and_buttons(client, log_in, make_job):
    log_in("view_job", "retry_job")
    make_job(queue="video")
    make_job(queue="emails")
    pause_queue("video")
    ConcurrencyLimit.objects.create(scope="queue", name="video", declared=2)

    response = client.get(reverse(OVERVIEW))

    rows = {row["queue"]: row for row in response.context["queues"]}
    assert rows["video"]["paused_at"] and rows["video"]["limit"] == 2
    assert rows["video"]["queue_action"]["label"] == "Resume"
    assert not rows["emails"]["paused_at"] and rows["emails"]["limit"] is None
    assert rows["emails"]["queue_action"]["label"] == "Pause"
    content = response.content.decode()
    assert "pgqueue-queue-paused" in content
    assert f'action="{queue_action_url("video", "resume")}"' in content
    assert f'action="{queue_action_url("emails", "pause")}"' in content


def test_overview_lists_a_paused_queue_without_jobs_so_it_can_be_resumed(client, log_in):
    log_in("view_job", "retry_job")
    pause_queue("empty")

    response = client.get(reverse(OVERVIEW))

    assert [row["queue"] for row in response.context["queues"]] == ["empty"]
    assert queue_action_url("empty", "resume") in response.content.decode()


def test_admin_pause_and_resume_buttons_change_the_queue_and_say_so(client, log_in, make_job):
    log_in("view_job", "retry_job")
    make_job(queue="video")

    response = client.post(queue_action_url("video", "pause"), follow=True)

    assert response.redirect_chain == [(reverse(OVERVIEW), 302)]
    assert paused_queues() == ["video"]
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    assert messages == ["Queue “video” paused: workers claim none of its jobs until it is resumed."]

    response = client.post(queue_action_url("video", "resume"), follow=True)

    assert paused_queues() == []
    assert "Queue “video” resumed: workers claim its jobs again." in response.content.decode()


def test_admin_users_without_the_retry_permission_see_no_buttons_and_cannot_post(
    client, log_in, make_job
):
    log_in("view_job")
    make_job(queue="video")

    response = client.get(reverse(OVERVIEW))
    assert response.context["queues"][0]["queue_action"] is None
    assert "pgqueue-queue-action" not in response.content.decode()

    assert client.post(queue_action_url("video", "pause")).status_code == 403
    assert paused_queues() == []


def test_admin_queue_actions_need_a_post_and_a_known_action(client, log_in):
    log_in("view_job", "retry_job")

    assert client.get(queue_action_url("video", "pause")).status_code == 405
    assert client.post(queue_action_url("video", "delete")).status_code == 404
    assert client.post(reverse(OVERVIEW) + "queues/-bad/pause/").status_code == 404
    assert paused_queues() == []
