"""A fixed set of daemon threads ("slots") that run jobs.

Daemon threads, unlike ``concurrent.futures``' workers, never keep the process alive
after the worker decided to exit: a handler stuck past the shutdown grace period cannot
hold up a deploy. Its job is released or recovered instead.

A slot keeps the connections its handlers opened while jobs keep coming, and closes
them once it waited ``IDLE_CONNECTION_SECONDS`` for one: an idle worker holds only its
own three connections, whatever its concurrency.
"""

from __future__ import annotations

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


class SlotPool:
    """``size`` threads taking jobs from a queue; each finished job goes to ``on_done``.

    Jobs submitted while every slot is busy wait in the queue: the worker's prefetch
    buffer, which a free slot drains without waiting for the main loop.
    """

    def __init__(
        self, size: int, alias: str, on_done: Callable[[RunningJob, Outcome], None]
    ) -> None:
        self._alias = alias
        self._on_done = on_done
        self._inbox: queue.SimpleQueue[RunningJob | object] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"pgqueue-slot-{n}", daemon=True)
            for n in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, running: RunningJob) -> None:
        self._inbox.put(running)

    def take_unstarted(self) -> list[RunningJob]:
        """Remove and return the jobs no slot has started yet (the prefetch buffer)."""
        return take_unstarted(self._inbox)

    def stop(self) -> None:
        """Ask idle slots to exit once the queue is drained (busy ones finish first)."""
        for _ in self._threads:
            self._inbox.put(_STOP)

    def _serve(self) -> None:
        from django.db import connections

        try:
            while True:
                try:
                    item = self._inbox.get(timeout=IDLE_CONNECTION_SECONDS)
                except queue.Empty:
                    close_side_connections()
                    connections.close_all()
                    item = self._inbox.get()
                if item is _STOP:
                    return
                assert isinstance(item, RunningJob)
                try:
                    outcome = execute(item, self._alias)
                except JobTimeout as exc:
                    # Delivered between the handler's return and the end of execute().
                    outcome = failure_outcome(item, exc)
                self._on_done(item, outcome)
        finally:
            close_side_connections()
            connections.close_all()
