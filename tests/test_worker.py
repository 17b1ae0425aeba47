"""The worker run in a thread of the test process: claiming, outcomes, retries,
timeouts, cancellation, wake-ups."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.exceptions import InvalidWorkerOptionError
from django_pgqueue.models import Job, JobStatus, WorkerRecord
from django_pgqueue.worker import Worker
from tests.testapp.models import Execution
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db(transaction=True)


def status_of(job):
    job.refresh_from_db()
    return job.status


def test_burst_drains_every_due_job_and_exits():
    enqueue_many([{"job_type": "tests.record"} for _ in range(300)])
    later = enqueue("tests.record", delay=timedelta(hours=1))

    worker = Worker(concurrency=4, burst=True)
    assert worker.run() == 0

    assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 300
    assert Execution.objects.count() == 300
    assert status_of(later) == JobStatus.PENDING
    assert worker.processed == 300


def test_completed_job_records_progress_worker_and_times():
    job = enqueue("tests.record")
    Worker(burst=True, worker_id="w-1").run()

    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert job.progress == 100
    assert job.worker_id == "w-1"
    assert job.worker_ids == ["w-1"]
    assert job.attempts == 1
    assert job.claimed_at <= job.started_at <= job.completed_at


def test_worker_records_itself_while_running_and_its_stop():
    with worker_thread(worker_id="recorded", concurrency=3, queues=["emails"]):
        record = wait_for(lambda: WorkerRecord.objects.filter(worker_id="recorded").first())
        assert record.queues == ["emails"]
        assert record.job_types is None
        assert record.concurrency == 3
        assert record.stopped_at is None
    record.refresh_from_db()
    assert record.stopped_at is not None


def test_a_claimed_job_that_is_cancelled_before_it_starts_never_runs():
    job = enqueue("tests.record", delay=0.3)
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now())
    wait_for(lambda: timezone.now() >= job.run_at)
    Worker(burst=True).run()
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert not Execution.objects.exists()


def test_return_value_is_stored_as_result():
    job = enqueue("tests.returns", {"n": 21})
    Worker(burst=True).run()
    job.refresh_from_db()
    assert job.result == {"doubled": 42}


def test_a_return_value_longer_than_a_payload_may_be_is_not_stored(pgqueue_settings):
    pgqueue_settings(MAX_PAYLOAD_BYTES=12)
    job = enqueue("tests.returns", {"n": 21})  # 9 bytes; the result is 15

    Worker(burst=True).run()

    job.refresh_from_db()
    assert (job.status, job.result) == (JobStatus.COMPLETED, None)
    assert job.last_error == (
        "the return value was not stored: its JSON is 15 bytes, more than "
        "PGQUEUE['MAX_PAYLOAD_BYTES'] (12); store large results elsewhere and return a "
        "reference"
    )


def test_handler_writes_are_rolled_back_when_it_fails():
    job = enqueue("tests.fail", max_attempts=1)
    Worker(burst=True).run()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert not Execution.objects.filter(job_id=job.id).exists()


def test_failing_job_retries_with_growing_delays_then_fails_with_traceback():
    job = enqueue("tests.backoff")  # Backoff(base=0.4, factor=2), 3 attempts
    delays = []
    for _ in range(2):
        Worker(burst=True).run()
        job.refresh_from_db()
        assert job.status == JobStatus.PENDING
        delays.append((job.run_at - job.claimed_at).total_seconds())
        wait_for(lambda: timezone.now() >= job.run_at, timeout=5)
    Worker(burst=True).run()

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.attempts == 3
    assert job.completed_at is not None
    assert job.last_error == "ValueError: attempt 3 failed"
    assert "Traceback (most recent call last)" in job.last_traceback
    assert "fails_with_growing_backoff" in job.last_traceback
    assert delays[0] >= 0.4
    assert delays[1] >= 0.8
    assert delays[1] > delays[0]


def test_fail_job_exception_fails_at_once_without_retry():
    job = enqueue("tests.fail_now")
    Worker(burst=True).run()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.attempts == 1
    assert job.last_error == "FailJob: the input is unusable"


def test_retry_job_exception_reschedules_after_the_given_delay():
    job = enqueue("tests.retry_later", {"delay": 0.5})
    Worker(burst=True).run()
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert job.last_error == "RetryJob: not ready yet"
    assert (job.run_at - job.claimed_at).total_seconds() >= 0.5

    wait_for(lambda: timezone.now() >= job.run_at, timeout=5)
    Worker(burst=True).run()
    assert status_of(job) == JobStatus.COMPLETED


def test_unknown_job_type_fails_visibly_after_its_attempts():
    with override_settings(
        PGQUEUE={"VALIDATE_JOB_TYPES": False, "RETRY_BACKOFF_BASE": 0.01, "RETRY_BACKOFF_MAX": 0.01}
    ):
        job = enqueue("tests.not_registered", max_attempts=2)
        with worker_thread(concurrency=2, poll_interval=0.05):
            wait_for(lambda: status_of(job) == JobStatus.FAILED)
    job.refresh_from_db()
    assert job.attempts == 2
    assert "no handler is registered for job type 'tests.not_registered'" in job.last_error


def test_timeout_interrupts_a_python_handler():
    job = enqueue("tests.busy")  # timeout=0.5, loops for 30s
    started = time.monotonic()
    with worker_thread(concurrency=1, poll_interval=0.1):
        wait_for(lambda: status_of(job) == JobStatus.FAILED, timeout=10)
    assert time.monotonic() - started < 10
    assert job.last_error == "JobTimeout: ran past its timeout of 0.5s"


def test_timeout_of_a_handler_blocked_in_c_code_is_recorded_and_its_slot_kept_busy():
    blocked = enqueue("tests.sleep", {"sleep": 6})  # timeout=1, max_attempts=1
    queued = enqueue("tests.noop")
    with worker_thread(concurrency=1, poll_interval=0.1) as worker:
        wait_for(lambda: status_of(blocked) == JobStatus.FAILED, timeout=10)
        assert "did not stop when interrupted" in blocked.last_error
        # The only slot is still occupied by the abandoned thread: nothing else runs.
        assert status_of(queued) == JobStatus.PENDING
        wait_for(lambda: status_of(queued) == JobStatus.COMPLETED, timeout=10)
    assert worker.concurrency == 1


def test_cancelling_a_pending_job_makes_it_unclaimable():
    job = enqueue("tests.record")
    assert job.cancel() is True
    Worker(burst=True).run()
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert job.attempts == 0
    assert not Execution.objects.exists()


def test_cancelling_a_running_job_reaches_the_handler_and_ends_cancelled():
    job = enqueue("tests.cancellable", {"max_seconds": 20})
    with worker_thread(concurrency=1, poll_interval=0.1):
        wait_for(lambda: status_of(job) == JobStatus.RUNNING)
        assert job.cancel() is True
        wait_for(lambda: status_of(job) == JobStatus.CANCELLED, timeout=10)
    assert job.completed_at is not None
    assert "JobCancelled" in job.last_error


def test_retry_puts_a_failed_job_back_and_it_completes():
    job = enqueue("tests.fail_now")
    Worker(burst=True).run()
    assert status_of(job) == JobStatus.FAILED

    Job.objects.filter(pk=job.pk).update(job_type="tests.record")
    assert job.retry() is True
    Worker(burst=True).run()
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert job.attempts == 1


def test_priority_order_is_respected_by_a_single_slot():
    low = enqueue("tests.record", priority=10)
    high = enqueue("tests.record", priority=900)
    mid = enqueue("tests.record", priority=100)
    Worker(concurrency=1, burst=True).run()
    order = list(Execution.objects.order_by("started_at").values_list("job_id", flat=True))
    assert order == [high.id, mid.id, low.id]


def test_queue_and_job_type_filters_limit_what_a_worker_claims():
    emails = enqueue("tests.record", queue="emails")
    other = enqueue("tests.record", queue="reports")
    noop = enqueue("tests.noop", queue="emails")
    Worker(queues=["emails"], job_types=["tests.record"], burst=True).run()
    assert status_of(emails) == JobStatus.COMPLETED
    assert status_of(other) == JobStatus.PENDING
    assert status_of(noop) == JobStatus.PENDING


def test_notify_wakes_an_idle_worker_long_before_its_poll_interval():
    with worker_thread(concurrency=1, poll_interval=30) as worker:
        listener = wait_for(lambda: _listener(worker))
        wait_for(listener.listening.is_set)
        time.sleep(0.2)  # let the worker go idle on its 30s poll
        job = enqueue("tests.record")
        wait_for(lambda: status_of(job) == JobStatus.COMPLETED, timeout=10)
    assert (job.started_at - job.created_at).total_seconds() < 10


def test_polling_still_finds_jobs_when_notify_is_disabled():
    with (
        override_settings(PGQUEUE={"NOTIFY": False, "POLL_INTERVAL": 0.2}),
        worker_thread(concurrency=1) as worker,
    ):
        assert _listener(worker) is None
        time.sleep(0.3)
        job = enqueue("tests.record")
        wait_for(lambda: status_of(job) == JobStatus.COMPLETED, timeout=10)


def test_outcomes_and_claims_are_batched_into_few_round_trips():
    enqueue_many([{"job_type": "tests.noop"} for _ in range(200)])

    worker = Worker(concurrency=8, burst=True)
    worker.run()

    assert worker.stats == {"completed": 200}
    # Each round trip records the outcomes so far and claims up to 8 jobs.
    assert worker.round_trips <= 200 / 2


def test_worker_rejects_invalid_options():
    with pytest.raises(InvalidWorkerOptionError, match="concurrency"):
        Worker(concurrency=0)
    with pytest.raises(InvalidWorkerOptionError, match="batch_size"):
        Worker(batch_size=100_000)
    with pytest.raises(
        InvalidWorkerOptionError, match="queues: 'bad queue; drop' is not a valid queue name"
    ):
        Worker(queues=["bad queue; drop"])
    with pytest.raises(InvalidWorkerOptionError, match="poll_interval"):
        Worker(poll_interval=0)


def test_a_handler_calling_sys_exit_fails_its_job_and_the_slot_goes_on():
    exiting = enqueue("tests.exits")
    after = enqueue("tests.record", priority=1)
    Worker(concurrency=1, burst=True).run()
    exiting.refresh_from_db()
    assert exiting.status == JobStatus.FAILED
    assert exiting.last_error == "SystemExit: 3"
    assert status_of(after) == JobStatus.COMPLETED


def test_a_handler_returning_an_awaitable_fails_instead_of_completing():
    job = enqueue("tests.returns_awaitable")  # max_attempts=1
    Worker(burst=True).run()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.last_error.startswith(
        "AsyncHandlerError: the handler of job type 'tests.returns_awaitable' returned an "
        "awaitable (_Awaitable) instead of doing its work. Declare the handler with async "
        "def, and the worker runs it on its event loop"
    )
    assert job.result is None


def test_running_a_worker_in_the_main_thread_restores_the_signal_handlers():
    import signal

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    Worker(burst=True).run()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_set_progress_of_a_job_no_longer_held_writes_nothing():
    job = enqueue("tests.record")
    Worker(burst=True, worker_id="w-done").run()
    job.refresh_from_db()
    assert job.set_progress(10, "too late") is False
    job.refresh_from_db()
    assert (job.progress, job.current_stage) == (100, "")


def test_retry_and_run_now_wake_idle_workers():
    from django_pgqueue.sideconn import open_raw_connection

    failed = enqueue("tests.fail_now", queue="repairs")
    Worker(burst=True).run()
    delayed = enqueue("tests.record", queue="later", delay=timedelta(hours=1))
    listener = open_raw_connection("default")
    try:
        listener.execute("LISTEN pgqueue_jobs")
        assert failed.retry() is True
        assert Job.objects.filter(pk=delayed.pk).run_now() == 1
        payloads = {n.payload for n in listener.notifies(timeout=2, stop_after=2)}
    finally:
        listener.close()
    assert payloads == {"repairs", "later"}


def _listener(worker):
    """The worker's LISTEN thread once it runs, or None (e.g. with NOTIFY off)."""
    listener = worker._listener
    return listener if listener is not None and listener.is_alive() else None


def test_worker_survives_its_connections_being_killed_and_loses_nothing():
    jobs = enqueue_many(
        [{"job_type": "tests.record", "data": {"sleep": 0.01}, "max_attempts": 10}] * 400
    )
    kills = 0
    with worker_thread(concurrency=4, poll_interval=0.1):
        for round_ in range(4):
            wait_for(
                lambda n=round_: Job.objects.filter(status=JobStatus.COMPLETED).count() > n * 80
            )
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                kills += 1 if cursor.fetchone()[0] else 0
        wait_for(
            lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == len(jobs),
            timeout=60,
        )
    assert kills == 4
    assert Job.objects.exclude(status=JobStatus.COMPLETED).count() == 0
    executed = set(Execution.objects.values_list("job_id", flat=True))
    assert executed == {job.id for job in jobs}


def test_jobs_whose_notify_was_coalesced_still_start_without_waiting_for_a_poll():
    from django_pgqueue.inserts import NOTIFY_COALESCE_SECONDS

    with worker_thread(concurrency=4, poll_interval=30) as worker:
        listener = wait_for(lambda: _listener(worker))
        wait_for(listener.listening.is_set)
        time.sleep(0.2)
        jobs = [enqueue("tests.record") for _ in range(20)]  # autocommit: NOTIFYs coalesce
        wait_for(
            lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == len(jobs),
            timeout=10,
        )
    assert NOTIFY_COALESCE_SECONDS < 0.1


def test_integer_retry_delays_mixed_with_float_ones_are_recorded():
    # Backoff(jitter=False) capped by an int max used to yield an int delay, which psycopg
    # refused in the same list as float ones: the worker then retried the write forever.
    from django_pgqueue import Backoff

    assert isinstance(Backoff(base=10, max=60, jitter=False).delay(5), float)
    failing = [enqueue("tests.fail") for _ in range(3)]
    with worker_thread(concurrency=3, poll_interval=0.1) as worker:
        wait_for(lambda: worker.stats["pending"] >= 3, timeout=10)
    for job in failing:
        job.refresh_from_db()
        assert job.last_error.startswith("RuntimeError: boom on attempt")


def test_after_the_server_cut_every_connection_no_job_spends_an_attempt(other_connection):
    # Every backend terminated at once (a failover, pg_terminate_backend): the worker's
    # main connection notices at its next claim, and its slots must check their own
    # idle connections before running a job, instead of failing one each.
    with worker_thread(concurrency=3, poll_interval=0.05):
        warm = enqueue_many([{"job_type": "tests.record", "data": {"sleep": 0.05}}] * 6)
        wait_for(lambda: all(status_of(job) == JobStatus.COMPLETED for job in warm))
        other_connection.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        connection.close()  # the test's own connection was cut too
        jobs = enqueue_many([{"job_type": "tests.record"}] * 6)
        wait_for(lambda: all(status_of(job) != JobStatus.PENDING for job in jobs), timeout=20)
        wait_for(lambda: all(status_of(job) == JobStatus.COMPLETED for job in jobs), timeout=20)

    assert [(job.attempts, job.last_error) for job in jobs] == [(1, "")] * 6
