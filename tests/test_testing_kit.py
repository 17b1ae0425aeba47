"""``django_pgqueue.testing``: asserting, in a project's tests, which jobs it enqueued."""

from __future__ import annotations

import pytest
from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import TestCase

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.testing import (
    assert_enqueued,
    capture_jobs,
    enqueued_jobs,
    refute_enqueued,
)


@pytest.mark.django_db
def test_assert_enqueued_finds_jobs_by_type_queue_and_payload_and_returns_them():
    first = enqueue("tests.record", {"order": {"id": 7, "lines": 2}, "note": "x"}, queue="mail")
    enqueue("tests.record", {"order": {"id": 8}})

    assert assert_enqueued(job_type="tests.record", data={"order": {"id": 7}}) == [first]
    assert assert_enqueued(queue="mail", count=1) == [first]
    assert len(assert_enqueued(job_type="tests.record", count=2)) == 2
    assert enqueued_jobs(data={"order": {"id": 9}}) == []


@pytest.mark.django_db
def test_a_failed_assertion_lists_the_pending_jobs():
    enqueue("tests.record", {"order": 7}, queue="mail")

    with pytest.raises(AssertionError) as missing:
        assert_enqueued(job_type="tests.record", data={"order": 8})
    with pytest.raises(AssertionError) as too_few:
        assert_enqueued(job_type="tests.record", count=2)

    assert str(missing.value) == (
        "expected a job enqueued matching job_type='tests.record', data={'order': 8}, "
        "found 0.\nPending jobs:\n  tests.record queue='mail' data={'order': 7}"
    )
    assert str(too_few.value).startswith(
        "expected 2 job(s) enqueued matching job_type='tests.record', found 1."
    )


@pytest.mark.django_db
def test_only_pending_jobs_count_as_enqueued(make_job):
    make_job(job_type="tests.record", status="completed")
    make_job(job_type="tests.record", status="running", worker_id="w")

    refute_enqueued(job_type="tests.record")
    with pytest.raises(AssertionError, match="No job is pending"):
        assert_enqueued(job_type="tests.record")


@pytest.mark.django_db
def test_refute_enqueued_fails_on_a_match_and_names_it():
    enqueue("tests.record", {"order": 7})

    refute_enqueued(job_type="tests.noop")
    with pytest.raises(AssertionError) as found:
        refute_enqueued(data={"order": 7})
    assert "expected no job enqueued matching data={'order': 7}, found 1." in str(found.value)


@pytest.mark.django_db
def test_capture_jobs_collects_what_the_block_enqueued_in_order():
    enqueue("tests.noop")  # before: not captured

    with capture_jobs() as jobs:
        one = enqueue("tests.record", {"n": 1}, unique_key="k")
        enqueue("tests.record", {"n": 2}, unique_key="k", on_duplicate="return")  # no insert
        many = enqueue_many([{"job_type": "tests.noop"}, {"job_type": "tests.fail"}])

    enqueue("tests.noop")  # after: not captured either
    assert jobs == [one, *many]


@pytest.mark.django_db(transaction=True)
def test_capture_jobs_keeps_what_was_asked_for_even_if_rolled_back():
    with capture_jobs() as jobs, transaction.atomic():
        enqueue("tests.noop")
        transaction.set_rollback(True)

    assert [job.job_type for job in jobs] == ["tests.noop"]
    refute_enqueued(job_type="tests.noop")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"data": ["order"]}, "data must be a dict"),
        ({"count": -1}, "count must be an integer of 0 or more"),
        ({"count": True}, "count must be an integer of 0 or more"),
    ],
)
def test_bad_arguments_are_refused(arguments, message):
    with pytest.raises(TypeError, match=message):
        assert_enqueued(**arguments)


def test_the_kit_refuses_to_run_outside_a_test_environment(monkeypatch):
    monkeypatch.delattr(mail, "outbox")

    for use in (lambda: enqueued_jobs(), lambda: capture_jobs().__enter__()):
        with pytest.raises(ImproperlyConfigured, match=r"django_pgqueue\.testing is for tests"):
            use()


class InATestCase(TestCase):
    databases = "__all__"

    def test_the_kit_reads_the_test_cases_own_transaction(self):
        with capture_jobs() as jobs:
            enqueue("tests.record", {"user": 3})

        self.assertEqual(len(jobs), 1)
        self.assertEqual(assert_enqueued(data={"user": 3}), jobs)
        refute_enqueued(data={"user": 4})
