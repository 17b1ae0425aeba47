"""The admin overview, ``pgqueue_status --json`` and the Prometheus metrics report the
same figures for the same database: all three format ``django_pgqueue.stats.snapshot``.

Each view is read back into the same shape (figures per queue, workers by state); a
queue one view leaves out counts as all zeros there.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue import enqueue
from django_pgqueue.metrics import QueueCollector
from django_pgqueue.models import ConcurrencyLimit, JobStatus, WorkerRecord
from django_pgqueue.queues import pause_queue
from django_pgqueue.rollups import recount

pytestmark = pytest.mark.django_db

FIGURES = (
    "waiting",
    "due",
    "delayed",
    "claimed",
    "running",
    "completed_last_minute",
    "failed_last_minute",
    "cancelled_last_minute",
    "paused",
    "limit",
)
ZEROS = dict.fromkeys(FIGURES, 0) | {"paused": False, "limit": None}


@pytest.fixture
def busy_database(make_job: Any) -> None:
    """Jobs in every state, due and delayed, waiting, in three queues; one paused and limited
    queue; a live worker and a silent one holding jobs."""
    now = timezone.now()
    recently, long_ago = now - timedelta(seconds=10), now - timedelta(hours=2)
    for _ in range(2):
        make_job(queue="emails", run_at=now - timedelta(minutes=5))
    make_job(queue="emails", run_at=now + timedelta(hours=1))
    make_job(queue="emails", status=JobStatus.CLAIMED, worker_id="w-alive")
    make_job(queue="emails", status=JobStatus.RUNNING, worker_id="w-alive", started_at=now)
    for _ in range(2):
        make_job(queue="emails", status=JobStatus.COMPLETED, completed_at=recently)
    make_job(queue="emails", status=JobStatus.COMPLETED, completed_at=long_ago)
    make_job(queue="emails", status=JobStatus.FAILED, completed_at=recently)
    make_job(queue="emails", status=JobStatus.CANCELLED, completed_at=recently)
    make_job(queue="reports")
    running = make_job(
        queue="reports", status=JobStatus.RUNNING, worker_id="w-silent", started_at=now
    )
    make_job(queue="reports", status=JobStatus.FAILED, completed_at=long_ago)
    pause_queue("reports")
    ConcurrencyLimit.objects.create(scope="queue", name="reports", declared=3)
    make_job(queue="video", run_at=now + timedelta(days=1))
    enqueue("tests.noop", queue="video", depends_on=[running])
    WorkerRecord.objects.create(
        worker_id="w-alive", hostname="h", pid=1, concurrency=4, queues=["emails"]
    )
    WorkerRecord.objects.create(
        worker_id="w-silent",
        hostname="h",
        pid=2,
        concurrency=2,
        heartbeat_at=now - timedelta(minutes=30),
    )


def overview_figures(admin_client: Any) -> tuple[dict[str, dict[str, Any]], Counter[str]]:
    context = admin_client.get(reverse("admin:django_pgqueue_job_overview")).context
    queues = {
        row["queue"]: {
            "waiting": row["waiting"],
            "due": row["pending"] - row["delayed"],
            "delayed": row["delayed"],
            "claimed": row["claimed"],
            "running": row["running"],
            "completed_last_minute": row["completed_last_minute"],
            "failed_last_minute": row["failed_last_minute"],
            "cancelled_last_minute": row["cancelled_last_minute"],
            "paused": bool(row["paused_at"]),
            "limit": row["limit"],
        }
        for row in context["queues"]
    }
    workers = Counter(str(row["state"]) for row in context["workers"])
    return queues, workers


def status_figures() -> tuple[dict[str, dict[str, Any]], Counter[str]]:
    out = StringIO()
    call_command("pgqueue_status", "--json", stdout=out)
    data = json.loads(out.getvalue())
    queues = {
        queue["name"]: {
            "waiting": queue["waiting"],
            "due": queue["pending"],
            "delayed": queue["scheduled"],
            "claimed": queue["claimed"],
            "running": queue["running"],
            "completed_last_minute": queue["completed_last_minute"],
            "failed_last_minute": queue["failed_last_minute"],
            "cancelled_last_minute": queue["cancelled_last_minute"],
            "paused": queue["paused"],
            "limit": queue["max_running"],
        }
        for queue in data["queues"]
    }
    return queues, Counter(worker["state"] for worker in data["workers"])


def metrics_figures() -> tuple[dict[str, dict[str, Any]], Counter[str]]:
    registry = CollectorRegistry()
    registry.register(QueueCollector())
    names = {
        "waiting": "waiting",
        "pending": "due",
        "scheduled": "delayed",
        "claimed": "claimed",
        "running": "running",
    }
    queues: dict[str, dict[str, Any]] = {}
    workers: Counter[str] = Counter()
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels, value = sample.labels, sample.value
            row = queues.setdefault(labels["queue"], dict(ZEROS)) if "queue" in labels else {}
            if sample.name == "pgqueue_jobs":
                row[names[labels["status"]]] = int(value)
            elif sample.name == "pgqueue_jobs_finished_last_minute":
                row[f"{labels['status']}_last_minute"] = int(value)
            elif sample.name == "pgqueue_queue_paused":
                row["paused"] = value == 1
            elif sample.name == "pgqueue_queue_concurrency_limit":
                row["limit"] = int(value)
            elif sample.name == "pgqueue_workers_alive":
                workers["alive"] = int(value)
            elif sample.name == "pgqueue_workers_not_responding":
                workers["not responding"] = int(value)
    return queues, +workers


def same_shape(queues: dict[str, dict[str, Any]], names: set[str]) -> dict[str, dict[str, Any]]:
    return {name: queues.get(name, ZEROS) for name in sorted(names)}


@pytest.mark.usefixtures("busy_database")
def test_overview_status_and_metrics_report_the_same_figures(admin_client):
    overview, overview_workers = overview_figures(admin_client)
    status, status_workers = status_figures()
    metrics, metrics_workers = metrics_figures()

    names = {*overview, *status, *metrics}
    assert names == {"emails", "reports", "video"}
    assert same_shape(overview, names) == same_shape(status, names)
    assert same_shape(metrics, names) == same_shape(status, names)
    assert status["emails"] == {
        **ZEROS,
        "due": 2,
        "delayed": 1,
        "claimed": 1,
        "running": 1,
        "completed_last_minute": 2,
        "failed_last_minute": 1,
        "cancelled_last_minute": 1,
    }
    assert status["reports"] == {**ZEROS, "due": 1, "running": 1, "paused": True, "limit": 3}
    assert status["video"] == {**ZEROS, "waiting": 1, "delayed": 1}
    assert overview_workers == status_workers == metrics_workers
    assert status_workers == {"alive": 1, "not responding": 1}


@pytest.mark.usefixtures("busy_database")
def test_overview_totals_are_the_status_commands_totals(admin_client):
    recount(timezone.now() - timedelta(days=1))  # the rollups that workers write
    context = admin_client.get(reverse("admin:django_pgqueue_job_overview")).context
    out = StringIO()
    call_command("pgqueue_status", "--json", "--failed-total", stdout=out)
    status = {queue["name"]: queue for queue in json.loads(out.getvalue())["queues"]}

    for row in context["queues"]:
        queue = status[row["queue"]]
        assert row["pending"] == queue["pending"] + queue["scheduled"]
        assert row["failed"] == queue["failed"]
        for window in ("last_hour", "last_day"):
            for finished in ("completed", "failed"):
                key = f"{finished}_{window}"
                assert row[key] == queue[key], (row["queue"], key)
    assert (status["emails"]["failed"], status["reports"]["failed"]) == (1, 1)
    # The job finished two hours ago is in the day; the others were rolled up if their
    # minute has ended.
    assert status["emails"]["completed_last_day"] >= 1
    assert status["reports"]["failed_last_day"] == 1 and status["reports"]["failed_last_hour"] == 0


@pytest.mark.usefixtures("busy_database")
def test_overview_and_status_see_the_same_held_jobs_per_worker(admin_client):
    context = admin_client.get(reverse("admin:django_pgqueue_job_overview")).context
    out = StringIO()
    call_command("pgqueue_status", "--json", stdout=out)
    status = json.loads(out.getvalue())["workers"]

    overview = {
        row["record"].worker_id: (str(row["state"]), row["held"]) for row in context["workers"]
    }
    assert overview == {
        worker["worker_id"]: (worker["state"], worker["running"]) for worker in status
    }
    assert overview == {"w-alive": ("alive", 2), "w-silent": ("not responding", 1)}


@pytest.mark.usefixtures("busy_database")
def test_the_queue_list_command_shows_the_status_commands_counts():
    out = StringIO()
    call_command("pgqueue_queue", "list", stdout=out)
    listed = {
        line.split()[0]: line.split() for line in out.getvalue().splitlines()[1:] if line.strip()
    }
    status, _ = status_figures()

    for name, figures in status.items():
        row = listed[name]
        assert int(row[-3]) == figures["due"] + figures["delayed"], name
        assert int(row[-2]) == figures["claimed"] + figures["running"], name
        assert row[-1] == ("-" if figures["limit"] is None else str(figures["limit"])), name
        assert (row[1] == "paused") is figures["paused"], name
