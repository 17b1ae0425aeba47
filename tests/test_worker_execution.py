"""Running a job in the calling thread, as a worker's slot does (worker/execution.py):
what a slot does when the server has cut its database connection."""

import threading

import pytest
from django.db import connection, connections

from django_pgqueue import enqueue, registry
from django_pgqueue.sideconn import open_raw_connection
from django_pgqueue.worker.execution import RunningJob, _LostConnections, execute
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_lost_connection_seen_yet():
    """Start as a worker process does: no slot has lost a connection yet (workers run
    by earlier tests in this process may have)."""
    saved = _LostConnections.count
    _LostConnections.count = _LostConnections._seen.count = 0
    yield
    _LostConnections.count = saved


def cut_this_threads_connection():
    """Terminate this thread's Django connection on the server, as a restart or
    ``pg_terminate_backend`` would; the client does not know until it uses it."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with open_raw_connection("default") as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


def run_in_this_thread(job):
    # As claimed: the slot's worker holds it (an atomic handler's completion is written
    # in its transaction only while it does).
    # Written on a connection of its own: this thread's may have been cut.
    with open_raw_connection("default") as other:
        (claimed_at,) = other.execute(
            "UPDATE pgqueue_jobs SET status = 'running', worker_id = 'test-slot', attempts = 1, "
            "claimed_at = now() WHERE id = %s RETURNING claimed_at",
            [job.id],
        ).fetchone()
    job.status, job.worker_id, job.attempts = "running", "test-slot", 1
    job.claimed_at = claimed_at
    return execute(
        RunningJob(job=job, definition=registry.find_definition(job.job_type)), "default"
    )


def run_in_another_slot(job):
    """Run ``job`` in a new thread whose connection was cut first."""
    outcomes = []

    def slot():
        try:
            cut_this_threads_connection()
            outcomes.append(run_in_this_thread(job))
        finally:
            connections.close_all()

    thread = threading.Thread(target=slot)
    thread.start()
    thread.join(timeout=30)
    return outcomes[0]


def test_a_slot_checks_its_connection_after_another_slot_found_its_own_cut():
    first, second = enqueue("tests.record"), enqueue("tests.record")
    cut_this_threads_connection()  # the server went away: this slot's connection too

    # Another slot meets its dead connection first: its job fails and is retried.
    assert run_in_another_slot(first).status == "pending"
    # This slot then checks its own before the next job, instead of failing it too.
    outcome = run_in_this_thread(second)

    assert outcome.status == "completed", outcome.error
    assert list(Execution.objects.values_list("job_id", flat=True)) == [second.id]


def test_without_a_cut_seen_elsewhere_a_slot_finds_its_dead_connection_by_failing():
    job = enqueue("tests.record")
    cut_this_threads_connection()

    outcome = run_in_this_thread(job)

    assert outcome.status == "pending"
    assert "terminating connection" in outcome.error
    # The slot's connection was replaced: its next job runs.
    assert run_in_this_thread(enqueue("tests.record")).status == "completed"
