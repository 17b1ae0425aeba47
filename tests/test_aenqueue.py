"""``aenqueue`` and ``aenqueue_many``: the enqueue API for async code, run in Django's
thread for sync code (here the test's, through ``async_to_sync``), on its connection."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from django_pgqueue import InvalidJobError, aenqueue, aenqueue_many
from django_pgqueue.models import Job, JobStatus

pytestmark = pytest.mark.django_db


def test_aenqueue_inserts_a_job_as_enqueue_does():
    job = async_to_sync(aenqueue)("tests.noop", {"n": 1}, queue="emails", priority=5)

    stored = Job.objects.get(pk=job.pk)
    assert (stored.job_type, stored.data, stored.queue, stored.priority) == (
        "tests.noop",
        {"n": 1},
        "emails",
        5,
    )
    assert stored.status == JobStatus.PENDING


def test_aenqueue_returns_the_holder_of_a_unique_key():
    first = async_to_sync(aenqueue)("tests.noop", unique_key="nightly")
    again = async_to_sync(aenqueue)("tests.noop", unique_key="nightly")

    assert again.pk == first.pk
    assert Job.objects.count() == 1


def test_aenqueue_many_inserts_every_job_in_order():
    async def enqueue_three() -> list[Job]:
        return await aenqueue_many({"job_type": "tests.noop", "data": {"n": n}} for n in range(3))

    jobs = async_to_sync(enqueue_three)()

    assert [job.data for job in jobs] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert list(Job.objects.order_by("created_at").values_list("pk", flat=True)) == [
        job.pk for job in jobs
    ]


def test_bad_input_raises_the_same_error_and_writes_nothing():
    with pytest.raises(InvalidJobError) as raised:
        async_to_sync(aenqueue)("tests.noop", priority="high")
    assert raised.value.field == "priority"

    with pytest.raises(InvalidJobError) as raised:
        async_to_sync(aenqueue_many)([{"job_type": "tests.noop"}, {"job_type": "tests.nobody"}])
    assert raised.value.field == "specs[1].job_type"

    assert not Job.objects.exists()
