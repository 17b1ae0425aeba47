"""``django_pgqueue.testing.run_job()``: one run of a handler, in the test's thread, as a
worker makes it, with what it decided returned rather than written."""

from __future__ import annotations

import asyncio

import pytest
from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.test import TestCase
from django.utils import timezone

from django_pgqueue import enqueue, job, registry, signals
from django_pgqueue.exceptions import InvalidJobError, UnknownJobTypeError
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.testing import RUN_JOB_WORKER_ID, run_job
from tests.testapp import jobs as test_jobs
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def write_then_fail(job):
    now = timezone.now()
    Execution.objects.create(
        job_id=job.id,
        worker_id=job.worker_id,
        attempt=job.attempts,
        started_at=now,
        finished_at=now,
    )
    raise ValueError("after the write")


async def sleep_then_return(job):
    await asyncio.sleep(job.data.get("sleep", 0))
    return {"slept": job.data.get("sleep", 0)}


@pytest.fixture
def kit_jobs():
    job("tests.kit_write_then_fail", max_attempts=2)(write_then_fail)
    job("tests.kit_async", timeout=0.2, max_attempts=1)(sleep_then_return)
    yield
    registry.unregister("tests.kit_write_then_fail")
    registry.unregister("tests.kit_async")


def test_a_job_type_and_its_data_run_to_the_handlers_result():
    outcome = run_job("tests.returns", {"n": 21})

    assert outcome.status == "completed"
    assert outcome.result == {"doubled": 42}
    assert (outcome.error, outcome.traceback, outcome.retry_in) == ("", "", None)
    assert outcome.job.attempts == 1
    assert outcome.job.worker_id == RUN_JOB_WORKER_ID
    assert not Job.objects.exists()  # nothing was enqueued or written


def test_a_decorated_handler_can_be_given_instead_of_its_type():
    assert run_job(test_jobs.returns_value, {"n": 2}).result == {"doubled": 4}


def test_an_enqueued_job_runs_as_its_next_attempt_and_its_row_is_left_alone():
    enqueued = enqueue("tests.fail")

    outcome = run_job(enqueued)

    assert outcome.status == "pending"  # a worker would retry it
    assert outcome.retry_in == registry.get_definition("tests.fail").retry_delay(1)
    assert outcome.error == "RuntimeError: boom on attempt 1"
    assert "RuntimeError: boom on attempt 1" in outcome.traceback
    row = Job.objects.get(pk=enqueued.pk)
    assert (row.status, row.attempts, row.last_error) == (JobStatus.PENDING, 0, "")
    assert enqueued.attempts == 0  # the job given is not changed either


def test_the_last_attempt_fails_the_job():
    outcome = run_job("tests.fail", attempt=3)

    assert outcome.status == "failed"
    assert outcome.retry_in is None


def test_fail_job_fails_at_once_and_retry_job_gives_its_delay():
    assert run_job("tests.fail_now").status == "failed"
    later = run_job("tests.retry_later", {"delay": 7})
    assert (later.status, later.retry_in) == ("pending", 7.0)


def test_a_snooze_is_reported_as_one():
    outcome = run_job("tests.snooze", {"delay": 30})

    assert (outcome.status, outcome.snoozed, outcome.retry_in) == ("pending", True, 30.0)


def test_a_failed_attempts_writes_are_rolled_back_with_it(kit_jobs):
    outcome = run_job("tests.kit_write_then_fail")

    assert outcome.status == "pending"
    assert outcome.error == "ValueError: after the write"
    assert not Execution.objects.exists()


def test_the_job_signals_are_sent_as_a_worker_sends_them():
    received = []

    def on_completed(sender, job, result, **kwargs):
        received.append((job.job_type, result))

    signals.job_completed.connect(on_completed)
    try:
        run_job("tests.returns", {"n": 1})
    finally:
        signals.job_completed.disconnect(on_completed)

    assert received == [("tests.returns", {"doubled": 2})]


def test_an_async_handler_runs_on_an_event_loop_under_its_timeout(kit_jobs):
    assert run_job("tests.kit_async", {"sleep": 0}).result == {"slept": 0}

    late = run_job("tests.kit_async", {"sleep": 5})

    assert late.status == "failed"
    assert "ran past its timeout of 0.2s" in late.error


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"job": "tests.returns", "data": {"n": float("nan")}}, "data"),
        ({"job": "tests.returns", "data": [1]}, "data"),
        ({"job": "tests.returns", "attempt": 0}, "attempt"),
        ({"job": "tests.returns", "attempt": True}, "attempt"),
        ({"job": "tests.returns", "attempt": 1.5}, "attempt"),
    ],
)
def test_bad_arguments_are_refused_before_the_handler_runs(arguments, field):
    with pytest.raises(InvalidJobError) as excinfo:
        run_job(**arguments)

    assert excinfo.value.field == field


def test_data_is_refused_with_a_job_that_has_its_own():
    enqueued = enqueue("tests.returns", {"n": 1})

    with pytest.raises(InvalidJobError, match="the job's own"):
        run_job(enqueued, {"n": 2})


def test_an_unknown_job_type_is_refused():
    with pytest.raises(UnknownJobTypeError, match=r"tests\.nothing"):
        run_job("tests.nothing")


def test_run_job_refuses_to_run_outside_a_test_environment(monkeypatch):
    monkeypatch.delattr(mail, "outbox")

    with pytest.raises(ImproperlyConfigured, match=r"django_pgqueue\.testing is for tests"):
        run_job("tests.returns", {"n": 1})


class InATestCase(TestCase):
    databases = "__all__"

    def test_a_failing_handler_leaves_the_test_transaction_usable(self):
        # A worker closes a connection a failed handler left outside autocommit: the
        # test's connection is inside its transaction, and must stay open.
        job("tests.kit_write_then_fail", max_attempts=2)(write_then_fail)
        self.addCleanup(registry.unregister, "tests.kit_write_then_fail")
        enqueued = enqueue("tests.kit_write_then_fail")

        outcome = run_job(enqueued)

        self.assertEqual(outcome.status, "pending")
        self.assertFalse(Execution.objects.exists())  # rolled back to its savepoint
        self.assertEqual(Job.objects.get(pk=enqueued.pk).status, JobStatus.PENDING)
