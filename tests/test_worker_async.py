"""Async handlers: run on the worker's event loop, beside sync handlers on threads, with
the same outcomes, cancellation, timeouts and shutdown."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from django_pgqueue import enqueue, enqueue_many, job, signals
from django_pgqueue.exceptions import InvalidWorkerOptionError
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.worker import Worker
from tests.testapp.models import Execution
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db(transaction=True)

#: What the handlers saw, for the tests to read (handlers run in the worker's threads).
events: list[str] = []
#: How many gathering handlers are running now, and the most at once.
gathering = {"now": 0, "peak": 0}
release_sync = threading.Event()


async def add(job):
    await asyncio.sleep(0)
    return job.data["a"] + job.data["b"]


async def gather(job):
    """Wait until ``expect`` gathering handlers run at once (fail after 10 s)."""
    gathering["now"] += 1
    gathering["peak"] = max(gathering["peak"], gathering["now"])
    try:
        deadline = time.monotonic() + 10
        while gathering["peak"] < job.data["expect"]:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {gathering['peak']} ran at once")
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
    finally:
        gathering["now"] -= 1


async def fails(job):
    await asyncio.sleep(0)
    raise ValueError("boom")


async def waits_forever(job):
    events.append(f"started {job.id}")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        events.append(f"cancelled {job.id}")
        raise


async def blocks_the_loop(job):
    events.append("blocking")
    time.sleep(job.data.get("seconds", 1.5))  # the mistake the watchdog reports
    events.append("unblocked")


async def reads_its_row(job):
    row = await Job.objects.aget(pk=job.id)
    return row.status


async def reports_progress(job):
    written = await job.aset_progress(40, "halfway")
    return written


def holds_a_thread(job):
    events.append("holding")
    if not release_sync.wait(10):
        raise AssertionError("never released")


@pytest.fixture(autouse=True)
def async_handlers(clean_registry):
    events.clear()
    gathering.update(now=0, peak=0)
    release_sync.clear()
    job("tests.async.add")(add)
    job("tests.async.gather")(gather)
    job("tests.async.fails")(fails)
    job("tests.async.waits_forever")(waits_forever)
    job("tests.async.times_out", timeout=0.3)(waits_forever)
    job("tests.async.blocks_the_loop")(blocks_the_loop)
    job("tests.async.reads_its_row")(reads_its_row)
    job("tests.async.reports_progress")(reports_progress)
    job("tests.sync.holds_a_thread")(holds_a_thread)
    yield
    release_sync.set()


def refreshed(job):
    job.refresh_from_db()
    return job


def test_an_async_handler_runs_and_its_return_value_is_the_result():
    added = enqueue("tests.async.add", {"a": 2, "b": 3})

    Worker(burst=True).run()

    added = refreshed(added)
    assert added.status == JobStatus.COMPLETED
    assert added.result == 5
    assert added.attempts == 1
    assert added.claimed_at <= added.started_at <= added.completed_at


def test_async_handlers_run_at_once_on_one_loop_beside_a_single_thread():
    enqueue_many([{"job_type": "tests.async.gather", "data": {"expect": 30}}] * 30)

    Worker(concurrency=1, async_concurrency=30, burst=True).run()

    assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 30
    assert gathering["peak"] == 30


def test_no_more_async_handlers_run_at_once_than_async_concurrency():
    # Each waits for 10 at once, which they reach; the 15 others wait for a place.
    enqueue_many([{"job_type": "tests.async.gather", "data": {"expect": 10}}] * 25)

    Worker(concurrency=1, async_concurrency=10, burst=True).run()

    assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 25
    assert gathering["peak"] == 10


def test_an_async_handler_failing_is_retried_then_failed_with_its_error():
    failing = enqueue("tests.async.fails", max_attempts=2, delay=0)
    failing.refresh_from_db()

    Worker(burst=True).run()
    failing = refreshed(failing)
    if failing.status == JobStatus.PENDING:  # its retry is due after the backoff
        Job.objects.filter(pk=failing.pk).update(run_at=failing.created_at)
        Worker(burst=True).run()
        failing = refreshed(failing)

    assert failing.status == JobStatus.FAILED
    assert failing.attempts == 2
    assert failing.last_error == "ValueError: boom"
    assert "in fails" in failing.last_traceback


def test_the_async_orm_works_in_an_async_handler():
    reading = enqueue("tests.async.reads_its_row")

    Worker(burst=True).run()

    assert refreshed(reading).result == JobStatus.RUNNING


def test_an_async_handler_reports_progress_with_aset_progress():
    reporting = enqueue("tests.async.reports_progress")

    Worker(burst=True).run()

    reporting = refreshed(reporting)
    assert reporting.result is True
    assert reporting.current_stage == "halfway"
    assert reporting.events_count >= 1


def test_cancelling_a_running_async_job_raises_cancelled_error_in_its_handler():
    waiting = enqueue("tests.async.waits_forever")

    with worker_thread(concurrency=1):
        wait_for(lambda: f"started {waiting.id}" in events)
        assert Job.objects.filter(pk=waiting.pk).cancel() == 1
        wait_for(lambda: refreshed(waiting).status == JobStatus.CANCELLED)

    assert f"cancelled {waiting.id}" in events


def test_an_async_handler_past_its_timeout_is_cancelled_and_its_attempt_fails():
    timing_out = enqueue("tests.async.times_out", max_attempts=1)

    Worker(burst=True).run()

    timing_out = refreshed(timing_out)
    assert timing_out.status == JobStatus.FAILED
    assert timing_out.last_error == "JobTimeout: ran past its timeout of 0.3s"
    assert f"cancelled {timing_out.id}" in events


def test_a_handler_blocking_the_loop_is_logged_by_job_id_and_heartbeats_go_on(caplog):
    blocking = enqueue("tests.async.blocks_the_loop", {"seconds": 3})
    with (
        caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"),
        worker_thread(concurrency=1),
    ):
        wait_for(lambda: "blocking" in events)
        claimed_heartbeat = refreshed(blocking).heartbeat_at
        # The heartbeat thread still writes while the loop is blocked.
        wait_for(
            lambda: (
                refreshed(blocking).heartbeat_at > claimed_heartbeat and "unblocked" not in events
            ),
            timeout=2.5,
        )
        wait_for(lambda: refreshed(blocking).status == JobStatus.COMPLETED)

    warnings = [
        r.getMessage() for r in caplog.records if "blocked the event loop" in r.getMessage()
    ]
    assert warnings, "no warning about the blocked loop"
    assert warnings[0].startswith(f"job {blocking.id} (tests.async.blocks_the_loop) has blocked")


def test_sync_jobs_run_while_every_async_place_is_taken():
    waiting = enqueue_many([{"job_type": "tests.async.waits_forever", "priority": 200}] * 2)
    enqueue_many([{"job_type": "tests.record"}] * 3)

    with worker_thread(concurrency=1, async_concurrency=2, shutdown_grace=0.2):
        wait_for(lambda: Execution.objects.count() == 3)
        assert sum(f"started {job.id}" in events for job in waiting) == 2
        assert all(refreshed(job).status == JobStatus.RUNNING for job in waiting)

    # Still running at the end of the grace period: handed back, the attempt refunded.
    for job_ in waiting:
        job_ = refreshed(job_)
        assert job_.status == JobStatus.PENDING
        assert job_.attempts == 0
        assert f"cancelled {job_.id}" in events


def test_async_jobs_run_while_every_thread_is_taken():
    holding = enqueue("tests.sync.holds_a_thread", priority=200)
    added = enqueue_many(
        [{"job_type": "tests.async.add", "data": {"a": 1, "b": n}} for n in range(5)]
    )

    with worker_thread(concurrency=1, async_concurrency=4, prefetch=0):
        wait_for(lambda: "holding" in events)
        wait_for(lambda: all(refreshed(job).status == JobStatus.COMPLETED for job in added))
        assert refreshed(holding).status == JobStatus.RUNNING
        release_sync.set()
        wait_for(lambda: refreshed(holding).status == JobStatus.COMPLETED)

    assert sorted(refreshed(job).result for job in added) == [1, 2, 3, 4, 5]


def test_a_stopping_worker_lets_a_quick_async_job_finish_within_the_grace_period():
    adding = enqueue("tests.async.gather", {"expect": 1})

    with worker_thread(concurrency=1, shutdown_grace=5) as worker:
        wait_for(lambda: gathering["peak"] == 1)
        worker.stop()

    assert refreshed(adding).status == JobStatus.COMPLETED


def test_job_signals_are_sent_for_async_handlers():
    received = []

    def on_completed(sender, job, result, **kwargs):
        # A sync receiver may use the ORM: it runs in a thread, not on the loop.
        received.append((job.job_type, result, Job.objects.filter(pk=job.pk).exists()))

    signals.job_completed.connect(on_completed)
    try:
        enqueue("tests.async.add", {"a": 1, "b": 1})
        Worker(burst=True).run()
    finally:
        signals.job_completed.disconnect(on_completed)

    assert received == [("tests.async.add", 2, True)]


# -- bad input --------------------------------------------------------------------------


def test_a_worker_without_async_places_refuses_to_start_with_async_handlers():
    with pytest.raises(InvalidWorkerOptionError) as excinfo:
        Worker(async_concurrency=0)

    assert excinfo.value.field == "async_concurrency"
    message = str(excinfo.value)
    assert "tests.async.add" in message
    assert "--async-concurrency" in message


def test_a_worker_without_async_places_starts_when_its_job_types_are_all_sync():
    worker = Worker(async_concurrency=0, job_types=["tests.record"])

    assert worker.async_job_types == []


@pytest.mark.parametrize("value", [-1, 10001, 1.5, True, "8"])
def test_an_invalid_async_concurrency_is_refused(value):
    with pytest.raises(InvalidWorkerOptionError, match="async_concurrency: must be an integer"):
        Worker(async_concurrency=value)


def test_the_default_batch_size_makes_room_for_the_event_loop():
    assert Worker(concurrency=4, prefetch=100, async_concurrency=300).batch_size == 404
    assert Worker(concurrency=4, prefetch=100, async_concurrency=2000).batch_size == 1000
    assert Worker(concurrency=4, prefetch=100, job_types=["tests.record"]).batch_size == 104
    assert Worker(async_concurrency=300, batch_size=10).batch_size == 10
