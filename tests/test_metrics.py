"""Prometheus metrics: the view, the worker's counters and ``pgqueue_worker --metrics-port``."""

import importlib
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue import enqueue
from django_pgqueue.exceptions import MissingExtraError
from django_pgqueue.metrics import WorkerMetrics, start_metrics_server
from django_pgqueue.models import ConcurrencyLimit, Job, QueueState, WorkerRecord
from tests.workers import ROOT, WorkerProcess, wait_for, worker_thread


def samples(text):
    """``{(name, ((label, value), ...)): value}`` of an exposition text."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(parsed, name, **labels):
    return parsed.get((name, tuple(sorted(labels.items()))))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


@pytest.mark.django_db
def test_view_exposes_queue_metrics(client, make_job):
    now = timezone.now()
    make_job(queue="emails")
    make_job(queue="emails", run_at=now - timedelta(minutes=5))
    make_job(queue="emails", run_at=now + timedelta(hours=1))
    make_job(queue="emails", status="running", worker_id="w-1", started_at=now)
    make_job(queue="emails", status="completed", started_at=now, completed_at=now)
    make_job(queue="emails", status="failed", started_at=now, completed_at=now)
    QueueState.objects.create(name="reports", paused_at=now)
    ConcurrencyLimit.objects.create(scope="queue", name="reports", declared=3)
    WorkerRecord.objects.create(worker_id="w-1", hostname="h", pid=1, concurrency=2)

    response = client.get("/metrics/")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    parsed = samples(response.content.decode())
    assert value(parsed, "pgqueue_stats_up") == 1
    assert value(parsed, "pgqueue_jobs", queue="emails", status="pending") == 2
    assert value(parsed, "pgqueue_jobs", queue="emails", status="scheduled") == 1
    assert value(parsed, "pgqueue_jobs", queue="emails", status="running") == 1
    assert value(parsed, "pgqueue_jobs", queue="emails", status="claimed") == 0
    assert value(parsed, "pgqueue_jobs", queue="reports", status="pending") == 0
    assert (
        value(parsed, "pgqueue_jobs_finished_last_minute", queue="emails", status="completed") == 1
    )
    assert value(parsed, "pgqueue_jobs_finished_last_minute", queue="emails", status="failed") == 1
    assert value(parsed, "pgqueue_jobs_started_last_minute", queue="emails") == 3
    assert value(parsed, "pgqueue_job_wait_seconds", queue="emails", quantile="0.5") is not None
    assert value(parsed, "pgqueue_job_wait_seconds", queue="reports", quantile="0.5") is None
    assert 300 <= value(parsed, "pgqueue_oldest_pending_age_seconds", queue="emails") < 330
    assert value(parsed, "pgqueue_oldest_pending_age_seconds", queue="reports") == 0
    assert value(parsed, "pgqueue_queue_paused", queue="reports") == 1
    assert value(parsed, "pgqueue_queue_paused", queue="emails") == 0
    assert value(parsed, "pgqueue_queue_concurrency_limit", queue="reports") == 3
    assert value(parsed, "pgqueue_queue_concurrency_limit", queue="emails") is None
    assert value(parsed, "pgqueue_workers_alive") == 1
    assert value(parsed, "pgqueue_workers_not_responding") == 0


@pytest.mark.django_db
def test_view_reports_a_database_it_cannot_read_as_stats_down(client, make_job):
    make_job(queue="emails")
    with connection.cursor() as cursor:  # undone with the test's transaction
        cursor.execute("ALTER TABLE pgqueue_queues RENAME TO pgqueue_queues_gone")

    response = client.get("/metrics/")

    assert response.status_code == 200
    parsed = samples(response.content.decode())
    assert value(parsed, "pgqueue_stats_up") == 0
    assert value(parsed, "pgqueue_jobs", queue="emails", status="pending") is None


@pytest.mark.django_db
def test_view_speaks_openmetrics_when_asked(client):
    response = client.get("/metrics/", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


@pytest.mark.django_db
def test_view_answers_only_reads(client):
    assert client.post("/metrics/").status_code == 405


@pytest.mark.django_db(transaction=True)
def test_worker_signals_feed_the_worker_counters():
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    metrics.connect()
    try:
        done = [enqueue("tests.noop", queue="emails") for _ in range(2)]
        failing = enqueue("tests.fail")  # three attempts: two retries, then failed
        with worker_thread(concurrency=2):
            wait_for(
                lambda: (
                    Job.objects.filter(
                        pk__in=[job.pk for job in [*done, failing]],
                        status__in=["completed", "failed"],
                    ).count()
                    == 3
                )
            )
    finally:
        metrics.disconnect()

    def get(name, **labels):
        return registry.get_sample_value(name, labels)

    jobs = "pgqueue_worker_jobs_total"
    assert get(jobs, queue="emails", job_type="tests.noop", outcome="completed") == 2
    assert get(jobs, queue="default", job_type="tests.fail", outcome="retried") == 2
    assert get(jobs, queue="default", job_type="tests.fail", outcome="failed") == 1
    assert get("pgqueue_worker_job_duration_seconds_count", queue="emails") == 2
    assert get("pgqueue_worker_job_duration_seconds_count", queue="default") == 3
    assert get("pgqueue_worker_job_wait_seconds_count", queue="default") == 3
    assert get("pgqueue_worker_job_wait_seconds_sum", queue="default") >= 0


@pytest.mark.django_db(transaction=True)
def test_disconnected_worker_metrics_stop_counting():
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    metrics.connect()
    metrics.disconnect()
    enqueue("tests.noop")
    with worker_thread() as worker:
        wait_for(lambda: worker.stats["completed"] == 1)
    assert not any(
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "pgqueue_worker_jobs_total"
    )


@pytest.mark.django_db(transaction=True)
def test_metrics_server_serves_queue_and_worker_metrics_then_releases_its_port():
    enqueue("tests.noop", queue="emails", delay=3600)
    server = start_metrics_server(0, "127.0.0.1")
    try:
        parsed = samples(scrape(server.port))
        assert value(parsed, "pgqueue_stats_up") == 1
        assert value(parsed, "pgqueue_jobs", queue="emails", status="scheduled") == 1
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        scrape(server.port)


def test_metrics_server_rejects_a_port_out_of_range():
    with pytest.raises(ValueError, match="from 0 to 65535"):
        start_metrics_server(70000)


@pytest.mark.django_db(transaction=True)
def test_worker_process_serves_metrics_on_metrics_port_and_stops_serving_on_exit():
    port = free_port()
    worker = WorkerProcess(
        "--metrics-port", str(port), "--metrics-addr", "127.0.0.1", "--poll-interval", "0.2"
    )
    try:
        wait_for(lambda: _scrape_or_none(port))
        job = enqueue("tests.noop", queue="emails")
        wait_for(lambda: Job.objects.filter(pk=job.pk, status="completed").exists())

        def counted():
            parsed = samples(scrape(port))
            return (
                value(
                    parsed,
                    "pgqueue_worker_jobs_total",
                    queue="emails",
                    job_type="tests.noop",
                    outcome="completed",
                )
                == 1
                and parsed
            )

        parsed = wait_for(counted)
        assert value(parsed, "pgqueue_stats_up") == 1
        assert value(parsed, "pgqueue_workers_alive") == 1
        assert value(parsed, "pgqueue_worker_job_duration_seconds_count", queue="emails") == 1

        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
        assert _scrape_or_none(port) is None
    finally:
        worker.stop()


def _scrape_or_none(port):
    try:
        return scrape(port)
    except OSError:
        return None


@pytest.mark.parametrize("port", ["0", "70000", "-1"])
def test_worker_rejects_a_metrics_port_out_of_range(port):
    with pytest.raises(CommandError, match="--metrics-port must be from 1 to 65535"):
        call_command("pgqueue_worker", "--metrics-port", port)


def test_worker_reports_a_metrics_port_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=rf"cannot listen on 127.0.0.1:{port}"):
            call_command(
                "pgqueue_worker", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1"
            )


def test_metrics_module_without_prometheus_client_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "django_pgqueue.metrics")
    with pytest.raises(MissingExtraError, match=r"pip install 'django-pgqueue\[metrics\]'"):
        importlib.import_module("django_pgqueue.metrics")


def test_the_app_and_its_commands_work_without_the_optional_extras():
    script = """
import sys
sys.modules["prometheus_client"] = None
sys.modules["rich"] = None
import django
django.setup()
import django_pgqueue, django_pgqueue.admin, django_pgqueue.stats
from django.core.management import CommandError, call_command
from django.db import connection
for args in (["pgqueue_worker", "--metrics-port", "9100"], ["pgqueue_status"]):
    try:
        call_command(*args)
    except CommandError as exc:
        print(exc)
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "pip install 'django-pgqueue[metrics]'" in lines[0]
    assert "pip install 'django-pgqueue[status]'" in lines[1]
    assert "--json" in lines[1]
