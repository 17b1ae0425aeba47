"""``unique_for``: a job with the key enqueued within the window holds it, finished or
not (but cancelled); without it only active jobs hold a key."""

from __future__ import annotations

import pickle
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.db import connection

from django_pgqueue import DuplicateJobError, InvalidJobError, enqueue, enqueue_many, job, registry
from django_pgqueue.models import Job, JobStatus

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def finished(make_job, status=JobStatus.COMPLETED, age=timedelta(minutes=10), **fields):
    """A job with key ``"k"`` that finished, enqueued ``age`` ago."""
    return make_job(unique_key="k", status=status, created_at=db_now() - age, **fields)


@pytest.mark.parametrize("status", [JobStatus.COMPLETED, JobStatus.FAILED])
def test_a_job_finished_within_the_window_holds_its_key(make_job, status):
    holder = finished(make_job, status)

    found = enqueue("tests.noop", unique_key="k", unique_for=HOUR)

    assert found.pk == holder.pk
    assert Job.objects.count() == 1


def test_a_cancelled_job_does_not_hold_its_key(make_job):
    finished(make_job, JobStatus.CANCELLED)

    new = enqueue("tests.noop", unique_key="k", unique_for=HOUR)

    assert new.status == JobStatus.PENDING
    assert Job.objects.count() == 2


def test_a_job_enqueued_before_the_window_no_longer_holds_its_key(make_job):
    finished(make_job, age=timedelta(hours=2))

    new = enqueue("tests.noop", unique_key="k", unique_for=HOUR)

    assert Job.objects.filter(status=JobStatus.PENDING).get() == new


def test_without_unique_for_a_finished_job_does_not_hold_its_key(make_job):
    finished(make_job)

    new = enqueue("tests.noop", unique_key="k")

    assert new.status == JobStatus.PENDING


def test_an_active_holder_is_returned_before_a_finished_one(make_job):
    finished(make_job)
    active = make_job(unique_key="k", created_at=db_now() - timedelta(hours=5))

    assert enqueue("tests.noop", unique_key="k", unique_for=HOUR).pk == active.pk


def test_the_newest_finished_job_in_the_window_is_returned(make_job):
    finished(make_job, age=timedelta(minutes=50))
    newest = finished(make_job, age=timedelta(minutes=5))

    assert enqueue("tests.noop", unique_key="k", unique_for=HOUR).pk == newest.pk


def test_raise_names_the_finished_holder_and_the_window(make_job):
    holder = finished(make_job)

    with pytest.raises(DuplicateJobError) as excinfo:
        enqueue("tests.noop", unique_key="k", unique_for=HOUR, on_duplicate="raise")

    error = excinfo.value
    assert (error.job_id, error.window) == (holder.id, 3600.0)
    assert str(error) == (
        f"unique_key 'k' is held by job {holder.id} (completed), enqueued within unique_for "
        "(3600s); wait for the window to pass, or pass on_duplicate='return' to get that "
        "job instead"
    )
    again = pickle.loads(pickle.dumps(error))
    assert (again.job_id, again.window, str(again)) == (holder.id, 3600.0, str(error))


def test_replace_returns_a_finished_holder_as_it_is(make_job):
    holder = finished(make_job, data={"v": 1})

    found = enqueue("tests.noop", {"v": 2}, unique_key="k", unique_for=HOUR, on_duplicate="replace")

    assert found.pk == holder.pk
    assert Job.objects.get().data == {"v": 1}


def test_one_statement_with_or_without_a_holder(make_job, django_assert_num_queries):
    with django_assert_num_queries(1):
        enqueue("tests.noop", unique_key="k", unique_for=60)
    with django_assert_num_queries(1):
        enqueue("tests.noop", unique_key="k", unique_for=60)


# -- enqueue_many ------------------------------------------------------------------------


def test_enqueue_many_applies_each_specs_window(make_job):
    held = finished(make_job)
    free = make_job(unique_key="free", status=JobStatus.COMPLETED, created_at=db_now() - HOUR)

    jobs = enqueue_many(
        [
            {"job_type": "tests.noop", "unique_key": "k", "unique_for": HOUR},
            {"job_type": "tests.noop", "unique_key": "free", "unique_for": timedelta(minutes=30)},
            {"job_type": "tests.noop", "unique_key": "no-window"},
            {"job_type": "tests.noop"},
        ]
    )

    assert jobs[0].pk == held.pk
    assert jobs[1].pk != free.pk and jobs[1].status == JobStatus.PENDING
    assert [job.status for job in jobs[2:]] == [JobStatus.PENDING, JobStatus.PENDING]
    assert Job.objects.count() == 5


def test_enqueue_many_raise_rejects_the_batch_for_a_key_held_within_its_window(make_job):
    holder = finished(make_job)

    with pytest.raises(DuplicateJobError) as excinfo:
        enqueue_many(
            [
                {"job_type": "tests.noop", "unique_key": "other"},
                {"job_type": "tests.noop", "unique_key": "k", "unique_for": HOUR},
            ],
            on_duplicate="raise",
        )

    assert (excinfo.value.job_id, excinfo.value.window) == (holder.id, 3600.0)
    assert Job.objects.count() == 1


# -- Defaults and bad input -------------------------------------------------------------


def test_job_type_default_window_applies_to_its_keyed_enqueues(clean_registry, make_job):
    @job("tests.windowed", unique_key=lambda data: f"w:{data['id']}", unique_for=HOUR)
    def windowed(job): ...

    holder = make_job(
        job_type="tests.windowed",
        unique_key="w:1",
        status=JobStatus.COMPLETED,
        created_at=db_now() - timedelta(minutes=1),
    )

    assert windowed.unique_for == 3600.0
    assert windowed.enqueue({"id": 1}).pk == holder.pk
    assert windowed.enqueue({"id": 1}, unique_for=30).pk != holder.pk


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be a positive duration, got 0"),
        (-5, "must be a positive duration, got -5"),
        (float("nan"), "must be a positive duration"),
        ("1h", "must be a timedelta or a number of seconds, got str"),
        (timedelta(days=365_300), "must be at most 1,000 years"),
    ],
)
def test_a_bad_window_is_rejected_before_anything_is_written(value, message):
    with pytest.raises(InvalidJobError, match=message) as single:
        enqueue("tests.noop", unique_key="k", unique_for=value)
    with pytest.raises(InvalidJobError, match=message) as batch:
        enqueue_many([{"job_type": "tests.noop", "unique_key": "k", "unique_for": value}])

    assert (single.value.field, batch.value.field) == ("unique_for", "specs[0].unique_for")
    assert not Job.objects.exists()


def test_a_window_without_a_key_is_rejected():
    with pytest.raises(InvalidJobError, match="unique_for: needs a unique_key"):
        enqueue("tests.noop", unique_for=60)
    assert not Job.objects.exists()


def test_the_decorator_rejects_a_bad_window(clean_registry):
    with pytest.raises(InvalidJobError, match="unique_for: must be a positive duration"):

        @job("tests.bad_window", unique_key="x", unique_for=0)
        def bad(job): ...

    assert registry.find_definition("tests.bad_window") is None


# -- System check W302 -------------------------------------------------------------------


def test_a_window_longer_than_the_retention_is_warned_about(clean_registry, pgqueue_settings):
    @job("tests.windowed_day", unique_key="day", unique_for=timedelta(days=1))
    def windowed(job): ...

    pgqueue_settings(RETENTION=3600, FAILED_RETENTION=timedelta(days=2))

    warnings = [m for m in run_checks() if m.id == "django_pgqueue.W302"]

    assert [w.msg for w in warnings] == [
        "job type 'tests.windowed_day' has unique_for=86400s, longer than "
        "PGQUEUE['RETENTION'] (3600s): its finished jobs are pruned before their window "
        "ends, and free their key early"
    ]


def test_a_window_within_the_retention_is_not_warned_about(clean_registry, pgqueue_settings):
    @job("tests.windowed_hour", unique_key="hour", unique_for=HOUR)
    def windowed(job): ...

    pgqueue_settings(RETENTION=HOUR, FAILED_RETENTION=None)

    assert not [m for m in run_checks() if m.id == "django_pgqueue.W302"]
