"""The worker's prefetch buffer: claimed jobs held beyond the free slots while jobs are
fast, none while they are slow, and released untouched when the worker stops."""

import threading
from datetime import datetime

import pytest

from django_pgqueue import enqueue, enqueue_many, job
from django_pgqueue.exceptions import InvalidWorkerOptionError
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.schema import IN_FLIGHT
from django_pgqueue.worker import Worker
from django_pgqueue.worker.runner import RATED_PREFETCH
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db(transaction=True)

held_at_start: list[int] = []
release_blocker = threading.Event()
blocker_started = threading.Event()


def jobs_held_by(worker_id: str) -> int:
    return Job.objects.filter(worker_id=worker_id, status__in=IN_FLIGHT).count()


@job("tests.prefetch.count_held", priority=200, atomic=False)
def count_held(job):
    held_at_start.append(jobs_held_by(job.worker_id))


@job("tests.prefetch.slow", atomic=False)
def slow(job):
    held_at_start.append(jobs_held_by(job.worker_id))
    release_blocker.wait(0.1)


@job("tests.prefetch.blocker", priority=150, atomic=False)
def blocker(job):
    blocker_started.set()
    assert release_blocker.wait(30)


@job("tests.prefetch.started_at")
def report_started_at(job):
    return job.started_at.isoformat()


@pytest.fixture(autouse=True)
def _reset():
    held_at_start.clear()
    release_blocker.clear()
    blocker_started.clear()
    yield
    release_blocker.set()


def test_fast_jobs_are_claimed_beyond_the_free_slots():
    enqueue_many([{"job_type": "tests.prefetch.count_held"} for _ in range(60)])

    Worker(concurrency=1, prefetch=10, burst=True, worker_id="fast").run()

    assert len(held_at_start) == 60
    assert held_at_start[0] == 1  # nothing is known about run times before a job ran
    assert 1 < max(held_at_start) <= 1 + 10


def test_slow_jobs_are_never_held_beyond_the_free_slots():
    enqueue_many([{"job_type": "tests.prefetch.slow"} for _ in range(6)])

    Worker(concurrency=1, prefetch=10, burst=True, worker_id="slow").run()

    assert held_at_start == [1] * 6


def test_prefetch_zero_claims_only_into_free_slots():
    enqueue_many([{"job_type": "tests.prefetch.count_held"} for _ in range(30)])

    Worker(concurrency=2, prefetch=0, burst=True, worker_id="none").run()

    assert max(held_at_start) <= 2


def test_jobs_waiting_in_the_buffer_are_released_untouched_when_the_worker_stops():
    enqueue_many([{"job_type": "tests.prefetch.count_held"} for _ in range(20)])
    enqueue("tests.prefetch.blocker")
    waiting = enqueue_many([{"job_type": "tests.noop"} for _ in range(30)])

    with worker_thread(concurrency=1, prefetch=10, worker_id="stopping") as worker:
        # Its handler, not its status: prefetched jobs are 'running' before they start.
        wait_for(blocker_started.is_set)
        wait_for(lambda: jobs_held_by("stopping") > 1)
        worker.stop()
        release_blocker.set()

    assert Job.objects.get(job_type="tests.prefetch.blocker").status == JobStatus.COMPLETED
    left = Job.objects.filter(pk__in=[j.pk for j in waiting], status=JobStatus.PENDING)
    assert left.exists()
    for released in left:
        assert released.attempts == 0
        assert released.worker_ids == []
        assert released.worker_id is None
        assert released.started_at is None  # it never started
    assert not Job.objects.filter(status__in=IN_FLIGHT).exists()


def test_started_at_is_when_the_handler_started():
    enqueue_many([{"job_type": "tests.prefetch.started_at"} for _ in range(20)])

    Worker(concurrency=1, prefetch=10, burst=True).run()

    for done in Job.objects.filter(job_type="tests.prefetch.started_at"):
        seen_by_handler = datetime.fromisoformat(done.result)
        assert abs((done.started_at - seen_by_handler).total_seconds()) < 0.001
        assert done.claimed_at <= done.started_at <= done.completed_at


@pytest.mark.parametrize("prefetch", [-1, 10001, 1.5, True])
def test_prefetch_out_of_range_is_rejected(prefetch):
    with pytest.raises(InvalidWorkerOptionError, match="prefetch"):
        Worker(prefetch=prefetch)


def test_the_buffer_is_topped_up_by_batches_not_job_by_job():
    """Jobs whose completion is written in their handlers' transactions leave the main
    loop nothing to write: it claims once the buffer is half empty, not after each
    finished job (every claim is a transaction, with a commit)."""
    enqueue_many([{"job_type": "tests.record"} for _ in range(120)])
    worker = Worker(concurrency=4, prefetch=40, burst=True, worker_id="refill")

    worker.run()

    assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 120
    # About a claim a job before (each finished one woke the loop to fill its place).
    assert worker.round_trips <= 40, worker.round_trips


@pytest.mark.parametrize(
    ("running", "outcomes", "claimed"),
    [
        (11, 0, 0),  # one running, the buffer full
        (7, 0, 0),  # six buffered: more than half of ten
        (6, 0, 5),  # five: half empty, topped up
        (7, 1, 4),  # an outcome to write anyway: the claim rides along
        (0, 0, 11),  # a free slot: at once, whatever the buffer
    ],
)
def test_a_busy_worker_claims_once_its_buffer_is_half_empty(running, outcomes, claimed):
    worker = Worker(concurrency=1, prefetch=10, worker_id="refill", listen=False)
    worker._average_duration = 0.002  # a buffer of ten: 20 ms of such jobs
    worker._running = {number: object() for number in range(running)}
    worker._outcomes = [object()] * outcomes

    assert worker._claim_size() == claimed


def test_the_buffer_is_shallower_while_rate_limits_exist():
    """A prefetched job under a rate limit is counted in its windows before it starts:
    while limits exist the buffer holds at most ``RATED_PREFETCH`` jobs, whatever
    ``prefetch`` allows; without them, what ``prefetch`` allows."""
    worker = Worker(concurrency=4, prefetch=400, worker_id="depth", listen=False)
    worker._average_duration = 0.00002  # 20 ms of such jobs: 4,000 on 4 slots

    assert worker._prefetch_depth() == 400
    worker.pacing.limited = True
    assert worker._prefetch_depth() == RATED_PREFETCH == 100
