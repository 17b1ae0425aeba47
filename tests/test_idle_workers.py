"""Idle workers leave the polling to one leader, and still start every job on time.

The leader (the live worker with the lowest id) asks the database every poll interval
which queues have jobs that became due with time, notifies them, and ticks; the other
workers, while they hear the ticks, claim only when notified (worker/listener.py).
"""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_pgqueue import RetryJob, enqueue, enqueue_many, job
from django_pgqueue.models import Job, JobStatus, WorkerRecord
from django_pgqueue.sideconn import open_raw_connection
from django_pgqueue.worker import listener, queries, slots
from tests.testapp.models import Execution
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db(transaction=True)

POLL = 0.1


def leaders(*workers) -> list[str]:
    return [w.worker_id for w in workers if w._heartbeat is not None and w._heartbeat.leads]


def settled(*workers) -> bool:
    """Every worker hears the leader's ticks, and one of them leads."""
    return len(leaders(*workers)) == 1 and all(w._due_jobs_announced() for w in workers)


def finished(job_) -> bool:
    return Job.objects.get(pk=job_.pk).status == JobStatus.COMPLETED


def round_trips_while_idle(worker, seconds: float) -> int:
    before = worker.round_trips
    time.sleep(seconds)
    return worker.round_trips - before


def test_one_worker_leads_and_the_others_stop_polling():
    with (
        worker_thread(worker_id="a-leader", poll_interval=POLL) as first,
        worker_thread(worker_id="b-follower", poll_interval=POLL) as second,
    ):
        wait_for(lambda: settled(first, second))
        assert leaders(first, second) == ["a-leader"]
        # Polling, each would claim about 20 times in these 2 s.
        assert round_trips_while_idle(second, 2.0) <= 1


def test_an_idle_follower_starts_a_delayed_job_on_time():
    # Only the follower serves the queue: the leader's wake-up call must reach it.
    with (
        worker_thread(worker_id="a-leader", poll_interval=POLL, queues=["elsewhere"]) as first,
        worker_thread(worker_id="b-follower", poll_interval=POLL, queues=["later"]) as second,
    ):
        wait_for(lambda: settled(first, second))
        delayed = enqueue("tests.noop", queue="later", delay=1.0)
        wait_for(lambda: finished(delayed), timeout=10)
        delayed.refresh_from_db()
        assert delayed.worker_id == "b-follower"
        # Polling every 60 s (IDLE_POLL_INTERVAL) alone, it would start a minute late.
        assert delayed.started_at - delayed.run_at < timedelta(seconds=5)


def test_an_idle_follower_starts_a_retry_on_time(clean_registry):
    @job("tests.idle.flaky", max_attempts=2)
    def flaky(job_):
        if job_.attempts == 1:
            raise RetryJob("not yet", delay=0.5)

    with (
        worker_thread(worker_id="a-leader", poll_interval=POLL, queues=["elsewhere"]) as first,
        worker_thread(worker_id="b-follower", poll_interval=POLL, queues=["flaky"]) as second,
    ):
        wait_for(lambda: settled(first, second))
        retried = enqueue("tests.idle.flaky", queue="flaky")
        wait_for(lambda: finished(retried), timeout=20)
        retried.refresh_from_db()
        assert retried.attempts == 2
        assert retried.started_at - retried.run_at < timedelta(seconds=5)


def test_the_next_worker_leads_once_the_leader_stops():
    with worker_thread(worker_id="b-follower", poll_interval=POLL) as second:
        with worker_thread(worker_id="a-leader", poll_interval=POLL) as first:
            wait_for(lambda: settled(first, second))
            assert leaders(first, second) == ["a-leader"]
        # Its ticks stop: the follower polls again, beats, and finds itself the leader.
        wait_for(lambda: leaders(second) == ["b-follower"], timeout=10)
        wait_for(lambda: settled(second))
        delayed = enqueue("tests.noop", delay=0.5)
        wait_for(lambda: finished(delayed), timeout=10)


@override_settings(PGQUEUE={"STALE_AFTER": 2.0, "HEARTBEAT_INTERVAL": 0.5})
def test_a_worker_that_stopped_beating_leads_no_more():
    # A lower id, beating when the worker starts, then never again (a crashed leader).
    WorkerRecord.objects.create(
        worker_id="a-crashed",
        hostname="gone",
        pid=1,
        queues=None,
        job_types=None,
        concurrency=1,
        started_at=timezone.now(),
        heartbeat_at=timezone.now(),
    )
    with worker_thread(worker_id="b-follower", poll_interval=POLL) as worker:
        wait_for(lambda: worker._heartbeat is not None and worker._heartbeat._beaten)
        assert leaders(worker) == []
        wait_for(lambda: leaders(worker) == ["b-follower"], timeout=10)


def test_idle_workers_poll_while_a_concurrency_limit_exists(settings):
    settings.PGQUEUE = {"QUEUE_LIMITS": {"limited": 1}}
    with (
        worker_thread(worker_id="a-leader", poll_interval=POLL) as first,
        worker_thread(worker_id="b-follower", poll_interval=POLL) as second,
    ):
        wait_for(lambda: len(leaders(first, second)) == 1)
        wait_for(lambda: second._heartbeat is not None and second._heartbeat._beaten)
        assert not second._due_jobs_announced()
        assert round_trips_while_idle(second, 1.0) >= 5


def worker_backends(before: set[int]) -> int:
    """Client connections to the test database opened since ``before`` was taken."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend'"
        )
        return len({pid for (pid,) in cursor.fetchall()} - before)


def held_backends(before: set[int], samples: int = 10) -> list[int]:
    """``worker_backends()`` read ``samples`` times, 20 ms apart."""
    held = []
    for _ in range(samples):
        held.append(worker_backends(before))
        time.sleep(0.02)
    return held


def test_idle_slots_close_the_connections_their_handlers_opened(monkeypatch):
    monkeypatch.setattr(slots, "IDLE_CONNECTION_SECONDS", 0.5)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        before = {pid for (pid,) in cursor.fetchall()}
    with worker_thread(poll_interval=POLL, concurrency=3) as worker:
        recorded = [enqueue("tests.record", {"sleep": 1.0}) for _ in range(3)]
        # The main loop's, the listener's (the heartbeat beats on it), and one per busy
        # slot.
        wait_for(lambda: worker_backends(before) == 5)
        wait_for(lambda: all(finished(job_) for job_ in recorded))
        wait_for(lambda: worker_backends(before) == 2, timeout=10)
        # A slot opens its connection again for the next job.
        again = enqueue("tests.record")
        wait_for(lambda: finished(again))
        assert worker.stats["completed"] == 4


def test_a_light_load_runs_on_one_slot_and_its_connection():
    # Jobs one at a time go to the slot that became idle last: one slot's connection is
    # opened and kept warm, not one per slot in turn.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        before = {pid for (pid,) in cursor.fetchall()}
    with worker_thread(poll_interval=POLL, concurrency=4) as worker:
        for _ in range(8):
            recorded = enqueue("tests.record")
            wait_for(lambda recorded=recorded: finished(recorded))
        # The main loop's, the listener's (the heartbeat beats on it), and one slot's;
        # one more at moments, the leader's (this worker's) for its periodic work.
        held = held_backends(before)
        assert min(held) == 3 and max(held) <= 4, held
        assert worker.stats["completed"] == 8


def test_a_starting_worker_beats_on_the_listeners_connection_from_its_first_beat(
    pgqueue_settings, monkeypatch
):
    # The heartbeat thread starts before the listener: its first beat, on a connection of
    # its own when the listener was not listening yet, held that connection until the
    # next beat, long after start for an idle worker. Here the listener connects 0.3 s
    # late, as on a busy machine. The first beat's periodic work waits for the next
    # beat: none until then.
    pgqueue_settings(HEARTBEAT_INTERVAL=30, STALE_AFTER=120)

    def slow_connection(*args, **kwargs):
        time.sleep(0.3)
        return open_raw_connection(*args, **kwargs)

    monkeypatch.setattr(listener, "open_raw_connection", slow_connection)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        before = {pid for (pid,) in cursor.fetchall()}
    with worker_thread(poll_interval=POLL, concurrency=4) as worker:
        wait_for(lambda: worker._heartbeat is not None and worker._heartbeat._beaten)
        wait_for(lambda: worker._listener is not None and worker._listener.listening.is_set())
        # The main loop's and the listener's.
        held = held_backends(before)
        assert max(held) == 2, held


def test_without_notify_the_heartbeat_beats_on_a_connection_of_its_own():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        before = {pid for (pid,) in cursor.fetchall()}
    with worker_thread(worker_id="polling", poll_interval=POLL, listen=False) as worker:
        wait_for(lambda: worker._heartbeat is not None and worker._heartbeat._beaten)
        beaten_at = WorkerRecord.objects.get(worker_id="polling").heartbeat_at
        # The main loop's and the heartbeat's: no listener.
        held = held_backends(before)
        assert min(held) == 2 and max(held) <= 3, held
        wait_for(
            lambda: WorkerRecord.objects.get(worker_id="polling").heartbeat_at > beaten_at,
            timeout=5,
        )


def test_jobs_submitted_together_to_idle_slots_run_on_every_slot_at_once():
    # Idle slots are woken one at a time, each waking the next while jobs are left:
    # none may be left asleep while jobs wait for it.
    with worker_thread(poll_interval=POLL, concurrency=4) as worker:
        time.sleep(0.3)  # every slot idle
        jobs = enqueue_many([{"job_type": "tests.record", "data": {"sleep": 1.0}}] * 4)
        wait_for(lambda: all(finished(job_) for job_ in jobs), timeout=10)
        assert worker.stats["completed"] == 4
    runs = Execution.objects.filter(job_id__in=[job_.id for job_ in jobs])
    latest_start = max(run.started_at for run in runs)
    earliest_end = min(run.finished_at for run in runs)
    assert latest_start < earliest_end  # all four were running at that moment


@pytest.fixture
def listening(other_connection):
    other_connection.execute("LISTEN pgqueue_jobs")

    def heard() -> list[str]:
        return [n.payload for n in other_connection.notifies(timeout=0.5)]

    return heard


def wake_due_queues(since):
    with connection.cursor() as cursor:
        cursor.execute(
            queries.WAKE_DUE_QUEUES, {"since": since, "lookback": 1.0, "channel": "pgqueue_jobs"}
        )
        return cursor.fetchone()[0]


def test_the_wake_up_call_names_the_queues_of_jobs_that_became_due(listening):
    for queue, delay in [("soon", 1.5), ("much-later", 3600)]:
        enqueue("tests.noop", queue=queue, delay=delay)
    since = wake_due_queues(None)
    assert listening() == [queries.TICK]  # neither is due yet
    time.sleep(1.2)
    wake_due_queues(since)
    assert listening() == ["soon", queries.TICK]


def test_the_wake_up_call_names_jobs_inserted_with_sql_and_not_an_old_backlog(listening):
    since = wake_due_queues(None)
    assert listening() == [queries.TICK]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_jobs (job_type, queue, run_at) VALUES "
            "('tests.noop', 'with-sql', now()), "
            "('tests.noop', 'long-due', now() - interval '1 hour')"
        )
    since = wake_due_queues(since)
    assert listening() == ["with-sql", queries.TICK]
    time.sleep(1.1)
    # Once more within the lookback after the call that named it (a job committed just
    # after a call read the table is named by the next one), then no more.
    since = wake_due_queues(since)
    assert listening() == ["with-sql", queries.TICK]
    wake_due_queues(since)
    assert listening() == [queries.TICK]


def test_a_listener_lends_its_connection_only_while_it_listens():
    import threading

    from django_pgqueue.worker.listener import ListenerUnavailable, NotificationListener

    stopping = threading.Event()
    listener = NotificationListener(
        alias="default",
        channel="pgqueue_jobs",
        queues=None,
        wake=threading.Event(),
        stopping=stopping,
    )
    with pytest.raises(ListenerUnavailable, match="not listening"):
        listener.borrow(lambda conn: conn.execute("SELECT 1").fetchone(), "a test", 1.0)
    listener.start()
    try:
        wait_for(listener.listening.is_set)
        pid = listener.borrow(lambda conn: conn.info.backend_pid, "a test", 2.0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
            assert cursor.fetchone() is not None
        # The work's own errors reach the borrower, and the listener goes on.
        with pytest.raises(psycopg.errors.DivisionByZero):
            listener.borrow(lambda conn: conn.execute("SELECT 1 / 0"), "a test", 2.0)
        assert listener.borrow(lambda conn: conn.execute("SELECT 2").fetchone(), "a test", 2.0) == (
            2,
        )
    finally:
        stopping.set()
        listener.join(timeout=5)
    assert not listener.listening.is_set()
    with pytest.raises(ListenerUnavailable):
        listener.borrow(lambda conn: None, "a test", 1.0)
