"""Process isolation: handlers declared ``isolation="process"`` run in child processes
of the worker, which a timeout or a cancellation kills, and whose crashes fail only the
attempt."""

from __future__ import annotations

import asyncio
import multiprocessing
import os

import pytest
from django.db.models.functions import Now

from django_pgqueue import enqueue, enqueue_many, job
from django_pgqueue.exceptions import InvalidWorkerOptionError, JobRegistrationError
from django_pgqueue.models import Job, JobStatus, JobStep
from django_pgqueue.options import JobSpec
from django_pgqueue.worker import Worker, process_slots
from tests.testapp import process_jobs
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def process_handlers(clean_registry, monkeypatch):
    # The children read the variable (tests/testapp/jobs.py) and register them too.
    monkeypatch.setenv("PGQUEUE_TEST_PROCESS_JOBS", "1")
    monkeypatch.setattr(process_slots, "KILL_GRACE", 0.5)
    process_jobs.register()


def refreshed(job_):
    job_.refresh_from_db()
    return job_


def run_burst(**options):
    worker = Worker(burst=True, concurrency=1, **options)
    worker.run()
    # A stopped worker leaves no child process behind.
    assert multiprocessing.active_children() == []
    return worker


def test_a_process_isolated_handler_runs_in_a_child_process():
    ran = enqueue("tests.process.pid")

    run_burst(process_concurrency=1)

    ran = refreshed(ran)
    assert ran.status == JobStatus.COMPLETED
    assert isinstance(ran.result, int) and ran.result != os.getpid()


def test_steps_in_a_child_process_run_once_across_attempts():
    jobs = enqueue_many([JobSpec(job_type="tests.process.steps") for _ in range(3)])

    run_burst(process_concurrency=1)
    Job.objects.filter(status=JobStatus.PENDING).update(run_at=Now())  # the retries
    run_burst(process_concurrency=1)

    for ran in map(refreshed, jobs):
        assert (ran.status, ran.attempts) == (JobStatus.COMPLETED, 2)
        # The second attempt's child answered the step from the first one's checkpoint.
        assert ran.result == JobStep.objects.get(job=ran, name="pid").result != os.getpid()


def test_a_handler_hanging_past_its_timeout_is_killed_and_the_worker_goes_on():
    hanging = enqueue("tests.process.hangs")  # blocks SIGUSR1: only SIGKILL ends it
    after = enqueue("tests.process.pid", priority=1)

    run_burst(process_concurrency=1)

    hanging = refreshed(hanging)
    assert hanging.status == JobStatus.FAILED
    assert hanging.last_error == (
        "JobTimeout: ran past its timeout of 0.5s; its process was killed"
    )
    assert refreshed(after).status == JobStatus.COMPLETED


def test_a_handler_calling_os_exit_fails_its_attempt_with_the_status():
    exiting = enqueue("tests.process.exits")  # two attempts, 50 ms apart

    run_burst(process_concurrency=1)
    wait_for(lambda: Job.objects.filter(pk=exiting.pk, run_at__lte=Now()).exists())
    run_burst(process_concurrency=1)

    exiting = refreshed(exiting)
    assert exiting.status == JobStatus.FAILED
    assert exiting.attempts == 2
    assert exiting.last_error == (
        "ChildProcessError: the process running the handler exited with status 3"
    )


def test_a_segfaulting_handler_fails_its_attempt_and_the_next_job_runs():
    crashing = enqueue("tests.process.segfaults")
    after = enqueue("tests.process.pid", priority=1)

    run_burst(process_concurrency=1)

    assert refreshed(crashing).last_error == (
        "ChildProcessError: the process running the handler was killed by SIGSEGV"
    )
    assert refreshed(crashing).status == JobStatus.FAILED
    assert refreshed(after).status == JobStatus.COMPLETED


def test_a_child_killed_as_the_oom_killer_does_fails_its_attempt_saying_so():
    killed = enqueue("tests.process.killed")

    run_burst(process_concurrency=1)

    assert refreshed(killed).last_error == (
        "ChildProcessError: the process running the handler was killed by SIGKILL (sent by "
        "the kernel's OOM killer when memory runs out, or by hand)"
    )


def test_cancelling_a_running_job_kills_its_process():
    sleeping = enqueue("tests.process.sleeps")

    with worker_thread(concurrency=1, process_concurrency=1):
        wait_for(lambda: refreshed(sleeping).status == JobStatus.RUNNING)
        Job.objects.filter(pk=sleeping.pk).cancel()
        wait_for(lambda: refreshed(sleeping).status == JobStatus.CANCELLED)
        after = enqueue("tests.process.pid")
        wait_for(lambda: refreshed(after).status == JobStatus.COMPLETED)

    assert refreshed(sleeping).last_error == "cancelled: its process was killed"


def test_a_child_is_replaced_after_max_jobs_per_child():
    jobs = enqueue_many([{"job_type": "tests.process.pid"}] * 3)

    run_burst(process_concurrency=1, max_jobs_per_child=2)

    first, second, third = (refreshed(j).result for j in jobs)
    assert first == second != third


def test_a_child_is_replaced_once_its_memory_passed_the_limit(monkeypatch):
    # Never read while a job runs: the big job's peak is seen once it returned.
    monkeypatch.setattr(process_slots, "MEMORY_CHECK_INTERVAL", 3600)
    big = enqueue("tests.process.allocates", {"mib": 200, "hold": 0.3}, priority=200)
    small = enqueue("tests.process.allocates", {"mib": 1}, priority=100)
    last = enqueue("tests.process.pid", priority=1)

    # A worker that holds more than the limit itself: a child's peak must be its own
    # (Linux keeps ru_maxrss across the exec that spawns the child).
    ballast = b"x" * (300 << 20)
    run_burst(process_concurrency=1, max_memory_per_child=150)
    del ballast

    assert refreshed(big).status == JobStatus.COMPLETED
    # The child that held 200 MiB was replaced; the next one stayed under the limit.
    assert refreshed(big).result != refreshed(small).result == refreshed(last).result


def test_a_job_holding_more_memory_than_the_limit_is_killed_and_fails():
    hogging = enqueue("tests.process.hogs", {"mib": 300})
    after = enqueue("tests.process.pid", priority=1)

    run_burst(process_concurrency=1, max_memory_per_child=150)

    hogging = refreshed(hogging)
    assert hogging.status == JobStatus.FAILED
    assert hogging.last_error == (
        "MemoryError: its process went past the memory limit of 150 MiB "
        "(--max-memory-per-child) and was killed"
    )
    assert refreshed(after).status == JobStatus.COMPLETED


def test_process_jobs_wait_for_a_free_child_while_thread_jobs_run():
    sleeping = enqueue("tests.process.sleeps", priority=200)
    recorded = enqueue_many([{"job_type": "tests.returns", "data": {"n": n}} for n in range(3)])

    with worker_thread(concurrency=1, process_concurrency=1, shutdown_grace=0.2):
        wait_for(lambda: refreshed(sleeping).status == JobStatus.RUNNING)
        # Its only child is busy: the thread slot still runs the sync jobs.
        wait_for(lambda: all(refreshed(j).status == JobStatus.COMPLETED for j in recorded))
        assert refreshed(sleeping).status == JobStatus.RUNNING


def test_a_stopping_worker_hands_back_a_process_job_still_running_after_the_grace():
    sleeping = enqueue("tests.process.sleeps")

    with worker_thread(concurrency=1, process_concurrency=1, shutdown_grace=0.3):
        wait_for(lambda: refreshed(sleeping).status == JobStatus.RUNNING)

    sleeping = refreshed(sleeping)
    assert sleeping.status == JobStatus.PENDING
    assert sleeping.attempts == 0


def test_threads_the_event_loop_and_processes_run_side_by_side(clean_registry):
    async def awaits(job_):
        await asyncio.sleep(0)
        return "loop"

    job("tests.process.awaits")(awaits)
    jobs = [
        enqueue("tests.returns", {"n": 2}),
        enqueue("tests.process.awaits"),
        enqueue("tests.process.pid"),
    ]

    run_burst(process_concurrency=1, async_concurrency=2)

    thread_result, loop_result, process_result = (refreshed(j).result for j in jobs)
    assert thread_result == {"doubled": 4}
    assert loop_result == "loop"
    assert process_result != os.getpid()


def test_a_handler_the_child_cannot_find_fails_with_a_clear_error():
    def only_here(job_):
        return "never"

    job("tests.process.only_here", isolation="process", max_attempts=1)(only_here)
    lost = enqueue("tests.process.only_here")

    run_burst(process_concurrency=1)

    lost = refreshed(lost)
    assert lost.status == JobStatus.FAILED
    assert lost.last_error.startswith(
        "UnknownJobTypeError: no handler is registered for job type 'tests.process.only_here'"
    )


def test_pool_process_runs_every_sync_handler_in_a_child():
    plain = enqueue("tests.process.plain_pid")
    run_burst(pool="process", process_concurrency=1)
    assert refreshed(plain).result != os.getpid()

    in_thread = enqueue("tests.process.plain_pid")
    run_burst(process_concurrency=1)
    assert refreshed(in_thread).result == os.getpid()


# -- bad input --------------------------------------------------------------------------


def test_a_worker_without_process_slots_refuses_to_start_with_isolated_job_types():
    with pytest.raises(InvalidWorkerOptionError) as excinfo:
        Worker(process_concurrency=0)

    assert excinfo.value.field == "process_concurrency"
    assert "tests.process.pid" in str(excinfo.value)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"process_concurrency": -1}, "process_concurrency"),
        ({"max_jobs_per_child": 0}, "max_jobs_per_child"),
        ({"max_memory_per_child": 0}, "max_memory_per_child"),
        ({"max_memory_per_child": 1.5}, "max_memory_per_child"),
        ({"pool": "fork"}, "pool"),
        ({"pool": "process", "process_concurrency": 0}, "process_concurrency"),
    ],
)
def test_invalid_process_options_are_refused(options, field):
    with pytest.raises(InvalidWorkerOptionError) as excinfo:
        Worker(**options)

    assert excinfo.value.field == field


def test_an_unknown_isolation_is_refused_at_registration():
    with pytest.raises(JobRegistrationError, match="isolation must be one of 'thread', 'process'"):
        job("tests.process.bad", isolation="fork")(process_jobs.pid)


def test_an_async_handler_cannot_be_process_isolated():
    async def handler(job_):
        pass

    with pytest.raises(JobRegistrationError, match="isolation='process' is for sync handlers"):
        job("tests.process.async", isolation="process")(handler)
