"""What a worker forced to exit writes for the jobs it holds (worker/handback.py); the
real processes are in tests/test_worker_processes.py."""

import uuid
from datetime import UTC, datetime

from django_pgqueue import registry
from django_pgqueue.models import Job
from django_pgqueue.worker.execution import Outcome, RunningJob
from django_pgqueue.worker.handback import RELEASED_RUNNING_DELAY, forced_exit_outcomes


def held(*, attempts=1, max_attempts=3, started=True, outcome=None, buffered=False):
    job = Job(
        id=uuid.uuid4(), job_type="tests.record", attempts=attempts, max_attempts=max_attempts
    )
    running = RunningJob(
        job=job, definition=registry.find_definition(job.job_type), buffered=buffered
    )
    running.started_wall = 1_000.0 if started else None
    running.started_monotonic = 500.0 if started else None
    running.outcome = outcome
    return running


def test_a_started_job_is_handed_back_with_its_attempt_counted_or_failed_once_spent():
    retried, spent = held(attempts=1), held(attempts=3)
    outcomes = forced_exit_outcomes([retried, spent], [])
    assert [(o.status, o.delay, o.refund, o.error) for o in outcomes] == [
        # Due once the process, and the handler in it, is gone.
        ("pending", RELEASED_RUNNING_DELAY, 0, "worker forced to exit"),
        ("failed", 0.0, 0, "worker forced to exit"),
    ]


def test_a_job_that_never_started_gets_its_attempt_back():
    (outcome,) = forced_exit_outcomes([held(started=False)], [])
    assert (outcome.status, outcome.refund, outcome.error, outcome.unstarted) == (
        "pending",
        1,
        "worker forced to exit",
        True,
    )


def test_outcomes_already_known_are_written_as_they_are():
    # A job a slot took from the prefetch buffer records when its handler started; one
    # started at once keeps the claim's time (started None).
    finished = held(outcome=Outcome(uuid.uuid4(), "completed", None), buffered=True)
    finished.outcome.job_id = finished.job.id
    started_at_once = held(outcome=Outcome(uuid.uuid4(), "completed", None))
    started_at_once.outcome.job_id = started_at_once.job.id
    released = held(started=False)
    unflushed = Outcome(released.job.id, "pending", None, refund=1)  # a graceful release
    outcomes = forced_exit_outcomes([finished, started_at_once, released], [unflushed])
    assert [(o.job_id, o.status, o.started) for o in outcomes] == [
        (released.job.id, "pending", None),
        (finished.job.id, "completed", 500.0),
        (started_at_once.job.id, "completed", None),
    ]


def test_an_unflushed_outcome_of_an_earlier_claim_does_not_stand_for_the_later_one():
    # Recovery took the job back and this worker claimed it again: the earlier run's
    # outcome is written (and refused, its claim gone) and the later run handed back.
    again = held(started=False)
    again.job.claimed_at = datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC)
    earlier = Outcome(again.job.id, "failed", datetime(2026, 1, 1, tzinfo=UTC), error="x")
    outcomes = forced_exit_outcomes([again], [earlier])
    assert [(o.status, o.claimed_at) for o in outcomes] == [
        ("failed", earlier.claimed_at),
        ("pending", again.job.claimed_at),
    ]
