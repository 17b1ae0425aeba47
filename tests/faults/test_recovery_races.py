"""Recovery run by many at once: healthy long jobs are never taken back, and each stale
job is recovered exactly once with its attempts accounted right."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from django_pgqueue import enqueue_many
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.recovery import recover_stale_jobs
from tests.testapp.models import Execution

from .fleet import Fleet

pytestmark = pytest.mark.django_db(transaction=True)

# tests/settings.py: HEARTBEAT_INTERVAL 0.5s, STALE_AFTER 3s, RECOVER_INTERVAL 1s.
LONG_JOBS = 6
LONG_SLEEP = 4.5  # longer than STALE_AFTER
RECOVERERS = 4
STALE_JOBS_PER_KIND = 100
RACERS = 8
ROUNDS = 3


def _recover_loop(stop: threading.Event, outputs: list[str], deadline: float) -> None:
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            out = StringIO()
            call_command("pgqueue_recover", stdout=out)
            outputs.append(out.getvalue())
            time.sleep(0.05)
    finally:
        connections.close_all()


def test_long_healthy_jobs_survive_concurrent_recover_runs(figures):
    jobs = enqueue_many([{"job_type": "tests.durable", "data": {"sleep": LONG_SLEEP}}] * LONG_JOBS)
    fleet = Fleet(3, args=("--concurrency", "2", "--poll-interval", "0.2")).start()
    stop = threading.Event()
    outputs: list[str] = []
    deadline = time.monotonic() + 30
    threads = [
        threading.Thread(target=_recover_loop, args=(stop, outputs, deadline))
        for _ in range(RECOVERERS)
    ]
    try:
        for thread in threads:
            thread.start()
        ids = [job.id for job in jobs]
        while time.monotonic() < deadline:
            if Job.objects.filter(pk__in=ids, status=JobStatus.COMPLETED).count() == LONG_JOBS:
                break
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        fleet.stop()

    recovered_runs = [o for o in outputs if "recovered 0 stale" not in o]
    figures(
        jobs=LONG_JOBS,
        job_seconds=LONG_SLEEP,
        stale_after=3,
        recover_runs=len(outputs),
        recovered=len(recovered_runs),
    )
    assert Job.objects.filter(pk__in=ids, status=JobStatus.COMPLETED).count() == LONG_JOBS
    assert len(outputs) >= RECOVERERS * 10
    assert recovered_runs == []
    assert set(Job.objects.filter(pk__in=ids).values_list("attempts", flat=True)) == {1}
    assert Execution.objects.count() == LONG_JOBS


def _stale(kind: str) -> dict:
    long_ago = timezone.now() - timedelta(minutes=10)
    common = {"worker_id": "gone", "claimed_at": long_ago, "heartbeat_at": long_ago}
    return {
        "claimed": {**common, "status": "claimed", "attempts": 1, "worker_ids": ["gone"]},
        "running": {**common, "status": "running", "attempts": 1, "worker_ids": ["gone"]},
        "exhausted": {**common, "status": "running", "attempts": 3, "max_attempts": 3},
    }[kind]


def _race(barrier: threading.Barrier, results: list[list], n: int) -> None:
    try:
        barrier.wait(timeout=10)
        results[n] = recover_stale_jobs(30)
    finally:
        connections.close_all()


def test_concurrent_recoveries_recover_each_stale_job_exactly_once(make_job, figures):
    expected = {"claimed": ("pending", 0), "running": ("pending", 1), "exhausted": ("failed", 3)}
    total_recovered = 0
    for _ in range(ROUNDS):
        Job.objects.all().delete()
        kinds = {
            make_job(**_stale(kind)).id: kind
            for kind in expected
            for _ in range(STALE_JOBS_PER_KIND)
        }
        barrier = threading.Barrier(RACERS)
        results: list[list] = [[] for _ in range(RACERS)]

        threads = [
            threading.Thread(target=_race, args=(barrier, results, n)) for n in range(RACERS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)

        recovered = [job.id for result in results for job in result]
        assert sorted(recovered) == sorted(kinds), "a stale job was missed or recovered twice"
        total_recovered += len(recovered)
        for job in Job.objects.filter(pk__in=list(kinds)):
            status, attempts = expected[kinds[job.id]]
            assert (job.status, job.attempts, job.worker_id) == (status, attempts, None)
            assert (job.completed_at is not None) == (status == "failed")
    figures(racers=RACERS, rounds=ROUNDS, stale_jobs=total_recovered, recovered_twice=0, missed=0)
