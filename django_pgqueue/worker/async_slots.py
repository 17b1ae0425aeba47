"""Async handlers: one event loop, in a thread of its own, runs up to ``size`` of them
at once, beside the thread slots of sync handlers.

The main loop hands jobs over with ``submit()`` and gets each outcome through
``on_done``, as from thread slots. What holds:

- Every job submitted ends in one call of ``on_done``, unless ``take_unstarted()`` took
  it back first or the worker gave up on it (its outcome was then recorded otherwise).
- Cancellation, whoever asks (the heartbeat thread relaying a request, a shutdown past
  its grace period), reaches the handler as ``asyncio.CancelledError``: the job's cancel
  flag cancels its task. A timeout does too, through ``asyncio.timeout``.
- Heartbeats run in their own thread, so a handler that blocks the loop delays the other
  async jobs but never the heartbeat. A watchdog thread logs such a handler, by job id.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from .. import conf, signals, steps, tracing
from ..exceptions import JobTimeout
from ..sideconn import close_side_connections
from .execution import (
    CANCELLED,
    COMPLETED,
    PENDING,
    Outcome,
    RunningJob,
    end_span,
    failure_outcome,
    handed_back,
    log_receiver_errors,
    mark_started,
    result_json,
    signalled_failure,
)

logger = logging.getLogger("django_pgqueue.worker")

#: Seconds the loop may go without running its tick before the watchdog says which job
#: blocks it.
BLOCKED_LOOP_WARNING = 0.5
#: Seconds between the loop's ticks (and the watchdog's checks).
TICK = 0.1


class AsyncSlots:
    """An event loop in a daemon thread running at most ``size`` async handlers at once.

    Jobs submitted while ``size`` are running wait in a buffer, in order, that the loop
    drains as handlers finish.
    """

    def __init__(self, size: int, on_done: Callable[[RunningJob, Outcome], None]) -> None:
        self._size = size
        self._on_done = on_done
        self._lock = threading.Lock()
        self._waiting: collections.deque[RunningJob] = collections.deque()
        self._wake_pending = False
        self._tasks: dict[asyncio.Task[None], RunningJob] = {}
        self._stopping = threading.Event()
        self._last_tick = time.monotonic()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="pgqueue-event-loop", daemon=True)
        self._watchdog = threading.Thread(
            target=self._watch, name="pgqueue-loop-watchdog", daemon=True
        )
        self._thread.start()
        self._watchdog.start()

    # -- called from the main loop ----------------------------------------------------

    def submit(self, running: RunningJob) -> None:
        """Run ``running`` as soon as one of the ``size`` places is free."""
        with self._lock:
            self._waiting.append(running)
            if self._wake_pending:
                return  # one wake-up starts every job submitted before it runs
            self._wake_pending = True
        self._call_soon(self._start_waiting)

    def take_unstarted(self) -> list[RunningJob]:
        """Remove and return the jobs waiting for a place (none of them started)."""
        with self._lock:
            taken = list(self._waiting)
            self._waiting.clear()
        return taken

    def stop(self, wait: float = 2.0) -> None:
        """Cancel the handlers still running (their jobs were handed back or recorded
        already), end the loop, and wait up to ``wait`` seconds for its thread."""
        self._stopping.set()
        self._call_soon(self._cancel_all)
        self._thread.join(timeout=wait)
        self._watchdog.join(timeout=wait)

    # -- the loop's thread --------------------------------------------------------------

    def _call_soon(self, callback: Callable[[], object]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker exits
            self.loop.call_soon_threadsafe(callback)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        try:
            self.loop.run_forever()
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    def _tick(self) -> None:
        self._last_tick = time.monotonic()
        if not self._stopping.is_set():
            self.loop.call_later(TICK, self._tick)

    def _start_waiting(self) -> None:
        with self._lock:
            self._wake_pending = False
            if self._stopping.is_set():
                return
            while len(self._tasks) < self._size and self._waiting:
                self._begin(self._waiting.popleft())

    def _begin(self, running: RunningJob) -> None:
        task = self.loop.create_task(self._run(running), name=f"pgqueue job {running.job.id}")
        self._tasks[task] = running

    async def _run(self, running: RunningJob) -> None:
        task = asyncio.current_task()
        assert task is not None
        # Attached once the task runs: a task cancelled before its first step would end
        # without running any of this. A flag set before it sees no callback, and
        # aexecute() then finds the flag set and never calls the handler.
        running.cancel_event.on_set = lambda: self._call_soon(task.cancel)
        try:
            outcome = await aexecute(running)
        except BaseException as exc:  # cancelled between the handler's end and ours
            outcome = failure_outcome(running, exc)
        finally:
            running.cancel_event.on_set = None
            with self._lock:
                self._tasks.pop(task, None)
        self._on_done(running, outcome)
        self._start_waiting()

    def _cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.loop.create_task(self._stop_when_done())

    async def _stop_when_done(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)
        # Handlers' async ORM calls ran in asgiref's thread for sync code: close the
        # connections they opened there (bounded: that thread may be stuck in one).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sync_to_async(_close_connections)(), timeout=1.0)
        self.loop.stop()

    # -- the watchdog's thread ----------------------------------------------------------

    def _watch(self) -> None:
        warned_at: float | None = None
        while not self._stopping.wait(TICK):
            last_tick = self._last_tick
            blocked = time.monotonic() - last_tick
            if blocked < BLOCKED_LOOP_WARNING:
                warned_at = None
            elif warned_at != last_tick:
                warned_at = last_tick
                self._warn_blocked(blocked)

    def _warn_blocked(self, seconds: float) -> None:
        running = self._running_now()
        culprit = (
            f"job {running.job.id} ({running.job.job_type})"
            if running is not None
            else "an async handler"
        )
        logger.warning(
            "%s has blocked the event loop for %.1fs; the worker's other async jobs "
            "wait meanwhile. Await its slow calls, or run blocking code through "
            "asgiref.sync.sync_to_async",
            culprit,
            seconds,
        )

    def _running_now(self) -> RunningJob | None:
        """The job whose handler the loop is running now, if Python can tell."""
        try:
            task = asyncio.current_task(self.loop)
        except RuntimeError:
            return None
        with self._lock:
            return self._tasks.get(task) if task is not None else None


async def aexecute(running: RunningJob) -> Outcome:
    """Run the async handler of ``running`` on this loop and return its outcome."""
    if not conf.get_settings().OPENTELEMETRY:
        return await _aexecute(running)
    with tracing.run_span(running.job) as span:  # current in this task only
        outcome = await _aexecute(running)
        end_span(span, outcome)
        return outcome


async def _aexecute(running: RunningJob) -> Outcome:
    job = running.job
    definition = running.definition
    assert definition is not None and definition.is_async
    if running.cancel_event.is_set():
        return Outcome(job.id, CANCELLED, job.claimed_at, error="cancelled before it started")
    if running.too_late_to_start():
        return handed_back(running)
    mark_started(running)
    assert running.started_monotonic is not None
    await _asend(signals.job_started, job)
    timer = asyncio.timeout(running.timeout)
    try:
        try:
            async with timer:
                value = await definition(job)
        finally:
            running.duration = time.monotonic() - running.started_monotonic
            if steps.unsettled(job):
                await asyncio.to_thread(steps.settle, job)
    except BaseException as exc:  # even SystemExit must not end the loop
        if isinstance(exc, TimeoutError) and timer.expired():
            exc = JobTimeout(f"ran past its timeout of {running.timeout:g}s")
        outcome = failure_outcome(running, exc)
        if signalled_failure(outcome):
            await _asend(
                signals.job_failed,
                job,
                error=outcome.error,
                exception=exc,
                will_retry=outcome.status == PENDING,
            )
        return outcome
    await _asend(signals.job_completed, job, result=value)
    result, note = result_json(value)
    return Outcome(job.id, COMPLETED, job.claimed_at, result=result, error=note)


def _close_connections() -> None:
    close_side_connections()
    connections.close_all()


async def _asend(signal: Any, job: Any, **kwargs: Any) -> None:
    """Send a worker signal from the loop: sync receivers run in a thread (they may use
    the ORM); a receiver's error is logged, never lets a job be lost."""
    if not signal.receivers or not signal.has_listeners(type(job)):
        return
    log_receiver_errors(await signal.asend_robust(sender=type(job), job=job, **kwargs), job)
