"""pytest fixtures for projects that use django-pgqueue, registered through the
``pytest11`` entry point: installed with the package, nothing to configure.

They build on pytest-django's database fixtures, which the test chooses:

- ``pgqueue_immediate``: jobs enqueued by the test run as their transaction commits
  (``django_pgqueue.testing.immediate()``); the fixture's value is the list of runs.
- ``pgqueue_worker``: a function that runs a real burst worker, in the test's process,
  until no job is due; it returns the ``Worker`` (its ``stats`` count the outcomes).
  A worker has connections of its own: use it with ``transactional_db``, so that it
  sees what the test committed.

The fixtures import Django only when used: the plugin is loaded in every pytest run of
an environment where the package is installed, Django project or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .testing import JobRun
    from .worker import Worker


@pytest.fixture
def pgqueue_immediate() -> Iterator[list[JobRun]]:
    """Run each job the test enqueues as soon as its transaction commits; the value is
    the list of runs, filled as they happen. A failed attempt raises in the test."""
    from .testing import immediate

    with immediate() as runs:
        yield runs


@pytest.fixture
def pgqueue_worker() -> Callable[..., Worker]:
    """``pgqueue_worker(**options)`` runs a burst ``Worker`` until no job is due and
    returns it; the options are ``Worker``'s (``concurrency=1`` unless given)."""
    from django.db import connections

    from .worker import Worker

    def run(**options: Any) -> Worker:
        options.setdefault("concurrency", 1)
        worker = Worker(burst=True, **options)
        try:
            worker.run()
        finally:
            # The worker's start-up queries ran on this thread's connections.
            connections.close_all()
        return worker

    return run
