"""A page per worker: what it serves (queues and job types), its heartbeat, and the jobs
it holds now; linked from the queue overview."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from django_pgqueue.models import WorkerRecord

pytestmark = pytest.mark.django_db

OVERVIEW = "admin:django_pgqueue_job_overview"
WORKER_ID = "web-1:4242:a1b2c3"


def worker_url(worker_id: str) -> str:
    return reverse("admin:django_pgqueue_job_worker", args=[worker_id])


@pytest.fixture
def mail_worker():
    """A live worker serving the queue "mail", and only two job types."""
    return WorkerRecord.objects.create(
        worker_id=WORKER_ID,
        hostname="web-1",
        pid=4242,
        queues=["mail"],
        job_types=["shop.send_receipt", "shop.send_welcome"],
        concurrency=4,
    )


def test_the_overview_links_each_worker_and_names_its_job_types(admin_client, mail_worker):
    page = admin_client.get(reverse(OVERVIEW)).content.decode()

    assert f'<a href="{worker_url(WORKER_ID)}"><code>{WORKER_ID}</code></a>' in page
    assert "mail; job types: shop.send_receipt, shop.send_welcome" in page


def test_a_workers_page_shows_what_it_serves_and_the_jobs_it_holds(
    admin_client, mail_worker, make_job
):
    running = make_job(
        job_type="shop.send_receipt",
        queue="mail",
        status="running",
        worker_id=WORKER_ID,
        attempts=1,
        claimed_at=timezone.now() - timedelta(seconds=2),
        started_at=timezone.now(),
        progress=40,
        cancel_requested_at=timezone.now(),
    )
    claimed = make_job(
        job_type="shop.send_welcome",
        status="claimed",
        worker_id=WORKER_ID,
        claimed_at=timezone.now() - timedelta(seconds=1),
    )
    make_job(status="completed", worker_id=WORKER_ID)  # ran here once, not held
    make_job(status="running", worker_id="another-worker")

    page = admin_client.get(worker_url(WORKER_ID))

    assert page.status_code == 200
    worker = page.context["worker"]
    assert (worker["state"], worker["queues"], worker["job_types"], worker["held"]) == (
        "alive",
        "mail",
        "shop.send_receipt, shop.send_welcome",
        2,
    )
    jobs = page.context["jobs"]
    assert [job["id"] for job in jobs] == [running.pk, claimed.pk]
    assert jobs[0]["cancel_requested"] and jobs[0]["progress"] == 40
    html = page.content.decode()
    assert "(cancel requested)" in html
    assert reverse("admin:django_pgqueue_job_change", args=[running.pk]) in html


def test_a_silent_worker_is_shown_as_not_responding(admin_client, mail_worker):
    WorkerRecord.objects.filter(pk=WORKER_ID).update(
        heartbeat_at=timezone.now() - timedelta(hours=1)
    )

    page = admin_client.get(worker_url(WORKER_ID))

    assert page.context["worker"]["state"] == "not responding"
    assert "None." in page.content.decode()  # it holds no job


def test_the_worker_that_leads_is_named_on_its_page_and_the_overview(admin_client, mail_worker):
    WorkerRecord.objects.create(
        worker_id="zz-other:1:a", hostname="web-2", pid=1, concurrency=1
    )  # live, a higher id: it follows

    leader = admin_client.get(worker_url(WORKER_ID))
    follower = admin_client.get(worker_url("zz-other:1:a"))
    overview = admin_client.get(reverse(OVERVIEW))

    assert leader.context["worker"]["leads"] and not follower.context["worker"]["leads"]
    assert "alive, leads (recovers, prunes" in leader.content.decode()
    assert (
        "leads"
        not in follower.content.decode().split('id="pgqueue-worker"')[1].split("</table>")[0]
    )
    rows = {row["record"].worker_id: row["leads"] for row in overview.context["workers"]}
    assert rows == {WORKER_ID: True, "zz-other:1:a": False}
    assert "alive, leads</td>" in overview.content.decode()


def test_an_unknown_worker_is_a_page_that_says_so(admin_client):
    page = admin_client.get(worker_url("gone:1:zzz"))

    assert page.status_code == 404
    assert "No worker “gone:1:zzz” has reported in the last day." in page.content.decode()


@pytest.mark.parametrize("who", ["anonymous", "staff without view_job"])
def test_others_cannot_see_a_worker(client, staff, mail_worker, who):
    if who == "staff without view_job":
        client = staff()

    page = client.get(worker_url(WORKER_ID))

    if who == "anonymous":
        assert page.status_code == 302 and "/login/" in page["Location"]
    else:
        assert page.status_code == 403
