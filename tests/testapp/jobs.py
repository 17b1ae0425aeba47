"""Handlers the test suite enqueues; discovered through autodiscovery of ``jobs`` modules."""

import os
import signal
import threading
import time
from collections import defaultdict

import psycopg
from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from django_pgqueue import Backoff, FailJob, RetryJob, Snooze, job

from .models import Execution

NO_BACKOFF = Backoff(base=0.05, max=0.1, jitter=False)


@job("tests.noop")
def noop(job):
    return None


@job("tests.record", priority=150)
def record(job):
    """Record the execution, then sleep ``data['sleep']`` seconds."""
    _record_execution(job)


@job("tests.durable", max_attempts=50, retry_backoff=NO_BACKOFF)
def durable(job):
    """``tests.record`` with attempts to spare: fault tests cut connections under it,
    which fails attempts, and want every job completed in the end (tests/faults/)."""
    _record_execution(job)


@job("tests.loses_its_job_batched", max_attempts=3, effectively_once=False)
def loses_its_job_batched(job):
    """``tests.loses_its_job``, its completion left to the worker's next batch."""
    loses_its_job(job)


@job("tests.dies_after_commit", max_attempts=3)
def dies_after_commit(job):
    """Record the execution, then end the worker's process the moment the handler's
    transaction has committed, before the worker can write anything else."""
    _record_execution(job)
    transaction.on_commit(lambda: os._exit(17))


@job("tests.loses_its_job", max_attempts=3)
def loses_its_job(job):
    """Record the execution; meanwhile, recovery gives the job to worker ``other``
    (written from another connection, as recovery would)."""
    _record_execution(job)
    with psycopg.connect(job.data["database_url"], autocommit=True) as other:
        other.execute(
            "UPDATE pgqueue_jobs SET worker_id = 'other', attempts = attempts + 1 WHERE id = %s",
            [job.id],
        )


def _record_execution(job):
    started = timezone.now()
    time.sleep(job.data.get("sleep", 0))
    Execution.objects.create(
        job_id=job.id,
        worker_id=job.worker_id,
        attempt=job.attempts,
        started_at=started,
        finished_at=timezone.now(),
    )


async def _record_execution_async(job):
    await sync_to_async(_record_execution)(job)


@job("tests.returns_coroutine", max_attempts=2, retry_backoff=NO_BACKOFF)
def returns_coroutine(job):
    """Records an execution, then returns a coroutine (what an ``async def`` handler
    returns): the worker must fail the attempt, roll the record back and never run the
    coroutine's body."""
    _record_execution(job)
    return _record_execution_async(job)


class _Awaitable:
    def __await__(self):
        yield


@job("tests.returns_awaitable", max_attempts=1)
def returns_awaitable(job):
    return _Awaitable()


@job("tests.fail", max_attempts=3, retry_backoff=NO_BACKOFF)
def always_fail(job):
    raise RuntimeError(f"boom on attempt {job.attempts}")


@job("tests.fail_now", retry_backoff=NO_BACKOFF)
def fail_now(job):
    raise FailJob("the input is unusable")


@job("tests.retry_later", max_attempts=5)
def retry_later(job):
    if job.attempts < 2:
        raise RetryJob("not ready yet", delay=job.data.get("delay", 0.3))


@job("tests.snooze", max_attempts=1)
def snooze(job):
    """Snooze ``data['times']`` times for ``data['delay']`` seconds, then record the
    execution."""
    if job.snoozes < job.data.get("times", 1):
        raise Snooze(job.data.get("delay", 0))
    _record_execution(job)


@job("tests.progress")
def progress(job):
    for step in range(1, 5):
        job.set_progress(step * 25, f"step {step}")
        time.sleep(job.data.get("sleep", 0))


@job("tests.sleep", timeout=1, max_attempts=1)
def sleeper(job):
    time.sleep(job.data.get("sleep", 5))


@job("tests.naps", atomic=False)
def naps(job):
    """A durable sleep of ``data["sleep"]`` seconds (tests/faults/test_clock_skew.py)."""
    job.sleep("nap", job.data["sleep"])
    return "rested"


@job("tests.db_sleeps", atomic=False)
def db_sleeps(job):
    """Wait ``data["sleep"]`` seconds in the database (``pg_sleep``), not in Python:
    under libfaketime, Python's ``time.sleep`` fails (tests/faults/test_clock_skew.py).
    ``data["step"]``: run a plain durable step first."""
    from django.db import connection

    if job.data.get("step"):
        job.step("before the sleep", int, 1)

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [job.data["sleep"]])


@job("tests.cancellable")
def cancellable(job):
    deadline = time.monotonic() + job.data.get("max_seconds", 10)
    while time.monotonic() < deadline:
        job.raise_if_cancel_requested()
        time.sleep(0.05)


@job("tests.busy", timeout=0.5, max_attempts=1)
def busy(job):
    """Pure-Python loop: the timeout interruption reaches it promptly."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pass


@job("tests.backoff", max_attempts=3, retry_backoff=Backoff(base=0.4, factor=2, jitter=False))
def fails_with_growing_backoff(job):
    raise ValueError(f"attempt {job.attempts} failed")


@job("tests.returns")
def returns_value(job):
    return {"doubled": job.data["n"] * 2}


@job("tests.accumulate")
def accumulate(job):
    """Add ``data['n']`` to the totals of the jobs it depends on (a workflow's step)."""
    earlier = [result["total"] for result in job.dependency_results().values() if result]
    return {"total": sum(earlier) + job.data.get("n", 0), "seen": earlier}


@job("tests.exits", max_attempts=1)
def exits(job):
    raise SystemExit(3)


#: What ``tests.echo`` saw, by job id: the payload and times its handler was given.
ECHOED: dict[str, dict] = {}


@job("tests.echo", max_attempts=1)
def echo(job):
    """Keep what the handler was given, for tests of what round-trips through a worker."""
    ECHOED[str(job.id)] = {"data": job.data, "run_at": job.run_at, "queue": job.queue}


# A job type with a per-key limit declares it to every worker: only the tests of per-key
# limits register it (and worker processes they start, through the environment).
if os.environ.get("PGQUEUE_TEST_KEYED_JOBS"):
    from . import keyed_jobs  # noqa: F401
# The same for a job type with a per-key rate.
if os.environ.get("PGQUEUE_TEST_RATED_JOBS"):
    from . import rated_jobs  # noqa: F401
# An async job type makes every worker start its event loop: only the tests of async
# workers in separate processes register it (tests/faults/test_async_worker_crash.py).
if os.environ.get("PGQUEUE_TEST_ASYNC_JOBS"):
    from . import async_jobs

    async_jobs.register()
# The same for process-isolated job types (tests/test_worker_process_isolation.py).
if os.environ.get("PGQUEUE_TEST_PROCESS_JOBS"):
    from . import process_jobs

    process_jobs.register()


@job("tests.steps.crash_after_step", max_attempts=3, retry_backoff=NO_BACKOFF, atomic=False)
def crash_after_step(job):
    """An atomic step that records an execution; then, on the first attempt when
    ``data['crash']``, the worker process dies at once (SIGKILL), right after the step
    committed (tests/test_steps.py). The handler is not atomic: each atomic step commits
    as it ends."""
    job.step("record", _record_execution, job, atomic=True)
    if job.attempts == 1 and job.data.get("crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    return "done"


def _record_step(job, label):
    """A row of ``testapp_execution`` for one run of a step's function, its worker id
    ``label`` (tests/faults/test_steps_crash.py counts them)."""
    now = timezone.now()
    Execution.objects.create(
        job_id=job.id, worker_id=label, attempt=job.attempts, started_at=now, finished_at=now
    )


@job("tests.stepped", max_attempts=50, retry_backoff=NO_BACKOFF, atomic=False)
def stepped(job):
    """Three durable steps, the middle one atomic, each writing a row when its function
    runs: the fault suite kills workers under it (tests/faults/test_steps_crash.py)."""
    job.step("first", _record_step, job, "step:first")
    job.step("middle", _record_step, job, "step:middle", atomic=True)
    job.step("last", _record_step, job, "step:last")


@job("tests.poison", max_attempts=3)
def poison(job):
    """Kills the worker process that runs it, every time (tests/faults/test_poison_job.py)."""
    os._exit(1)


@job("tests.holds_io", atomic=False, max_attempts=5)
def holds_io(job):
    """Append ``<worker id> <time.time()>`` to the file ``data['marks']`` when it starts
    and every 20 ms while it waits in I/O, for ``data['sleep']`` seconds: the file, outside
    the database, tells when each run's handler was alive."""
    end = time.monotonic() + job.data.get("sleep", 30)
    while time.monotonic() < end:
        with open(job.data["marks"], "a") as marks:
            marks.write(f"{job.worker_id} {time.time()}\n")
        time.sleep(0.02)


#: tests/test_worker_reclaimed.py: each attempt of ``tests.gated*`` sets its number's
#: ``gate_reached`` event, then waits until the test sets its ``gate_open`` one.
gate_reached: defaultdict[int, threading.Event] = defaultdict(threading.Event)
gate_open: defaultdict[int, threading.Event] = defaultdict(threading.Event)
#: Whether each attempt was asked to stop by the time its gate opened.
gate_cancel_requested: dict[int, bool] = {}


def _pass_gate(job):
    gate_reached[job.attempts].set()
    if not gate_open[job.attempts].wait(timeout=30):
        raise RuntimeError(f"attempt {job.attempts}'s gate never opened")
    gate_cancel_requested[job.attempts] = job.is_cancel_requested()


@job("tests.gated", max_attempts=5, retry_backoff=NO_BACKOFF, atomic=False)
def gated(job):
    """Pass the gate of this attempt, then end as ``data['then']`` says: ``"return"``
    (completed), ``"result"`` (completed with the attempt's number) or ``"raise"``
    (retried)."""
    _pass_gate(job)
    if job.data["then"] == "raise":
        raise RuntimeError(f"attempt {job.attempts} failed")
    return job.attempts if job.data["then"] == "result" else None


@job("tests.gated_atomic", max_attempts=5, retry_backoff=NO_BACKOFF)
def gated_atomic(job):
    """Pass the gate, then record the execution: completed in the handler's transaction."""
    _pass_gate(job)
    _record_execution(job)
