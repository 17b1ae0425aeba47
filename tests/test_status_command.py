"""``manage.py pgqueue_status``: tables of queues and workers, JSON, and --watch."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from django_pgqueue import enqueue
from django_pgqueue.models import ConcurrencyLimit, Job, QueueState, WorkerRecord
from tests.workers import wait_for, worker_thread


def status(*args):
    out = StringIO()
    call_command("pgqueue_status", *args, stdout=out)
    return out.getvalue()


def line_of(text, first_cell):
    return next(line for line in text.splitlines() if f" {first_cell} " in line)


@pytest.fixture
def queues(make_job):
    now = timezone.now()
    for _ in range(3):
        make_job(queue="emails")
    make_job(queue="emails", run_at=now + timedelta(hours=1))
    make_job(queue="emails", status="running", worker_id="w-1", started_at=now)
    make_job(queue="emails", status="failed", completed_at=now - timedelta(days=2))
    QueueState.objects.create(name="reports", paused_at=now)
    ConcurrencyLimit.objects.create(scope="queue", name="reports", declared=2)
    WorkerRecord.objects.create(
        worker_id="web-1:4242:abcdef", hostname="web-1", pid=4242, concurrency=8
    )


@pytest.mark.django_db
@pytest.mark.usefixtures("queues")
def test_table_shows_each_queue_and_worker():
    text = status()

    assert "active" in line_of(text, "emails")
    reports = line_of(text, "reports")
    assert "paused" in reports
    assert " 2 " in reports  # its limit
    worker = line_of(text, "web-1:4242:abcdef")
    assert "alive" in worker
    assert "4242" in worker
    assert "all" in worker  # it serves every queue


@pytest.mark.django_db
@pytest.mark.usefixtures("queues")
def test_table_counts_in_their_columns():
    text = status()
    header = [cell.strip() for cell in line_of(text, "queue").split("┃")[1:-1]]
    row = [cell.strip() for cell in line_of(text, "emails").split("│")[1:-1]]
    cells = dict(zip(header, row, strict=True))
    assert cells["state"] == "active"
    assert cells["limit"] == "-"
    assert (cells["pending"], cells["scheduled"], cells["claimed"], cells["running"]) == (
        "3",
        "1",
        "0",
        "1",
    )
    assert cells["done/min"] == "0"
    assert "failed" not in header  # the all-time count needs --failed-total


@pytest.mark.django_db
@pytest.mark.usefixtures("queues")
def test_failed_total_adds_a_column_of_every_failed_job():
    text = status("--failed-total")
    header = [cell.strip() for cell in line_of(text, "queue").split("┃")[1:-1]]
    row = [cell.strip() for cell in line_of(text, "emails").split("│")[1:-1]]
    assert dict(zip(header, row, strict=True))["failed"] == "1"


@pytest.mark.django_db
@pytest.mark.usefixtures("queues")
def test_json_lists_queues_and_workers():
    data = json.loads(status("--json"))

    queues = {queue["name"]: queue for queue in data["queues"]}
    assert queues["emails"]["pending"] == 3
    assert queues["emails"]["scheduled"] == 1
    assert queues["emails"]["running"] == 1
    assert queues["emails"]["failed"] is None
    assert queues["reports"]["paused"] is True
    assert queues["reports"]["max_running"] == 2
    (worker,) = data["workers"]
    assert worker["worker_id"] == "web-1:4242:abcdef"
    assert worker["state"] == "alive"
    assert worker["concurrency"] == 8


@pytest.mark.django_db
def test_empty_database_says_so():
    text = status()
    assert "no queue has jobs" in text
    assert "no worker has run" in text


@pytest.mark.django_db(transaction=True)
def test_a_running_worker_is_listed_with_the_job_it_runs():
    job = enqueue("tests.cancellable", {"max_seconds": 30}, queue="slow")
    with worker_thread(worker_id="status-worker", queues=["slow", "fast"], concurrency=2):
        wait_for(lambda: json.loads(status("--json"))["workers"])
        wait_for(lambda: Job.objects.filter(pk=job.pk, status="running").exists())
        data = json.loads(status("--json"))
        text = status()
        job.cancel()  # it stops at once
        wait_for(lambda: Job.objects.filter(pk=job.pk, status="cancelled").exists())

    (worker,) = data["workers"]
    assert worker["worker_id"] == "status-worker"
    assert worker["alive"] is True
    assert worker["running"] == 1
    assert worker["queues"] == ["slow", "fast"]
    queues = {queue["name"]: queue for queue in data["queues"]}
    assert queues["slow"]["running"] == 1
    assert queues["fast"]["pending"] == 0  # served by a live worker: listed
    line = line_of(text, "status-worker")
    assert "slow, fast" in line
    assert "alive" in line


@pytest.mark.django_db
@pytest.mark.usefixtures("queues")
def test_watch_refreshes_the_given_number_of_times():
    text = status("--watch", "0.01", "--count", "3")
    assert "emails" in text
    assert "web-1:4242:abcdef" in text


@pytest.mark.django_db
@pytest.mark.usefixtures("queues")
def test_json_watch_prints_one_document_per_line():
    lines = status("--json", "--watch", "0.01", "--count", "3").splitlines()
    assert len(lines) == 3
    for line in lines:
        assert {queue["name"] for queue in json.loads(line)["queues"]} == {"emails", "reports"}


@pytest.mark.django_db
def test_a_database_it_cannot_read_is_reported_without_a_traceback():
    with connection.cursor() as cursor:  # undone with the test's transaction
        cursor.execute("ALTER TABLE pgqueue_limits RENAME TO pgqueue_limits_gone")
    with pytest.raises(CommandError, match="cannot read the queues from the database"):
        status("--json")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--count", "2"], "--count needs --watch"),
        (["--watch", "0"], "invalid positive number of seconds value"),
        (["--watch", "soon"], "invalid positive number of seconds value"),
        (["--watch", "1", "--count", "0"], "invalid positive integer value"),
    ],
)
def test_bad_options_are_reported(args, message):
    with pytest.raises(CommandError, match=message):
        status(*args)
