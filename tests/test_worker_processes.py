"""Real ``pgqueue_worker`` processes: crashes, signals, heartbeats and recovery."""

import multiprocessing
import signal
import subprocess
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_pgqueue import enqueue
from django_pgqueue.models import Job, JobStatus, WorkerRecord
from django_pgqueue.recovery import recover_stale_jobs
from django_pgqueue.sideconn import open_raw_connection
from django_pgqueue.worker.handback import RELEASED_RUNNING_DELAY
from tests.testapp import async_jobs, process_jobs
from tests.testapp.models import Execution
from tests.workers import WorkerProcess, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# tests/settings.py: HEARTBEAT_INTERVAL 0.5s, STALE_AFTER 3s, RECOVER_INTERVAL 1s.


@pytest.fixture
def workers():
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        process = WorkerProcess("--poll-interval", "0.2", *args, env=env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def status_of(job):
    job.refresh_from_db()
    return job.status


def test_job_of_a_killed_worker_is_completed_by_another_worker(workers):
    job = enqueue("tests.record", {"sleep": 2})
    first = workers("--worker-id", "doomed")
    wait_for(lambda: status_of(job) == JobStatus.RUNNING)
    first.signal(signal.SIGKILL)
    first.wait()

    workers("--worker-id", "rescuer")
    wait_for(lambda: status_of(job) == JobStatus.COMPLETED, timeout=30)

    assert job.worker_id == "rescuer"
    assert job.attempts == 2
    assert job.worker_ids == ["doomed", "rescuer"]
    assert "worker doomed stopped heartbeating" in job.last_error
    # The killed attempt's transaction never committed: exactly one execution is on record.
    assert list(Execution.objects.values_list("worker_id", flat=True)) == ["rescuer"]


def test_long_healthy_job_is_not_recovered_while_its_worker_heartbeats(workers):
    job = enqueue("tests.record", {"sleep": 5})  # longer than STALE_AFTER (3s)
    workers("--worker-id", "steady")
    wait_for(lambda: status_of(job) == JobStatus.RUNNING)
    recovered = []
    while status_of(job) == JobStatus.RUNNING:
        recovered += recover_stale_jobs()
    assert recovered == []
    wait_for(lambda: status_of(job) == JobStatus.COMPLETED, timeout=15)
    assert job.attempts == 1
    assert Execution.objects.count() == 1


def test_sigterm_lets_the_running_job_finish_and_exits_zero(workers):
    job = enqueue("tests.record", {"sleep": 1.5})
    waiting = enqueue("tests.record", delay=timedelta(hours=1))
    worker = workers("--concurrency", "1")
    wait_for(lambda: status_of(job) == JobStatus.RUNNING)
    worker.signal(signal.SIGTERM)

    assert worker.wait() == 0, worker.output()
    assert status_of(job) == JobStatus.COMPLETED
    assert status_of(waiting) == JobStatus.PENDING
    assert "SIGTERM: stopping" in worker.output()


def test_sigterm_releases_a_job_that_outlives_the_grace_period(workers):
    job = enqueue("tests.record", {"sleep": 30})
    worker = workers("--shutdown-grace", "0.5")
    wait_for(lambda: status_of(job) == JobStatus.RUNNING)
    worker.signal(signal.SIGINT)

    assert worker.wait(timeout=15) == 0, worker.output()
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert job.worker_id is None
    assert job.attempts == 0  # the interrupted attempt is given back
    assert not Execution.objects.exists()


def start_a_long_job_and_stop_gracefully(workers, **options):
    """A worker running a 30 s ``tests.progress`` job, shutting down with 60 s of grace."""
    # tests.progress writes 25 % as soon as its handler starts, then sleeps. A claimed
    # job is 'running' already before a slot starts it, and a SIGTERM then would
    # release it and let the worker exit before the second signal.
    job = enqueue("tests.progress", {"sleep": 30}, **options)
    worker = workers("--shutdown-grace", "60")
    wait_for(lambda: Job.objects.get(pk=job.pk).progress == 25)
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM: stopping" in worker.output())
    return job, worker


def test_second_signal_hands_the_running_job_back_and_exits_at_once(workers):
    job, worker = start_a_long_job_and_stop_gracefully(workers)
    worker.signal(signal.SIGTERM)

    assert worker.wait(timeout=10) == 128 + signal.SIGTERM
    job.refresh_from_db()
    # Back to pending, not after STALE_AFTER: due a second after the hand-back, once the
    # process and its handler are gone; the interrupted attempt counts.
    assert (job.status, job.attempts, job.worker_id) == (JobStatus.PENDING, 1, None)
    assert job.last_error == "worker forced to exit"
    assert job.run_at <= timezone.now() + timedelta(seconds=RELEASED_RUNNING_DELAY)
    assert recover_stale_jobs() == []
    assert "handed back or recorded 1 job(s) before exiting" in worker.output()


def test_second_signal_fails_a_running_job_whose_attempts_are_spent(workers):
    job, worker = start_a_long_job_and_stop_gracefully(workers, max_attempts=1)
    worker.signal(signal.SIGINT)

    assert worker.wait(timeout=10) == 128 + signal.SIGINT
    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.FAILED, 1)
    assert job.last_error == "worker forced to exit"
    assert job.completed_at is not None


def test_second_signal_exits_even_when_the_hand_back_cannot_run(workers):
    job, worker = start_a_long_job_and_stop_gracefully(workers)
    # A lock on the job's row makes the hand-back wait; its statement timeout ends it.
    with open_raw_connection("default") as blocker, blocker.transaction():
        blocker.execute("SELECT 1 FROM pgqueue_jobs WHERE id = %s FOR UPDATE", [job.id])
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 128 + signal.SIGTERM
    assert "1 job(s) not handed back; recovery returns them" in worker.output()
    assert status_of(job) == JobStatus.RUNNING

    wait_for(lambda: recover_stale_jobs(), timeout=15)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert "stopped heartbeating" in job.last_error


def test_a_handler_returning_a_coroutine_is_retried_then_failed_never_completed(workers):
    job = enqueue("tests.returns_coroutine")  # max_attempts=2
    worker = workers()
    wait_for(lambda: status_of(job) == JobStatus.FAILED, timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()

    job.refresh_from_db()
    assert job.attempts == 2
    assert job.last_error == (
        "AsyncHandlerError: the handler of job type 'tests.returns_coroutine' returned an "
        "awaitable (coroutine _record_execution_async) instead of doing its work. Declare the "
        "handler with async def, and the worker runs it on its event loop; or make it a "
        "plain function that calls its async code through asgiref.sync.async_to_sync"
    )
    # Neither what the handler wrote before returning nor the coroutine's body is kept.
    assert not Execution.objects.exists()
    assert "never awaited" not in worker.output()
    assert "completed" not in worker.output()


def test_burst_worker_process_drains_and_exits_zero(workers):
    jobs = [enqueue("tests.record") for _ in range(20)]
    worker = workers("--burst", "--concurrency", "3")
    assert worker.wait() == 0, worker.output()
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], status="completed").count() == 20


def test_invalid_worker_options_are_reported_without_a_traceback(workers):
    worker = workers("--concurrency", "0")
    assert worker.wait() == 1
    assert "concurrency: must be an integer from 1 to 1000, got 0" in worker.output()
    assert "Traceback" not in worker.output()


def test_misconfigured_pgqueue_is_reported_by_the_system_check_not_a_traceback():
    worker = WorkerProcess(env={"PGQUEUE_TEST_SETTINGS": '{"POLL_INTERVAL": 0}'})
    try:
        assert worker.wait() == 1
        output = worker.output()
    finally:
        worker.stop()
    assert "django_pgqueue.E001" in output
    assert "POLL_INTERVAL" in output
    assert "Traceback" not in output


def _make_stale(job, seconds=60):
    Job.objects.filter(pk=job.pk).update(
        status=JobStatus.RUNNING,
        worker_id="gone",
        attempts=1,
        claimed_at=timezone.now() - timedelta(seconds=seconds),
        heartbeat_at=timezone.now() - timedelta(seconds=seconds),
    )


def test_recover_command_dry_run_lists_without_changing():
    job = enqueue("tests.record")
    _make_stale(job)
    out = StringIO()
    call_command("pgqueue_recover", "--dry-run", stdout=out)
    assert f"{job.id}  tests.record  worker=gone  -> pending" in out.getvalue()
    assert "would recover 1 stale job(s)" in out.getvalue()
    assert status_of(job) == JobStatus.RUNNING


def test_recover_command_returns_stale_jobs_to_pending():
    job = enqueue("tests.record")
    fresh = enqueue("tests.record")
    _make_stale(job)
    _make_stale(fresh, seconds=0)
    out = StringIO()
    call_command("pgqueue_recover", "--stale-after", "30", stdout=out)
    assert "recovered 1 stale job(s)" in out.getvalue()
    assert status_of(job) == JobStatus.PENDING
    assert status_of(fresh) == JobStatus.RUNNING


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_recover_command_rejects_a_stale_after_that_is_not_a_positive_duration(value):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="stale_after must be a positive number of seconds"):
        call_command("pgqueue_recover", "--stale-after", value)


def test_sigterm_with_threads_the_event_loop_and_child_processes_running(workers, clean_registry):
    async_jobs.register()  # to enqueue them here; the worker registers them itself
    process_jobs.register()
    quick = [
        enqueue("tests.record", {"sleep": 1}),
        enqueue("tests.durable_async", {"sleep": 1}),
        enqueue("tests.durable_process", {"sleep": 1}),
    ]
    slow = [
        enqueue("tests.record", {"sleep": 60}),
        enqueue("tests.durable_async", {"sleep": 60}),
        enqueue("tests.process.sleeps"),
    ]
    worker = workers(
        "--concurrency",
        "2",
        "--async-concurrency",
        "2",
        "--process-concurrency",
        "2",
        "--shutdown-grace",
        "6",
        env={"PGQUEUE_TEST_ASYNC_JOBS": "1", "PGQUEUE_TEST_PROCESS_JOBS": "1"},
    )
    wait_for(lambda: all(status_of(job) == JobStatus.RUNNING for job in quick + slow))
    worker.signal(signal.SIGTERM)

    assert worker.wait(timeout=30) == 0, worker.output()
    # Each quick one finished within the grace period; each slow one was handed back
    # with its attempt given back, whichever kind of slot ran it.
    assert [status_of(job) for job in quick] == [JobStatus.COMPLETED] * 3, worker.output()
    for job in slow:
        job.refresh_from_db()
        assert (job.status, job.attempts) == (JobStatus.PENDING, 0), worker.output()
    assert multiprocessing.active_children() == []
    assert not _processes_running("spawn_main"), "a child process outlived its worker"


def _processes_running(pattern: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return found.stdout.split()


@pytest.mark.parametrize("steps", [False, True], ids=["no steps", "plain steps"])
def test_a_worker_holds_concurrency_plus_two_connections_as_the_docs_say(steps):
    # docs/how-to/production.md, "Size the database connections": the main loop, the
    # listener (the heartbeat beats on it), and one per slot whose handler used the
    # database; and the checkpoint writer when handlers ran plain steps. The leader
    # (this worker, alone) opens one more for its periodic work and closes it after.
    import json

    from django.db import connection

    def backends():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend'"
            )
            return {pid for (pid,) in cursor.fetchall()}

    before = backends()
    for _ in range(3):
        enqueue("tests.db_sleeps", {"sleep": 4, "step": steps})
    settings = json.dumps({"HEARTBEAT_INTERVAL": 0.3})
    worker = WorkerProcess("--concurrency", "3", env={"PGQUEUE_TEST_SETTINGS": settings})
    expected = 2 + 3 + (1 if steps else 0)
    try:
        wait_for(lambda: Job.objects.filter(status=JobStatus.RUNNING).count() == 3, timeout=20)
        wait_for(lambda: len(backends() - before) >= expected, timeout=10)
        held = []
        for _ in range(20):  # nothing more stays open while the jobs run
            held.append(len(backends() - before))
            time.sleep(0.05)
        assert min(held) == expected, (held, worker.output()[-2000:])
        assert max(held) <= expected + 1, (held, worker.output()[-2000:])
    finally:
        worker.stop()


def test_a_job_released_at_shutdown_runs_again_only_once_its_handler_is_gone(workers, tmp_path):
    # The handler outlives the grace period in I/O: the worker releases its job and
    # exits. Another worker, idle and polling, must not start it while the first
    # handler still lives (it dies with its process).
    marks = tmp_path / "marks"
    job = enqueue("tests.holds_io", {"marks": str(marks), "sleep": 30})
    # Its project's exit is slow, as one whose atexit functions flush telemetry.
    slow_exit = {"PGQUEUE_TEST_SLOW_EXIT": "0.5"}
    first = workers("--worker-id", "first", "--shutdown-grace", "0.3", env=slow_exit)
    wait_for(lambda: marks.exists())
    workers("--worker-id", "second", "--poll-interval", "0.01")
    wait_for(lambda: WorkerRecord.objects.filter(worker_id="second").exists())
    first.signal(signal.SIGTERM)

    assert first.wait(timeout=15) == 0, first.output()
    wait_for(lambda: " " in marks.read_text().partition("second")[2], timeout=15)
    runs = [line.split() for line in marks.read_text().splitlines()]
    last_of_first = max(float(at) for worker, at in runs if worker == "first")
    first_of_second = min(float(at) for worker, at in runs if worker == "second")
    assert first_of_second > last_of_first
    job.refresh_from_db()
    assert job.attempts == 1  # the released attempt was given back
