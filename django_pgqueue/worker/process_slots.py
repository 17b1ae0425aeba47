"""Process isolation: each slot runs its jobs in a child process of its own, which a
timeout or a cancellation kills for real.

A slot is a thread of the worker that owns one child (worker/child.py): it sends the
child a job, then watches it until the outcome comes back, the job's timeout passes,
cancellation is asked, or the child dies. What holds:

- Every job a slot takes ends in one call of ``on_done``: the child's outcome, or one
  the slot writes when it killed the child (timeout: a failed attempt, retried by the
  job's policy; cancellation: ``cancelled``) or found it dead (a failed attempt whose
  error says how it died: a signal such as ``SIGSEGV`` or ``SIGKILL``, or an exit
  status).
- A killed or dead child is replaced before the slot's next job; so is one that ran
  ``max_jobs_per_child`` jobs or whose peak memory passed ``max_memory_per_child``
  (recycling, as Celery's ``--max-tasks-per-child`` and ``--max-memory-per-child``).
  A child found holding more than ``max_memory_per_child`` while its job runs is
  killed, and the attempt fails with a ``MemoryError``.
- Killing is ``SIGUSR1`` (the child exits, running the handler's ``finally`` blocks),
  then ``SIGKILL`` after ``KILL_GRACE`` seconds.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from django.db import connections

from ..logfields import job_fields
from . import child as child_module
from .execution import CANCELLED, Outcome, RunningJob, handed_back, retry_or_fail
from .slots import take_unstarted

logger = logging.getLogger("django_pgqueue.worker")

#: Seconds a child asked to exit (SIGUSR1) gets before SIGKILL.
KILL_GRACE = 5.0
#: Seconds a new child may take to set Django up and say it is ready.
START_TIMEOUT = 120.0
#: How often a slot looks at its running job's deadline and cancellation.
WATCH_INTERVAL = 0.05
#: How often a slot reads its running child's memory, with ``max_memory_per_child``.
MEMORY_CHECK_INTERVAL = 0.25

_STOP = object()


class ChildStartError(Exception):
    """A child process did not come up."""


class ProcessSlots:
    """``size`` slots, each running jobs in a child process of its own.

    Jobs submitted while every slot is busy wait in a queue, as for thread slots.
    """

    def __init__(
        self,
        size: int,
        alias: str,
        on_done: Callable[[RunningJob, Outcome], None],
        *,
        max_jobs_per_child: int | None = None,
        max_memory_per_child: int | None = None,
    ) -> None:
        self._alias = alias
        self._on_done = on_done
        self._inbox: queue.SimpleQueue[RunningJob | object] = queue.SimpleQueue()
        self._context = multiprocessing.get_context("spawn")
        # Read in this thread: a child must use the database its worker claims from.
        self._database_settings = {
            name: dict(connections[name].settings_dict) for name in connections
        }
        self._slots = [
            _Slot(self, n, max_jobs_per_child, max_memory_per_child) for n in range(size)
        ]
        for slot in self._slots:
            slot.start()

    def submit(self, running: RunningJob) -> None:
        self._inbox.put(running)

    def take_unstarted(self) -> list[RunningJob]:
        """Remove and return the jobs no slot has started yet."""
        return take_unstarted(self._inbox)

    def stop(self, wait: float = KILL_GRACE + 1) -> None:
        """Let each slot finish its job, stop its child and exit; wait up to ``wait``."""
        for _ in self._slots:
            self._inbox.put(_STOP)
        deadline = time.monotonic() + wait
        for slot in self._slots:
            slot.join(timeout=max(deadline - time.monotonic(), 0))

    def spawn_child(self) -> tuple[BaseProcess, Connection]:
        """Start a child and wait until it is ready."""
        ours, theirs = self._context.Pipe()
        process = self._context.Process(
            target=child_module.serve,
            args=(theirs, self._database_settings, self._alias, os.getpid()),
            name="pgqueue-child",
            daemon=True,
        )
        process.start()
        theirs.close()
        if not ours.poll(START_TIMEOUT):
            _kill(process)
            raise ChildStartError(f"no word from the child within {START_TIMEOUT:g}s")
        try:
            message = ours.recv()
        except EOFError:
            process.join(1)
            raise ChildStartError(f"it {_how_it_ended(process.exitcode)}") from None
        if message != child_module.READY:
            _kill(process)
            raise ChildStartError(f"it said {message!r}")
        return process, ours


class _Slot(threading.Thread):
    def __init__(
        self,
        pool: ProcessSlots,
        number: int,
        max_jobs: int | None,
        max_memory: int | None,
    ) -> None:
        super().__init__(name=f"pgqueue-process-slot-{number}", daemon=True)
        self._pool = pool
        self._max_jobs = max_jobs
        self._max_memory = max_memory
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._jobs_run = 0
        self._next_memory_check = 0.0

    def run(self) -> None:
        try:
            while True:
                item = self._pool._inbox.get()
                if item is _STOP:
                    return
                assert isinstance(item, RunningJob)
                self._pool._on_done(item, self._run(item))
        finally:
            self._retire()

    def _run(self, running: RunningJob) -> Outcome:
        job = running.job
        if running.cancel_event.is_set():
            return Outcome(job.id, CANCELLED, job.claimed_at, error="cancelled before it started")
        if running.too_late_to_start():
            return handed_back(running)
        try:
            process, conn = self._child()
        except ChildStartError as exc:
            logger.error(
                "could not start a child process for job %s: %s",
                job.id,
                exc,
                extra=job_fields(job),
            )
            return retry_or_fail(
                running, f"ChildProcessError: the child process did not start: {exc}", "", None
            )
        running.started_wall = time.time()
        running.started_monotonic = time.monotonic()
        # First read one interval in: a test (or a job) that allocates and returns at
        # once is never caught between two of its own statements by chance.
        self._next_memory_check = running.started_monotonic + MEMORY_CHECK_INTERVAL
        timeout = running.timeout
        deadline = None if not timeout else running.started_monotonic + timeout
        conn.send((job, running.buffered))
        while True:
            if conn.poll(WATCH_INTERVAL):
                return self._received(running, process, conn)
            if running.cancel_event.is_set():
                self._kill(f"job {job.id} was cancelled")
                return Outcome(
                    job.id, CANCELLED, job.claimed_at, error="cancelled: its process was killed"
                )
            if self._over_memory(process):
                limit = (self._max_memory or 0) >> 20
                self._kill(f"job {job.id} took its process past {limit} MiB")
                return retry_or_fail(
                    running,
                    f"MemoryError: its process went past the memory limit of {limit} MiB "
                    "(--max-memory-per-child) and was killed",
                    "",
                    None,
                )
            if deadline is not None and time.monotonic() >= deadline:
                self._kill(f"job {job.id} ran past its timeout of {timeout:g}s")
                return retry_or_fail(
                    running,
                    f"JobTimeout: ran past its timeout of {timeout:g}s; its process was killed",
                    "",
                    None,
                )
            if not process.is_alive():
                return self._died(running, process)

    def _over_memory(self, process: BaseProcess) -> bool:
        """Whether the running child holds more than ``max_memory_per_child`` now (read
        from /proc every ``MEMORY_CHECK_INTERVAL`` seconds of its job; Linux only)."""
        if self._max_memory is None or process.pid is None:
            return False
        now = time.monotonic()
        if now < self._next_memory_check:
            return False
        self._next_memory_check = now + MEMORY_CHECK_INTERVAL
        resident = _resident_memory(process.pid)
        return resident is not None and resident > self._max_memory

    def _received(self, running: RunningJob, process: BaseProcess, conn: Connection) -> Outcome:
        try:
            outcome, duration, peak_memory = conn.recv()
        except (EOFError, OSError):
            process.join(1)
            return self._died(running, process)
        running.duration = duration
        self._jobs_run += 1
        if self._max_jobs is not None and self._jobs_run >= self._max_jobs:
            logger.info("recycling a child process after %d job(s)", self._jobs_run)
            self._retire()
        elif self._max_memory is not None and peak_memory > self._max_memory:
            logger.info(
                "recycling a child process: it held %d MiB, more than the %d MiB allowed",
                peak_memory >> 20,
                self._max_memory >> 20,
            )
            self._retire()
        assert isinstance(outcome, Outcome)
        return outcome

    def _died(self, running: RunningJob, process: BaseProcess) -> Outcome:
        process.join(1)
        how = _how_it_ended(process.exitcode)
        self._forget()  # the outcome's record says how it ended (_log_outcome)
        return retry_or_fail(
            running, f"ChildProcessError: the process running the handler {how}", "", None
        )

    def _child(self) -> tuple[BaseProcess, Connection]:
        if self._process is None or self._conn is None or not self._process.is_alive():
            self._forget()
            self._process, self._conn = self._pool.spawn_child()
            self._jobs_run = 0
        return self._process, self._conn

    def _kill(self, why: str) -> None:
        logger.warning("%s: killing its process", why)
        if self._process is not None:
            _kill(self._process)
        self._forget()

    def _retire(self) -> None:
        """Let the child exit between jobs (recycling, or the worker stopping)."""
        if self._conn is not None and self._process is not None:
            try:
                self._conn.send(child_module.STOP)
                self._process.join(KILL_GRACE)
            except (OSError, ValueError):
                pass
            if self._process.is_alive():
                _kill(self._process)
        self._forget()

    def _forget(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None


def _kill(process: BaseProcess) -> None:
    """SIGUSR1 (the child exits), then SIGKILL after ``KILL_GRACE`` seconds."""
    if process.pid is None or not process.is_alive():
        return
    try:
        os.kill(process.pid, signal.SIGUSR1)
    except ProcessLookupError:
        return
    process.join(KILL_GRACE)
    if process.is_alive():
        process.kill()
        process.join(KILL_GRACE)


def _resident_memory(pid: int) -> int | None:
    """The memory process ``pid`` holds now, in bytes (``VmRSS``; None off Linux)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        name = signal.Signals(-exitcode).name
        if -exitcode == signal.SIGKILL:
            return (
                f"was killed by {name} (sent by the kernel's OOM killer when memory runs out, "
                "or by hand)"
            )
        return f"was killed by {name}"
    return f"exited with status {exitcode}"
