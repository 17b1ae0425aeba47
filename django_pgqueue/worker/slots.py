"""A fixed set of daemon threads ("slots") that run jobs.

Daemon threads, unlike ``concurrent.futures``' workers, never keep the process alive
after the worker decided to exit: a handler stuck past the shutdown grace period cannot
hold up a deploy. Its job is released or recovered instead.

Jobs wait in one backlog, which a slot that finishes a job takes the next from. A
job submitted while slots are idle wakes the slot that became idle last: under a light
load one slot runs every job, with its connection open and its thread warm, while the
others stay idle. A job then never waits for a slot's first connection to the database,
and a worker holds a connection per slot its load needs, not one per slot it has. One
slot is woken at a time, the next by the one woken if jobs are left for it: a batch
submitted at once would otherwise wake every idle slot to race for the GIL (measured:
a drain 7 to 11 % slower, with twice the context switches).

A slot keeps the connections its handlers opened while jobs keep coming, and closes
them once it waited ``IDLE_CONNECTION_SECONDS`` for one: an idle worker holds only its
own two connections (the main loop's and the listener's), whatever its concurrency.
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
_WAKE = object()

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
    """One slot's thread and the inbox through which it is woken."""

    def __init__(self, n: int, pool: SlotPool) -> None:
        self.inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=pool._serve, args=(self,), name=f"pgqueue-slot-{n}", daemon=True
        )


class SlotPool:
    """``size`` threads running jobs; each finished job goes to ``on_done``.

    Submitted jobs wait in the backlog (the worker's prefetch buffer) for the first slot
    free to take one: a busy slot that finishes takes the next without waiting for the
    main loop. Jobs are not bound to the slot woken for them: whichever slot is free
    first takes each.
    """

    def __init__(
        self, size: int, alias: str, on_done: Callable[[RunningJob, Outcome], None]
    ) -> None:
        self._alias = alias
        self._on_done = on_done
        self._lock = threading.Lock()
        self._backlog: collections.deque[RunningJob] = collections.deque()
        #: Idle slots, the one idle for the shortest while last.
        self._idle: list[_Slot] = []
        #: Whether a slot was woken and has not looked at the backlog yet: the next one
        #: is woken by it, if jobs are left (one wake-up at a time, as a batch of jobs
        #: submitted at once would otherwise wake every idle slot to race for the GIL).
        self._waking = False
        self._stopping = False
        for n in range(size):
            _Slot(n, self).thread.start()

    def submit(self, running: RunningJob) -> None:
        self._backlog.append(running)
        # Without the lock while no slot is idle (a drain's case). A slot going idle
        # puts itself on the idle list before it looks at the backlog (``_next()``), so
        # either it finds this job or this finds it idle: appends and reads of the
        # deque and the list are atomic, and ordered between threads.
        if self._idle and not self._waking:
            with self._lock:
                slot = self._wake_one()
            if slot is not None:
                slot.inbox.put(_WAKE)

    def _wake_one(self) -> _Slot | None:
        """Under the lock: the idle slot to wake for the backlog, if any (none while
        another woken slot is on its way)."""
        if self._waking or not self._idle or not self._backlog:
            return None
        self._waking = True
        return self._idle.pop()

    def take_unstarted(self) -> list[RunningJob]:
        """Remove and return the jobs no slot has started yet (the backlog)."""
        taken = []
        while True:
            try:  # one at a time: a slot may take one meanwhile, never both
                taken.append(self._backlog.popleft())
            except IndexError:
                return taken

    def stop(self) -> None:
        """Ask the slots to exit once the backlog is drained (busy ones finish first)."""
        with self._lock:
            self._stopping = True
            idle, self._idle = self._idle, []
        for slot in idle:
            slot.inbox.put(_STOP)

    def _next(self, slot: _Slot, woken: bool = False) -> RunningJob | None:
        """The next job for ``slot``: from the backlog, waiting idle until there is
        one; None when the slot is to exit."""
        while True:
            if not woken:
                try:  # a busy slot takes the next job without the lock
                    return self._backlog.popleft()
                except IndexError:
                    pass
            running = following = None
            with self._lock:
                if woken:
                    self._waking = False
                # On the idle list before looking at the backlog: see submit().
                self._idle.append(slot)
                try:
                    running = self._backlog.popleft()
                except IndexError:
                    if self._stopping:
                        self._idle.pop()
                        return None
                else:
                    self._idle.pop()  # this slot: only the lock's holder changes the list
                    following = self._wake_one()
            if following is not None:
                following.inbox.put(_WAKE)
            if running is not None:
                return running
            if self._wait(slot) is _STOP:
                return None
            woken = True

    def _wait(self, slot: _Slot) -> object:
        """Wait to be woken (``_WAKE``) or stopped (``_STOP``). A slot that waited
        ``IDLE_CONNECTION_SECONDS`` closes its connections first."""
        from django.db import connections

        try:
            return slot.inbox.get(timeout=IDLE_CONNECTION_SECONDS)
        except queue.Empty:
            close_side_connections()
            connections.close_all()
            return slot.inbox.get()

    def _serve(self, slot: _Slot) -> None:
        from django.db import connections

        try:
            while (running := self._next(slot)) is not None:
                try:
                    outcome = execute(running, self._alias)
                except JobTimeout as exc:
                    # Delivered between the handler's return and the end of execute().
                    outcome = failure_outcome(running, exc)
                self._on_done(running, outcome)
        finally:
            close_side_connections()
            connections.close_all()
