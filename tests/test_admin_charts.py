"""The admin's charts page: what the rollups hold, drawn as SVG over an hour, a day or
a week, for all queues or one queue or job type; staff with view_job only."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse

from django_pgqueue.admin.charts import seconds_label
from django_pgqueue.rollups import percentile

pytestmark = pytest.mark.django_db

CHARTS = "admin:django_pgqueue_job_charts"


@pytest.fixture
def rolled():
    """Three minutes of rollups: 3 jobs completed and 1 failed in the first, 4 in the
    last; the depth sampled as each minute ended."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT date_trunc('minute', statement_timestamp())")
        minute = cursor.fetchone()[0]
        for ago, depth, jobs in (
            (3, 5, [("default", "tests.noop", 3, 1)]),
            (2, 0, []),
            (1, 7, [("reports", "tests.record", 4, 0)]),
        ):
            at = minute - timedelta(minutes=ago)
            depths = {"default": {"pending": depth, "scheduled": 0, "running": 1, "waiting": 0}}
            cursor.execute(
                "INSERT INTO pgqueue_minutes (minute, depths) VALUES (%s, %s)",
                [at + timedelta(minutes=1), json.dumps(depths)],
            )
            for queue, job_type, completed, failed in jobs:
                cursor.execute(
                    "INSERT INTO pgqueue_minute_jobs (minute, queue, job_type, completed,"
                    " failed, cancelled, wait_ms, run_ms)"
                    " VALUES (%s, %s, %s, %s, %s, 0, %s, %s)",
                    [at, queue, job_type, completed, failed, [0] * 20 + [4], [4]],
                )


def test_the_page_draws_the_four_charts_from_the_rollups(admin_client, rolled):
    page = admin_client.get(reverse(CHARTS))

    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('<svg class="pgqueue-chart"') == 4
    for title in (
        "Jobs finished, per minute",
        "Waiting time, due to start",
        "Run time",
        "Queue depth (the most sampled in each point)",
    ):
        assert f"<figcaption>{title}</figcaption>" in html
    assert ": 4</title>" in html  # a point's tooltip: 4 jobs completed
    assert "p99" in html
    about_a_second = seconds_label(percentile([0] * 20 + [4], 0.5))
    assert about_a_second == "861 ms"
    assert "p50 " in html and f": {about_a_second}</title>" in html
    assert '<meta http-equiv="refresh" content="60">' in html


def test_a_queue_or_job_type_narrows_the_charts(admin_client, rolled):
    by_queue = admin_client.get(reverse(CHARTS), {"queue": "reports"})
    by_type = admin_client.get(reverse(CHARTS), {"job_type": "tests.noop", "span": "week"})

    assert by_queue.status_code == by_type.status_code == 200
    assert len(by_queue.context["charts"]) == 4
    assert len(by_type.context["charts"]) == 3  # depths are per queue
    assert "Queue depth is kept per queue" in by_type.content.decode()
    assert "Jobs finished, per 2 hours" in by_type.content.decode()
    links = dict((name, url) for name, _label, url in by_type.context["spans"])
    assert links["day"].endswith("?span=day&job_type=tests.noop")


def test_an_empty_span_says_so(admin_client):
    page = admin_client.get(reverse(CHARTS), {"span": "day"})

    assert page.content.decode().count("No rollups in this span yet.") == 4


@pytest.mark.parametrize(
    "query",
    [{"span": "year"}, {"queue": "no spaces"}, {"job_type": "\x00"}, {"queue": "x" * 101}],
)
def test_a_bad_span_queue_or_job_type_is_a_404_page(admin_client, query):
    page = admin_client.get(reverse(CHARTS), query)

    assert page.status_code == 404
    assert "Not found" in page.content.decode()


def test_only_staff_who_may_view_jobs_see_the_charts(client, staff, django_user_model):
    assert client.get(reverse(CHARTS)).status_code == 302  # anonymous: to the login page
    user = django_user_model.objects.create_user(username="visitor", password="pw")
    client.force_login(user)
    assert client.get(reverse(CHARTS)).status_code == 302  # not staff
    client.logout()
    assert staff().get(reverse(CHARTS)).status_code == 403


def test_view_only_staff_see_the_charts(staff):
    assert staff("view_job").get(reverse(CHARTS)).status_code == 200


def test_the_overview_and_the_job_list_link_to_the_charts(admin_client):
    overview = admin_client.get(reverse("admin:django_pgqueue_job_overview"))
    changelist = admin_client.get(reverse("admin:django_pgqueue_job_changelist"))

    assert f'href="{reverse(CHARTS)}"' in overview.content.decode()
    assert '<meta http-equiv="refresh" content="30">' in overview.content.decode()
    assert f'href="{reverse(CHARTS)}"' in changelist.content.decode()
