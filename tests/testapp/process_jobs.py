"""Process-isolated job types for the tests of process isolation. Registered by
``register()``: by those tests, and by the child processes of their workers, which
inherit ``PGQUEUE_TEST_PROCESS_JOBS`` (see jobs.py). Registered for every test, they
would make every worker start child processes."""

import ctypes
import os
import signal
import time

from django_pgqueue import Backoff, job

NO_BACKOFF = Backoff(base=0.05, max=0.1, jitter=False)


def pid(job):
    """Return the process id: a child's, not the worker's."""
    return os.getpid()


def hangs(job):
    """Sleep for an hour with SIGUSR1 blocked: only SIGKILL ends it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    time.sleep(3600)


def sleeps(job):
    """Sleep for an hour (SIGUSR1 ends it)."""
    time.sleep(3600)


def exits(job):
    os._exit(3)


def raises(job):
    raise ValueError(f"broken in process {os.getpid()}")


def segfaults(job):
    ctypes.string_at(0)


def killed(job):
    """End as the kernel's OOM killer ends a process: SIGKILL."""
    os.kill(os.getpid(), signal.SIGKILL)


def allocates(job):
    """Hold ``data['mib']`` MiB for ``data['hold']`` seconds (default 0), then return the
    process id."""
    block = b"x" * (job.data["mib"] << 20)
    time.sleep(job.data.get("hold", 0))
    del block
    return os.getpid()


def hogs(job):
    """Hold ``data['mib']`` MiB for ten seconds."""
    block = b"x" * (job.data["mib"] << 20)
    time.sleep(10)
    return len(block)


def durable_process(job):
    """``tests.durable`` in a child process (tests/faults/test_process_worker_crash.py)."""
    from .jobs import _record_execution

    _record_execution(job)


def steps(job):
    """A step in a child process: its first attempt fails after the step, the second
    returns the step's stored result (the first child's pid)."""
    first = job.step("pid", os.getpid)
    if job.attempts == 1:
        raise RuntimeError("fails after its step")
    return first


def register():
    job("tests.process.pid", isolation="process")(pid)
    job("tests.process.plain_pid")(pid)  # no isolation: in a thread, but with --pool process
    job("tests.process.hangs", isolation="process", timeout=0.5, max_attempts=1)(hangs)
    job("tests.process.sleeps", isolation="process")(sleeps)
    job("tests.process.exits", isolation="process", max_attempts=2, retry_backoff=NO_BACKOFF)(exits)
    job("tests.process.segfaults", isolation="process", max_attempts=1)(segfaults)
    job("tests.process.raises", isolation="process", max_attempts=1)(raises)
    job("tests.process.killed", isolation="process", max_attempts=1)(killed)
    job("tests.process.allocates", isolation="process")(allocates)
    job("tests.process.hogs", isolation="process", max_attempts=1)(hogs)
    job("tests.process.steps", isolation="process", max_attempts=2, retry_backoff=NO_BACKOFF)(steps)
    job("tests.durable_process", isolation="process", max_attempts=50, retry_backoff=NO_BACKOFF)(
        durable_process
    )
