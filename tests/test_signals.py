"""The job signals: ``job_enqueued`` from enqueue, and the worker's ``job_started``,
``job_completed`` and ``job_failed``, as the contract in django_pgqueue/signals.py says."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.dispatch import Signal

from django_pgqueue import DuplicateJobError, enqueue, enqueue_many
from django_pgqueue.models import Job
from django_pgqueue.signals import job_completed, job_enqueued, job_failed, job_started
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db


@pytest.fixture
def receive() -> Iterator[Callable[..., list[dict[str, Any]]]]:
    """Connect a recording receiver to a signal: ``calls = receive(job_enqueued)``.

    Each call is recorded as its keyword arguments plus ``sender``; thread-safe, since
    worker signals are sent from slot threads. Disconnected after the test.
    """
    connected: list[tuple[Signal, Callable[..., None]]] = []

    def connect(signal: Signal, also: Callable[..., None] | None = None) -> list[dict[str, Any]]:
        calls: list[dict[str, Any]] = []
        lock = threading.Lock()

        def receiver(sender: Any, **kwargs: Any) -> None:
            with lock:
                calls.append({"sender": sender, **kwargs})
            if also is not None:
                also(sender=sender, **kwargs)

        signal.connect(receiver, weak=False)
        connected.append((signal, receiver))
        return calls

    yield connect
    for signal, receiver in connected:
        signal.disconnect(receiver)


# -- job_enqueued -----------------------------------------------------------------------


def test_enqueue_sends_job_enqueued_once_with_the_inserted_job(receive):
    calls = receive(job_enqueued)

    queued = enqueue("tests.noop", {"n": 1})

    assert len(calls) == 1
    assert calls[0]["sender"] is Job
    assert calls[0]["job"] is queued
    assert calls[0]["signal"] is job_enqueued


def test_enqueue_many_sends_job_enqueued_per_job_in_input_order(receive):
    calls = receive(job_enqueued)

    jobs = enqueue_many([{"job_type": "tests.noop", "data": {"i": i}} for i in range(3)])

    assert [call["job"] for call in calls] == jobs


def test_job_enqueued_is_not_sent_for_an_existing_unique_job(receive):
    first = enqueue("tests.noop", unique_key="k")
    calls = receive(job_enqueued)

    assert enqueue("tests.noop", unique_key="k").pk == first.pk
    with pytest.raises(DuplicateJobError):
        enqueue("tests.noop", unique_key="k", on_duplicate="raise")
    jobs = enqueue_many(
        [
            {"job_type": "tests.noop", "unique_key": "k"},
            {"job_type": "tests.noop", "unique_key": "new"},
            {"job_type": "tests.noop", "unique_key": "new"},
        ]
    )

    assert [call["job"] for call in calls] == [jobs[1]]


def test_job_enqueued_is_not_sent_for_a_batch_rejected_as_duplicate(receive):
    enqueue("tests.noop", unique_key="held")
    calls = receive(job_enqueued)

    with pytest.raises(DuplicateJobError):
        enqueue_many(
            [
                {"job_type": "tests.noop", "unique_key": "fresh"},
                {"job_type": "tests.noop", "unique_key": "held"},
            ],
            on_duplicate="raise",
        )

    assert calls == []


@pytest.mark.django_db(transaction=True)
def test_job_enqueued_is_sent_inside_the_enqueuing_transaction(receive):
    seen: list[tuple[bool, bool]] = []

    def check(sender: Any, job: Job, **kwargs: Any) -> None:
        # The receiver runs on the caller's connection, in its transaction: it sees the job.
        seen.append((connection.in_atomic_block, Job.objects.filter(pk=job.pk).exists()))

    receive(job_enqueued, also=check)
    with transaction.atomic():
        enqueue("tests.noop")

    assert seen == [(True, True)]


@pytest.mark.django_db(transaction=True)
def test_on_commit_work_of_a_receiver_runs_only_if_the_transaction_commits(receive):
    committed: list[Any] = []

    def later(sender: Any, job: Job, **kwargs: Any) -> None:
        transaction.on_commit(lambda: committed.append(job.pk))

    calls = receive(job_enqueued, also=later)
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("tests.noop", {"rolled": "back"})
        raise RuntimeError
    with transaction.atomic():
        kept = enqueue("tests.noop")

    assert len(calls) == 2  # sent for both: the signal does not wait for the commit
    assert committed == [kept.pk]


@pytest.mark.django_db(transaction=True)
def test_a_failing_job_enqueued_receiver_propagates_and_rolls_back_the_enqueue(receive):
    def refuse(sender: Any, **kwargs: Any) -> None:
        raise PermissionError("no jobs today")

    receive(job_enqueued, also=refuse)

    with pytest.raises(PermissionError), transaction.atomic():
        enqueue("tests.noop")

    assert Job.objects.count() == 0


# -- worker signals ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_worker_sends_job_started_then_job_completed_with_the_result(receive, clean_registry):
    from django_pgqueue import job

    @job("tests.signals_answer")
    def answer(job: Job) -> dict[str, int]:
        return {"answer": 42}

    events: list[tuple[str, Any]] = []
    order_lock = threading.Lock()

    def note(name: str) -> Callable[..., None]:
        def record(sender: Any, job: Job, **kwargs: Any) -> None:
            with order_lock:
                events.append((name, job.pk))

        return record

    started = receive(job_started, also=note("started"))
    completed = receive(job_completed, also=note("completed"))
    queued = enqueue("tests.signals_answer")

    with worker_thread(concurrency=1, poll_interval=0.05):
        wait_for(lambda: completed)

    assert events == [("started", queued.pk), ("completed", queued.pk)]
    assert started[0]["sender"] is Job and started[0]["job"].pk == queued.pk
    assert started[0]["job"].status == "running"
    assert completed[0]["result"] == {"answer": 42}


@pytest.mark.django_db(transaction=True)
def test_worker_sends_job_failed_for_each_failed_attempt_with_will_retry(receive):
    failed = receive(job_failed)
    queued = enqueue("tests.fail")  # 3 attempts, fast backoff

    with worker_thread(concurrency=1, poll_interval=0.05):
        wait_for(lambda: Job.objects.get(pk=queued.pk).status == "failed")
        wait_for(lambda: len(failed) == 3)

    assert [call["will_retry"] for call in failed] == [True, True, False]
    assert [call["error"] for call in failed] == [
        f"RuntimeError: boom on attempt {attempt}" for attempt in (1, 2, 3)
    ]
    assert all(isinstance(call["exception"], RuntimeError) for call in failed)
    assert {call["job"].pk for call in failed} == {queued.pk}


@pytest.mark.django_db(transaction=True)
def test_a_failing_worker_signal_receiver_is_logged_and_the_job_still_completes(receive, caplog):
    def explode(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    receive(job_started, also=explode)
    completed = receive(job_completed, also=explode)
    queued = enqueue("tests.noop")

    with worker_thread(concurrency=1, poll_interval=0.05):
        wait_for(lambda: Job.objects.get(pk=queued.pk).status == "completed")

    assert len(completed) == 1
    assert caplog.text.count("signal receiver") == 2
    assert "receiver bug" in caplog.text
