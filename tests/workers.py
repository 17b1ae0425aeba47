"""Helpers to run workers from tests: in a thread of the test process, or as real
``manage.py pgqueue_worker`` processes against the test database."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.db import connection, connections

from django_pgqueue.worker import Worker

ROOT = Path(__file__).resolve().parent.parent


def wait_for(predicate: Callable[[], object], timeout: float = 15, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {predicate}")


@contextlib.contextmanager
def worker_thread(**options) -> Iterator[Worker]:
    """Run a ``Worker`` in a background thread for the duration of the block."""
    worker = Worker(**options)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # surfaced in the test below
            errors.append(exc)
        finally:
            # As Django does at the end of a request: the worker's start-up queries
            # (declared limits) opened this thread's connections.
            connections.close_all()

    thread = threading.Thread(target=target, name="test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "worker did not stop within 30s"
    if errors:
        raise errors[0]


def run_until_finished(job, *, worker_id: str | None = None, rounds: int = 50):
    """Run burst workers in this thread until ``job`` has finished, and return it
    refreshed. For jobs whose retries are due within a second: a pause of 20 ms between
    runs, at most ``rounds`` runs. ``worker_id``: the workers' id (default: their own)."""
    for _ in range(rounds):
        Worker(burst=True, concurrency=1, worker_id=worker_id).run()
        job.refresh_from_db()
        if job.is_finished:
            return job
        time.sleep(0.02)
    raise AssertionError(f"job still {job.status} after {rounds} burst runs")


def database_url_for_tests() -> str:
    """``DATABASE_URL`` rewritten to name the test database Django created."""
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))


class WorkerProcess:
    """A real ``manage.py pgqueue_worker`` process; output goes to a temp file."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        # Closed in stop(); a context manager cannot span the process's lifetime.
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            "w+", prefix="pgqueue-worker-", suffix=".log"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "pgqueue_worker", *args],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DATABASE_URL": database_url_for_tests(),
                "PYTHONPATH": str(ROOT),
                **(env or {}),
            },
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def signal(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.log.close()


def enqueue_ticks_in_step(barrier, nows) -> None:
    """In a forked child: ``enqueue_due_ticks(now=...)`` at each of ``nows``, each in step
    with the other children (``barrier``); the child opens its own connections."""
    from django_pgqueue.periodic import enqueue_due_ticks

    try:
        for now in nows:
            barrier.wait(timeout=30)
            enqueue_due_ticks(now=now)
    finally:
        connections.close_all()
