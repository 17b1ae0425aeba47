"""The worker's checkpoint writer: plain steps' checkpoints committed in the background,
several in one transaction, each before its job's outcome."""

from __future__ import annotations

import logging
import pickle
import threading

import psycopg
import pytest
from django.db import connection

from django_pgqueue import checkpoint_writer, enqueue, job
from django_pgqueue.checkpoint_writer import CheckpointWriter
from django_pgqueue.exceptions import RetryJob
from django_pgqueue.models import Job, JobStatus, JobStep
from tests.workers import database_url_for_tests, run_until_finished, wait_for, worker_thread


def held_job(attempts: int = 1) -> Job:
    """A job that attempt ``attempts`` of worker ``w`` is running, committed."""
    held = enqueue("tests.noop")
    Job.objects.filter(pk=held.pk).update(status="running", worker_id="w", attempts=attempts)
    held.refresh_from_db()
    return held


def hand(writer: CheckpointWriter, held: Job, name: str, result: str = "1", **changes) -> int:
    fields = {"worker_id": held.worker_id, "attempt": held.attempts, **changes}
    ticket = writer.hand(held.id, fields["worker_id"], fields["attempt"], name, result, 0.0, 0.0)
    assert ticket is not None
    return ticket


@pytest.fixture
def writer():
    writer = CheckpointWriter("default")
    yield writer
    writer.close()


def stored(held: Job) -> dict[str, object]:
    return dict(JobStep.objects.filter(job=held).values_list("name", "result"))


@pytest.mark.django_db(transaction=True)
def test_handed_checkpoints_are_written_only_for_the_attempt_holding_the_job(writer):
    held, other = held_job(attempts=2), held_job()
    hand(writer, held, "charge", '{"id": 1}')
    hand(writer, held, "lost attempt", attempt=1)
    hand(writer, held, "lost worker", worker_id="other")
    last = hand(writer, other, "email", '"sent"')

    assert writer.wait(last, timeout=10)
    assert stored(held) == {"charge": {"id": 1}}
    assert stored(other) == {"email": "sent"}
    step = JobStep.objects.get(job=held)
    assert (step.kind, step.attempt) == ("step", 2)
    assert step.started_at <= step.completed_at


@pytest.mark.django_db(transaction=True)
def test_a_name_already_stored_keeps_its_checkpoint_and_the_others_are_written(writer):
    held = held_job()
    writer.wait(hand(writer, held, "charge", '"first"'), timeout=10)

    hand(writer, held, "charge", '"second"')
    assert writer.wait(hand(writer, held, "email"), timeout=10)

    assert stored(held) == {"charge": "first", "email": 1}


@pytest.mark.django_db(transaction=True)
def test_the_writer_reconnects_when_its_connection_was_cut(writer):
    held = held_job()
    writer.wait(hand(writer, held, "before"), timeout=10)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE query LIKE '%%pgqueue_write_checkpoints%%' AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone() == (True,)

    assert writer.wait(hand(writer, held, "after"), timeout=10)

    assert set(stored(held)) == {"before", "after"}


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_the_database_refuses_is_logged_and_does_not_stop_the_writer(writer, caplog):
    held = held_job()
    with caplog.at_level(logging.WARNING, logger="django_pgqueue.steps"):
        assert writer.wait(hand(writer, held, "broken", "{not json"), timeout=10)
    assert "1 step checkpoints were not written" in caplog.text
    assert "step 'broken'" in caplog.text

    assert writer.wait(hand(writer, held, "next"), timeout=10)
    assert stored(held) == {"next": 1}


@pytest.mark.django_db(transaction=True)
def test_an_idle_writer_holds_no_connection_and_a_closed_one_takes_nothing(writer, monkeypatch):
    monkeypatch.setattr(checkpoint_writer, "IDLE_SECONDS", 0.2)
    held = held_job()

    def writer_connections() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE query LIKE '%%pgqueue_write_checkpoints%%' AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]

    writer.wait(hand(writer, held, "one"), timeout=10)
    assert writer_connections() == 1
    wait_for(lambda: writer_connections() == 0, timeout=5)
    writer.wait(hand(writer, held, "two"), timeout=10)  # and opens one again
    assert set(stored(held)) == {"one", "two"}

    writer.close()
    assert writer.hand(held.id, "w", 1, "three", "1", 0.0, 0.0) is None


def test_a_writer_sent_to_a_child_process_is_none():
    assert pickle.loads(pickle.dumps(CheckpointWriter("default"))) is None


def register_ten_steps(kind: str, returned: threading.Event) -> None:
    """``tests.ten_steps``: ten plain steps, then ``returned`` set; a thread's handler or
    an event loop's (``kind``: "sync" or "async")."""
    if kind == "sync":

        @job("tests.ten_steps")
        def ten_steps(job_):
            results = [job_.step(f"step {n}", lambda n=n: n * n) for n in range(10)]
            returned.set()
            return results

    else:

        async def square(n: int) -> int:
            return n * n

        @job("tests.ten_steps", atomic=False)
        async def ten_steps_async(job_):
            results = [await job_.astep(f"step {n}", square, n) for n in range(10)]
            returned.set()
            return results


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_jobs_outcome_waits_for_its_plain_steps_checkpoints(clean_registry, kind):
    returned = threading.Event()
    register_ten_steps(kind, returned)
    held = enqueue("tests.ten_steps")
    # An open transaction that holds the checkpoints' table in SHARE mode: no
    # checkpoint can be inserted until it ends.
    blocker = psycopg.connect(database_url_for_tests())
    try:
        blocker.execute("LOCK TABLE pgqueue_job_steps IN SHARE MODE")
        with worker_thread(concurrency=2, async_concurrency=2):
            assert returned.wait(timeout=15)
            # The handler has returned, but its checkpoints are not written yet: the
            # job's outcome is not recorded either.
            wait_for(_writer_blocked, timeout=10)
            held.refresh_from_db()
            assert held.status == JobStatus.RUNNING
            blocker.rollback()
            wait_for(lambda: Job.objects.get(pk=held.pk).status == JobStatus.COMPLETED)
    finally:
        blocker.close()

    done = Job.objects.get(pk=held.pk)
    assert done.result == [n * n for n in range(10)]
    steps = JobStep.objects.filter(job=done)
    assert sorted(steps.values_list("result", flat=True)) == sorted(n * n for n in range(10))
    assert all(step.completed_at <= done.completed_at for step in steps)


def _writer_blocked() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE '%%pgqueue_write_checkpoints%%'"
        )
        return cursor.fetchone()[0] == 1


@pytest.mark.django_db(transaction=True)
def test_steps_before_a_failure_are_not_run_again_by_the_retry(clean_registry):
    ran: list[str] = []

    @job("tests.fails_after_steps", max_attempts=2)
    def fails_after_steps(job_):
        for name in ("a", "b", "c"):
            job_.step(name, ran.append, f"{name} in attempt {job_.attempts}")
        if job_.attempts == 1:
            raise RetryJob("the CRM is down", delay=0)

    done = run_until_finished(enqueue("tests.fails_after_steps"))

    assert done.status == JobStatus.COMPLETED
    assert ran == ["a in attempt 1", "b in attempt 1", "c in attempt 1"]


@pytest.mark.django_db(transaction=True)
def test_checkpoints_written_together_keep_the_order_they_were_handed_in(writer):
    first, second = held_job(), held_job()
    names = [f"step {n}" for n in range(40)]
    blocker = psycopg.connect(database_url_for_tests())
    try:
        blocker.execute("LOCK TABLE pgqueue_job_steps IN SHARE MODE")
        for name in names:  # interleaved: one batch holds both jobs' checkpoints
            hand(writer, first, name)
            last = hand(writer, second, name)
        wait_for(_writer_blocked, timeout=10)
        blocker.rollback()
    finally:
        blocker.close()
    assert writer.wait(last, timeout=10)

    for held in (first, second):
        by_id = JobStep.objects.filter(job=held).order_by("id").values_list("name", flat=True)
        assert list(by_id) == names


@pytest.mark.django_db(transaction=True)
def test_a_jobs_checkpoints_follow_its_steps_order_whichever_way_each_is_written(
    clean_registry,
):
    @job("tests.mixed_steps", atomic=False)
    def mixed_steps(job_):
        job_.step("charge", int, 1)
        job_.step("record-charge", int, 2, atomic=True)
        job_.step("receipt", int, 3)
        job_.sleep("settle", 0.0)
        job_.step("crm", int, 4)

    done = run_until_finished(enqueue("tests.mixed_steps"))

    by_id = JobStep.objects.filter(job=done).order_by("id").values_list("name", flat=True)
    assert list(by_id) == ["charge", "record-charge", "receipt", "settle", "crm"]


@pytest.mark.django_db(transaction=True)
def test_an_unexpected_error_gives_up_its_batch_and_the_writer_goes_on(writer, caplog):
    held = held_job()
    with caplog.at_level(logging.WARNING, logger="django_pgqueue.steps"):
        # A start time that is not a number: building the statement's parameters fails.
        ticket = writer.hand(held.id, "w", 1, "odd", "1", "not a time", 0.0)  # type: ignore[arg-type]
        assert ticket is not None and writer.wait(ticket, timeout=10)
    assert "step 'odd'" in caplog.text

    assert writer.wait(hand(writer, held, "next"), timeout=10)
    assert stored(held) == {"next": 1}
