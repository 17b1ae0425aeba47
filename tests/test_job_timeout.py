"""A job's own timeout, ``enqueue(timeout=...)``: stored on the job, and applied by every
kind of slot over the job type's timeout."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from django_pgqueue import enqueue, enqueue_many, job
from django_pgqueue.exceptions import InvalidJobError
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.worker import Worker, process_slots
from tests.testapp import process_jobs

pytestmark = pytest.mark.django_db(transaction=True)


def busy_without_a_timeout(job_):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pass


async def awaits_an_hour(job_):
    await asyncio.sleep(3600)


@pytest.fixture(autouse=True)
def handlers(clean_registry, monkeypatch):
    monkeypatch.setenv("PGQUEUE_TEST_PROCESS_JOBS", "1")  # the children register them
    monkeypatch.setattr(process_slots, "KILL_GRACE", 0.5)
    process_jobs.register()
    job("tests.timeout.busy", max_attempts=1)(busy_without_a_timeout)
    job("tests.timeout.awaits", max_attempts=1)(awaits_an_hour)


def failure_of(job_):
    job_.refresh_from_db()
    assert job_.status == JobStatus.FAILED, job_.status
    return job_.last_error


def test_a_jobs_timeout_is_stored_and_defaults_to_none():
    timed = enqueue("tests.record", timeout=timedelta(seconds=90))
    untimed = enqueue("tests.record")

    assert timed.timeout == 90.0
    assert Job.objects.get(pk=timed.pk).timeout == 90.0
    assert Job.objects.get(pk=untimed.pk).timeout is None


def test_enqueue_many_and_unique_enqueues_store_each_jobs_timeout():
    plain, keyed = enqueue_many(
        [
            {"job_type": "tests.record", "timeout": 5},
            {"job_type": "tests.record", "timeout": 7.5, "unique_key": "k"},
        ]
    )
    single_keyed = enqueue("tests.record", timeout=3, unique_key="other", unique_for=60)

    stored = dict(Job.objects.values_list("id", "timeout"))
    assert (stored[plain.id], stored[keyed.id], stored[single_keyed.id]) == (5.0, 7.5, 3.0)


def test_a_jobs_timeout_limits_a_handler_whose_type_has_none():
    running = enqueue("tests.timeout.busy", timeout=0.3)

    Worker(burst=True, concurrency=1).run()

    assert failure_of(running) == "JobTimeout: ran past its timeout of 0.3s"


def test_a_jobs_timeout_overrides_its_types():
    running = enqueue("tests.busy", timeout=0.2)  # the type's: 0.5 s

    Worker(burst=True, concurrency=1).run()

    assert failure_of(running) == "JobTimeout: ran past its timeout of 0.2s"


def test_a_jobs_timeout_applies_on_the_event_loop():
    awaiting = enqueue("tests.timeout.awaits", timeout=0.3)

    Worker(burst=True, concurrency=1).run()

    assert failure_of(awaiting) == "JobTimeout: ran past its timeout of 0.3s"


def test_a_jobs_timeout_kills_its_child_process():
    sleeping = enqueue("tests.process.sleeps", timeout=0.5, max_attempts=1)

    Worker(burst=True, concurrency=1, process_concurrency=1).run()

    assert failure_of(sleeping) == (
        "JobTimeout: ran past its timeout of 0.5s; its process was killed"
    )


@pytest.mark.parametrize("value", [0, -1, float("inf"), "10", True])
def test_an_invalid_timeout_is_refused_and_nothing_is_written(value):
    with pytest.raises(InvalidJobError) as excinfo:
        enqueue("tests.record", timeout=value)

    assert excinfo.value.field == "timeout"
    assert not Job.objects.exists()


def test_an_invalid_timeout_in_a_spec_names_the_spec():
    with pytest.raises(InvalidJobError) as excinfo:
        enqueue_many([{"job_type": "tests.record"}, {"job_type": "tests.record", "timeout": 0}])

    assert excinfo.value.field == "specs[1].timeout"
    assert not Job.objects.exists()
