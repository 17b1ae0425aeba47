"""``django_pgqueue.testing.run_job()``: one run of a handler, in the test's thread, as a
worker makes it, with what it decided returned rather than written; and ``drain()``,
every due job run so, with its outcome written."""

from __future__ import annotations

import asyncio

import pytest
from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import TestCase
from django.utils import timezone

from django_pgqueue import Step, chain, enqueue, job, registry, signals
from django_pgqueue.exceptions import InvalidJobError, JobFailedError, UnknownJobTypeError
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.testing import RUN_JOB_WORKER_ID, drain, immediate, run_job
from tests.testapp import jobs as test_jobs
from tests.testapp.models import Execution, Order

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


async def read_order(job):
    order = await Order.objects.aget(pk=job.data["order"])
    return {"reference": order.reference}


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


# -- drain() ------------------------------------------------------------------------------


def enqueue_forever(job):
    enqueue("tests.kit_forever")


@pytest.fixture
def forever_job():
    job("tests.kit_forever")(enqueue_forever)
    yield
    registry.unregister("tests.kit_forever")


def test_drain_runs_a_workflow_to_its_end_and_writes_each_outcome():
    workflow = chain(
        Step("tests.accumulate", {"n": 1}),
        Step("tests.accumulate", {"n": 2}),
        Step("tests.accumulate", {"n": 3}),
    ).enqueue()

    runs = drain()

    assert [run.status for run in runs] == ["completed"] * 3
    assert [run.result["total"] for run in runs] == [1, 3, 6]  # each released by the last
    rows = Job.objects.filter(pk__in=[j.pk for j in workflow.jobs])
    assert {(row.status, row.attempts) for row in rows} == {(JobStatus.COMPLETED, 1)}


def test_a_retry_is_not_due_during_a_drain_unless_delayed_jobs_are_included():
    later = enqueue("tests.retry_later", {"delay": 3600})

    (run,) = drain()

    assert (run.status, run.retry_in) == ("pending", 3600.0)
    row = Job.objects.get(pk=later.pk)
    assert (row.status, row.attempts) == (JobStatus.PENDING, 1)

    (second,) = drain(include_delayed=True)
    assert second.status == "completed"  # tests.retry_later succeeds from attempt 2
    assert Job.objects.get(pk=later.pk).status == JobStatus.COMPLETED


def test_with_delayed_jobs_included_a_failing_job_runs_until_its_attempts_are_spent():
    failing = enqueue("tests.fail")  # max_attempts=3
    delayed = enqueue("tests.returns", {"n": 1}, delay=3600)

    assert drain(job_types="tests.returns") == []
    runs = drain(include_delayed=True)

    assert sorted(run.status for run in runs) == ["completed", "failed", "pending", "pending"]
    assert Job.objects.get(pk=failing.pk).status == JobStatus.FAILED
    assert Job.objects.get(pk=delayed.pk).result == {"doubled": 2}


def test_drain_takes_only_the_queues_and_job_types_it_is_given():
    enqueue("tests.returns", {"n": 1}, queue="mail")
    other = enqueue("tests.returns", {"n": 2}, queue="default")
    noop = enqueue("tests.noop", queue="mail")

    runs = drain(queues=["mail"], job_types="tests.returns")

    assert [run.result for run in runs] == [{"doubled": 2}]
    assert Job.objects.get(pk=other.pk).status == JobStatus.PENDING
    assert Job.objects.get(pk=noop.pk).status == JobStatus.PENDING


def test_a_drain_without_end_stops_at_max_runs_and_gives_the_next_job_back(forever_job):
    enqueue("tests.kit_forever")

    with pytest.raises(AssertionError, match="drain\\(\\) ran 5 jobs and more are due"):
        drain(max_runs=5)

    assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 5
    waiting = Job.objects.get(status=JobStatus.PENDING)
    assert (waiting.attempts, waiting.worker_id) == (0, None)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"queues": []}, "queues"),
        ({"queues": ["bad queue!"]}, "queues"),
        ({"job_types": "bad type!"}, "job_types"),
        ({"max_runs": 0}, "max_runs"),
        ({"max_runs": True}, "max_runs"),
    ],
)
def test_bad_drain_arguments_are_refused(arguments, field):
    with pytest.raises(InvalidJobError) as excinfo:
        drain(**arguments)

    assert excinfo.value.field == field


class DrainInATestCase(TestCase):
    databases = "__all__"

    def test_an_async_handlers_orm_calls_see_the_test_transaction(self):
        job("tests.kit_read_order")(read_order)
        self.addCleanup(registry.unregister, "tests.kit_read_order")
        order = Order.objects.create(reference="A-1")  # not committed: the test's own
        enqueue("tests.kit_read_order", {"order": order.pk})

        (run,) = drain()

        self.assertEqual((run.status, run.result), ("completed", {"reference": "A-1"}))

    def test_drain_runs_the_jobs_of_the_test_transaction(self):
        enqueued = enqueue("tests.returns", {"n": 4})

        (run,) = drain()

        self.assertEqual(run.result, {"doubled": 8})
        self.assertEqual(Job.objects.get(pk=enqueued.pk).status, JobStatus.COMPLETED)


# -- immediate() --------------------------------------------------------------------------


def test_in_autocommit_an_enqueued_job_runs_at_once():
    with immediate() as runs:
        enqueued = enqueue("tests.returns", {"n": 5})
        assert [run.result for run in runs] == [{"doubled": 10}]

    assert Job.objects.get(pk=enqueued.pk).status == JobStatus.COMPLETED


def test_a_job_runs_when_its_transaction_commits_and_not_if_it_rolls_back():
    with immediate() as runs:
        with transaction.atomic():
            kept = enqueue("tests.returns", {"n": 1})
            assert runs == []  # not committed yet
        assert [run.job.id for run in runs] == [kept.id]

        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue("tests.returns", {"n": 2})
            raise RuntimeError("rolled back")
    assert len(runs) == 1


def test_the_jobs_a_job_releases_run_in_the_same_commit():
    with immediate() as runs:
        chain(Step("tests.accumulate", {"n": 1}), Step("tests.accumulate", {"n": 2})).enqueue()

    assert [run.result["total"] for run in runs] == [1, 3]


def test_a_failed_attempt_raises_in_the_test_with_its_traceback():
    with immediate(), pytest.raises(JobFailedError) as excinfo:
        enqueue("tests.fail")

    message = str(excinfo.value)
    assert "(tests.fail) failed on attempt 1 (it would be retried): RuntimeError: boom" in message
    assert "Traceback (most recent call last)" in message


def test_failures_can_be_left_to_the_runs():
    with immediate(raise_errors=False) as runs:
        enqueue("tests.fail_now")

    assert [(run.status, run.error) for run in runs] == [
        ("failed", "FailJob: the input is unusable")
    ]


def test_immediate_refuses_to_run_outside_a_test_environment(monkeypatch):
    monkeypatch.delattr(mail, "outbox")

    with pytest.raises(ImproperlyConfigured), immediate():
        pass


class ImmediateInATestCase(TestCase):
    databases = "__all__"

    @immediate()
    def test_jobs_run_with_the_on_commit_callbacks(self):
        with self.captureOnCommitCallbacks(execute=True):
            enqueued = enqueue("tests.returns", {"n": 3})
            self.assertEqual(Job.objects.get(pk=enqueued.pk).status, JobStatus.PENDING)

        self.assertEqual(Job.objects.get(pk=enqueued.pk).result, {"doubled": 6})
