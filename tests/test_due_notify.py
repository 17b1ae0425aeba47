"""Every insert path wakes idle workers for the jobs the server finds due, and only those.

"Due" is one predicate (``django_pgqueue.due.DUE``): a job given ``run_at=now()`` is as
due as one given no time at all, whichever statement (or COPY) inserts it.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.due import DUE
from django_pgqueue.inserts import COPY_PART_ROWS
from django_pgqueue.models import Job, JobStatus
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "woken"


def _enqueue(**options: Any) -> None:
    enqueue("tests.noop", queue=QUEUE, **options)


def _enqueue_in_transaction(**options: Any) -> None:
    with transaction.atomic():
        enqueue("tests.noop", queue=QUEUE, **options)


def _enqueue_unique(**options: Any) -> None:
    enqueue("tests.noop", queue=QUEUE, unique_key="only-one", **options)


def _enqueue_many(**options: Any) -> None:
    enqueue_many([{"job_type": "tests.noop", "queue": QUEUE, **options}])


def _enqueue_many_streamed(**options: Any) -> None:
    # More than one part: the COPY streams while the rest is validated.
    enqueue_many([{"job_type": "tests.noop", "queue": QUEUE, **options}] * (COPY_PART_ROWS + 1))


def _enqueue_many_unique(**options: Any) -> None:
    enqueue_many(
        [
            {"job_type": "tests.noop", "queue": QUEUE, "unique_key": "u1", **options},
            {"job_type": "tests.noop", "queue": QUEUE, "unique_key": "u2", **options},
        ]
    )


def _enqueue_replacing(**options: Any) -> None:
    # A holder not yet due (no NOTIFY), then its replacement with the options.
    enqueue("tests.noop", queue=QUEUE, unique_key="debounced", delay=3600)
    enqueue("tests.noop", unique_key="debounced", on_duplicate="replace", **options)


def _enqueue_many_replacing(**options: Any) -> None:
    enqueue("tests.noop", queue=QUEUE, unique_key="debounced", delay=3600)
    enqueue_many(
        [{"job_type": "tests.noop", "unique_key": "debounced", **options}],
        on_duplicate="replace",
    )


def _enqueue_many_in_transaction(**options: Any) -> None:
    with transaction.atomic():
        enqueue_many([{"job_type": "tests.noop", "queue": QUEUE, **options}])


INSERT_PATHS: list[Callable[..., None]] = [
    _enqueue,
    _enqueue_in_transaction,
    _enqueue_unique,
    _enqueue_many,
    _enqueue_many_streamed,
    _enqueue_many_unique,
    _enqueue_many_in_transaction,
    _enqueue_replacing,
    _enqueue_many_replacing,
]


@pytest.fixture
def notified(other_connection):
    """The queues notified on ``pgqueue_jobs``, up to the sentinel queue's notification."""
    other_connection.execute("LISTEN pgqueue_jobs")

    def received() -> list[str]:
        enqueue("tests.noop", queue="sentinel")
        payloads = []
        for notify in other_connection.notifies(timeout=5):
            if notify.payload == "sentinel":
                return payloads
            payloads.append(notify.payload)
        raise AssertionError(f"no sentinel notification; got {payloads}")

    return received


@pytest.fixture(autouse=True)
def _no_coalescing_carried_over(monkeypatch):
    # Earlier tests' notifications must not open a coalescing window for these queues.
    monkeypatch.setattr(importlib.import_module("django_pgqueue.inserts"), "_last_notified", {})


@pytest.mark.parametrize("insert", INSERT_PATHS, ids=lambda f: f.__name__.lstrip("_"))
@pytest.mark.parametrize(
    "when",
    [
        pytest.param(lambda: {}, id="no-time"),
        pytest.param(lambda: {"run_at": timezone.now()}, id="run_at-now"),
        pytest.param(lambda: {"run_at": timezone.now() - timedelta(hours=1)}, id="run_at-past"),
    ],
)
def test_a_due_job_notifies_its_queue(insert, when, notified):
    insert(**when())

    assert notified() == [QUEUE]


@pytest.mark.parametrize("insert", INSERT_PATHS, ids=lambda f: f.__name__.lstrip("_"))
@pytest.mark.parametrize(
    "when",
    [
        pytest.param(lambda: {"delay": 3600}, id="delay"),
        pytest.param(lambda: {"run_at": timezone.now() + timedelta(hours=1)}, id="run_at-later"),
    ],
)
def test_a_job_not_yet_due_notifies_nothing(insert, when, notified):
    insert(**when())

    assert notified() == []


def test_a_batch_notifies_a_scheduled_due_queue_beside_a_coalesced_one(notified, monkeypatch):
    inserts_module = importlib.import_module("django_pgqueue.inserts")
    monkeypatch.setattr(inserts_module, "NOTIFY_COALESCE_SECONDS", 3600)
    enqueue("tests.noop", queue="coalesced")  # opens the window for this queue
    enqueue_many(
        [
            {"job_type": "tests.noop", "queue": "coalesced"},
            {"job_type": "tests.noop", "queue": QUEUE, "run_at": timezone.now()},
        ]
    )
    inserts_module._last_notified.clear()  # let the sentinel through

    assert set(notified()) == {"coalesced", QUEUE}


def test_enqueue_many_with_run_at_now_wakes_an_idle_worker():
    # Polling every 30 s: only the NOTIFY can get the job done in time.
    with worker_thread(queues=[QUEUE], poll_interval=30) as worker:
        wait_for(lambda: worker._listener is not None and worker._listener.listening.is_set())
        time.sleep(0.2)  # let the worker go idle on its poll
        (job,) = enqueue_many(
            [{"job_type": "tests.noop", "queue": QUEUE, "run_at": timezone.now()}]
        )

        wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.COMPLETED, timeout=10)


def test_the_claim_function_uses_the_one_definition_of_due():
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'claim_job_batch'")
        (source,) = cursor.fetchone()

    assert f"AND {DUE}" in source
