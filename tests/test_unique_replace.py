"""``on_duplicate="replace"``: a pending job holding the key takes the new payload and run
time (debounce); a claimed or running one is returned as it is."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction

from django_pgqueue import enqueue, enqueue_many, signals
from django_pgqueue.models import Job, JobStatus

pytestmark = pytest.mark.django_db


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_replace_gives_a_pending_holder_the_new_payload_and_run_time():
    holder = enqueue("tests.noop", {"v": 1}, unique_key="k", delay=60)

    replaced = enqueue("tests.noop", {"v": 2}, unique_key="k", delay=600, on_duplicate="replace")

    assert replaced.pk == holder.pk
    assert (replaced.data, replaced.run_at) == ({"v": 2}, db_now() + timedelta(seconds=600))
    stored = Job.objects.get()
    assert (stored.data, stored.run_at, stored.status) == (
        {"v": 2},
        replaced.run_at,
        JobStatus.PENDING,
    )


def test_replace_can_bring_a_delayed_holder_forward():
    enqueue("tests.noop", unique_key="k", delay=3600)

    replaced = enqueue("tests.noop", unique_key="k", on_duplicate="replace")

    assert replaced.run_at == db_now()


def test_replace_keeps_everything_but_the_payload_and_the_run_time(make_job):
    holder = make_job(
        unique_key="k", queue="first", priority=10, attempts=1, last_error="RuntimeError: x"
    )

    replaced = enqueue(
        "tests.record",
        {"v": 2},
        unique_key="k",
        queue="other",
        priority=500,
        max_attempts=9,
        on_duplicate="replace",
    )

    assert replaced.pk == holder.pk
    assert (replaced.job_type, replaced.queue, replaced.priority) == ("tests.noop", "first", 10)
    assert (replaced.attempts, replaced.max_attempts) == (1, holder.max_attempts)
    assert replaced.last_error == "RuntimeError: x"


@pytest.mark.parametrize("status", [JobStatus.CLAIMED, JobStatus.RUNNING])
def test_replace_returns_a_claimed_or_running_holder_as_it_is(make_job, status):
    holder = make_job(unique_key="k", status=status, worker_id="w", data={"v": 1})

    found = enqueue("tests.noop", {"v": 2}, unique_key="k", on_duplicate="replace")

    assert found.pk == holder.pk
    assert found.data == {"v": 1}
    assert Job.objects.get().data == {"v": 1}


def test_replace_inserts_when_the_key_is_free(make_job):
    make_job(unique_key="k", status=JobStatus.COMPLETED, data={"v": 1})

    new = enqueue("tests.noop", {"v": 2}, unique_key="k", on_duplicate="replace")

    assert Job.objects.get(status=JobStatus.PENDING) == new
    assert new.data == {"v": 2}


def test_a_replace_takes_two_statements(django_assert_num_queries):
    enqueue("tests.noop", unique_key="k", delay=60)

    with django_assert_num_queries(2):
        enqueue("tests.noop", {"v": 2}, unique_key="k", on_duplicate="replace")


def test_a_holder_claimed_before_the_replace_is_returned_unchanged(other_connection):
    holder = enqueue("tests.noop", {"v": 1}, unique_key="k", delay=60)
    claimed = []

    def claim_first(execute, sql, params, many, context):
        # Between finding the pending holder and replacing it, a worker claims it.
        if sql.lstrip().startswith("WITH inserted AS (\n    UPDATE") and not claimed:
            claimed.append(holder.id)
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE pgqueue_jobs SET status = 'running', worker_id = 'w' WHERE id = %s",
                    [holder.id],
                )
        return execute(sql, params, many, context)

    with connection.execute_wrapper(claim_first):
        found = enqueue("tests.noop", {"v": 2}, unique_key="k", on_duplicate="replace")

    assert claimed == [holder.id]
    assert found.pk == holder.pk
    assert (found.status, found.data) == (JobStatus.RUNNING, {"v": 1})


def test_rolling_back_a_replace_restores_the_holder():
    holder = enqueue("tests.noop", {"v": 1}, unique_key="k", delay=60)

    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("tests.noop", {"v": 2}, unique_key="k", on_duplicate="replace")
        raise RuntimeError

    holder.refresh_from_db()
    assert holder.data == {"v": 1}


def test_a_replace_sends_no_job_enqueued_signal():
    enqueue("tests.noop", unique_key="k", delay=60)
    sent = []

    def receiver(sender, job, **kwargs):
        sent.append(job)

    signals.job_enqueued.connect(receiver)
    try:
        enqueue("tests.noop", {"v": 2}, unique_key="k", on_duplicate="replace")
    finally:
        signals.job_enqueued.disconnect(receiver)

    assert sent == []


# -- enqueue_many -------------------------------------------------------------------------


def test_enqueue_many_replace_takes_the_last_spec_of_each_key(make_job):
    pending = make_job(unique_key="held", data={"v": 0})
    running = make_job(unique_key="busy", status=JobStatus.RUNNING, worker_id="w", data={"v": 0})

    jobs = enqueue_many(
        [
            {"job_type": "tests.noop", "data": {"v": 1}, "unique_key": "new"},
            {"job_type": "tests.noop", "data": {"v": 2}, "unique_key": "held", "delay": 30},
            {"job_type": "tests.noop", "data": {"v": 3}, "unique_key": "new"},
            {"job_type": "tests.noop", "data": {"v": 4}, "unique_key": "busy"},
            {"job_type": "tests.noop", "data": {"v": 5}},
            {"job_type": "tests.noop", "data": {"v": 6}, "unique_key": "held", "delay": 90},
        ],
        on_duplicate="replace",
    )

    new = Job.objects.get(unique_key="new")
    assert [job.pk for job in jobs] == [
        new.pk,
        pending.pk,
        new.pk,
        running.pk,
        jobs[4].pk,
        pending.pk,
    ]
    assert new.data == {"v": 3}
    pending.refresh_from_db()
    assert (pending.data, pending.run_at) == ({"v": 6}, db_now() + timedelta(seconds=90))
    running.refresh_from_db()
    assert running.data == {"v": 0}
    assert jobs[4].data == {"v": 5}
    assert Job.objects.count() == 4
