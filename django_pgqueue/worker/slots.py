"""A fixed set of daemon threads ("slots") that run jobs.

Daemon threads, unlike ``concurrent.futures``' workers, never keep the process alive
after the worker decided to exit: a handler stuck past the shutdown grace period cannot
hold up a deploy. Its job is released or recovered instead.

A job goes to the slot that became idle last. Under a light load one slot runs every
job, with its connection open and its thread warm, while the others stay idle: a job
then never waits for a slot's first connection to the database, and a worker holds a
connection per slot its load needs, not one per slot it has.

A slot keeps the connections its handlers opened while jobs keep coming, and closes
them once it waited ``IDLE_CONNECTION_SECONDS`` for one: an idle worker holds only its
own three connections, whatever its concurrency.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable

from ..exceptions import JobTimeout
from ..sideconn import close_side_connections
from .execution import Outcome, RunningJob, execute, failure_outcome

logger = logging.getLogger("django_pgqueue.worker")

_STOP = object()

#: Seconds a slot waits for a job before it closes the connections its handlers opened
#: (reopened by the next handler that uses the database).
IDLE_CONNECTION_SECONDS = 30.0


def take_unstarted(inbox: queue.SimpleQueue[RunningJob | object]) -> list[RunningJob]:
    """Remove and return the jobs waiting in ``inbox`` for a slot, leaving a stop
    marker (any item that is not a job) where it is, for a slot to find."""
    taken: list[RunningJob] = []
    while True:
        try:
            item = inbox.get_nowait()
        except queue.Empty:
            return taken
        if isinstance(item, RunningJob):
            taken.append(item)
        else:
            inbox.put(item)
            return taken


class _Slot:
    """One slot's thread and the inbox through which it is given its next job."""

    def __init__(self, n: int, pool: SlotPool) -> None:
        self.inbox: queue.SimpleQueue[RunningJob | object] = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=pool._serve, args=(self,), name=f"pgqueue-slot-{n}", daemon=True
        )


class SlotPool:
    """``size`` threads running jobs; each finished job goes to ``on_done``.

    A submitted job goes to the slot idle for the shortest while, or, while every slot
    is busy, waits in the backlog (the worker's prefetch buffer), which a slot that
    finishes drains without waiting for the main loop.
    """

    def __init__(
        self, size: int, alias: str, on_done: Callable[[RunningJob, Outcome], None]
    ) -> None:
        self._alias = alias
        self._on_done = on_done
        self._lock = threading.Lock()
        self._backlog: collections.deque[RunningJob] = collections.deque()
        self._stopping = False
        slots = [_Slot(n, self) for n in range(size)]
        #: Idle slots, the one idle for the shortest while last.
        self._idle = slots[::-1]
        for slot in slots:
            slot.thread.start()

    def submit(self, running: RunningJob) -> None:
        with self._lock:
            if not self._idle:
                self._backlog.append(running)
                return
            slot = self._idle.pop()
        slot.inbox.put(running)

    def take_unstarted(self) -> list[RunningJob]:
        """Remove and return the jobs no slot has started yet (the backlog)."""
        with self._lock:
            taken = list(self._backlog)
            self._backlog.clear()
        return taken

    def stop(self) -> None:
        """Ask the slots to exit once the backlog is drained (busy ones finish first)."""
        with self._lock:
            self._stopping = True
            idle, self._idle = self._idle, []
        for slot in idle:
            slot.inbox.put(_STOP)

    def _next(self, slot: _Slot) -> RunningJob | None:
        """The job a slot that finished one runs next: from the backlog, else the next
        one given to it once idle; None when it is to exit."""
        with self._lock:
            if self._backlog:
                return self._backlog.popleft()
            if self._stopping:
                return None
            self._idle.append(slot)
        return self._wait(slot)

    def _wait(self, slot: _Slot) -> RunningJob | None:
        """Wait for the slot's next job; None when it is to exit. A slot that waited
        ``IDLE_CONNECTION_SECONDS`` closes its connections first."""
        from django.db import connections

        try:
            item = slot.inbox.get(timeout=IDLE_CONNECTION_SECONDS)
        except queue.Empty:
            close_side_connections()
            connections.close_all()
            item = slot.inbox.get()
        if item is _STOP:
            return None
        assert isinstance(item, RunningJob)
        return item

    def _serve(self, slot: _Slot) -> None:
        from django.db import connections

        try:
            running = self._wait(slot)
            while running is not None:
                try:
                    outcome = execute(running, self._alias)
                except JobTimeout as exc:
                    # Delivered between the handler's return and the end of execute().
                    outcome = failure_outcome(running, exc)
                self._on_done(running, outcome)
                running = self._next(slot)
        finally:
            close_side_connections()
            connections.close_all()
