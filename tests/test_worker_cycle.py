"""One cycle of the worker's main loop against the test database, driven directly:
how a batch of outcomes is written and how claimed jobs are built."""

import datetime
import logging
import time

import pytest
from django.db import connection
from django.db.models.signals import post_init

from django_pgqueue import enqueue
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.worker import queries
from django_pgqueue.worker.execution import Outcome
from django_pgqueue.worker.finishing import (
    finish_completed_params,
    finish_params,
    finish_statement,
)
from django_pgqueue.worker.runner import Worker

pytestmark = pytest.mark.django_db(transaction=True)


class CollectingSlots:
    """Stands in for the slot threads: keeps what the cycle hands over."""

    def __init__(self):
        self.submitted = []

    def submit(self, running):
        self.submitted.append(running)


@pytest.fixture
def worker():
    worker = Worker(concurrency=4, prefetch=0, worker_id="cycle-worker", listen=False)
    yield worker
    worker._drop_connection()


def claim(worker, count):
    """Claim ``count`` due jobs as ``worker`` does; return the jobs it built."""
    slots = CollectingSlots()
    worker.batch_size = count
    worker.concurrency = count
    jobs, _ = worker._cycle(slots)
    assert [running.job for running in slots.submitted] == jobs
    return jobs


def row(job_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM pgqueue_jobs WHERE id = %s", [job_id])
        columns = [column.name for column in cursor.description]
        return dict(zip(columns, cursor.fetchone(), strict=True))


def test_plain_completions_are_written_as_the_general_statement_writes_them(worker):
    first, second = (enqueue("tests.noop", {"n": n}) for n in range(2))
    claims = {job.id: job.claimed_at for job in claim(worker, 2)}
    Job.objects.update(last_error="from an earlier attempt", last_traceback="tb")
    time.sleep(0.05)
    started = time.monotonic()  # a slot started them after their claim
    outcomes = [Outcome(first.id, "completed", claims[first.id], started=started)]
    same_for_second = [Outcome(second.id, "completed", claims[second.id], started=started)]

    assert finish_statement(outcomes, worker.worker_id)[0] == queries.FINISH_COMPLETED
    conn = worker._db()
    with conn.transaction():  # one transaction: both statements see the same now()
        conn.execute(queries.FINISH_COMPLETED, finish_completed_params(outcomes, "cycle-worker"))
        conn.execute(queries.FINISH, finish_params(same_for_second, "cycle-worker"))

    lean, general = row(first.id), row(second.id)
    # started_at: when the slot started them, on the database's clock.
    for written in (lean, general):
        assert written["claimed_at"] < written["started_at"] <= written["completed_at"]
    assert abs((lean["started_at"] - general["started_at"]).total_seconds()) < 0.05
    differ = {"id", "data", "created_at", "run_at", "claimed_at", "heartbeat_at", "started_at"}
    assert {k: v for k, v in lean.items() if k not in differ} == {
        k: v for k, v in general.items() if k not in differ
    }
    assert lean["status"] == JobStatus.COMPLETED
    assert lean["progress"] == 100
    assert lean["last_error"] == "from an earlier attempt"
    assert lean["result"] is None


def test_plain_completions_of_jobs_started_at_once_keep_the_claims_start_time(worker):
    # A job a free slot started at once has no start time of its own (started=None):
    # both statements keep the one the claim recorded.
    first, second = (enqueue("tests.noop", {"n": n}) for n in range(2))
    claims = {job.id: job.claimed_at for job in claim(worker, 2)}
    claimed_start = row(first.id)["started_at"]
    outcomes = [Outcome(job.id, "completed", claims[job.id]) for job in (first, second)]

    assert finish_statement(outcomes, worker.worker_id)[0] == queries.FINISH_COMPLETED
    conn = worker._db()
    conn.execute(queries.FINISH_COMPLETED, finish_completed_params(outcomes[:1], "cycle-worker"))
    conn.execute(queries.FINISH, finish_params(outcomes[1:], "cycle-worker"))

    assert row(first.id)["status"] == row(second.id)["status"] == JobStatus.COMPLETED
    assert row(first.id)["started_at"] == row(second.id)["started_at"] == claimed_start


@pytest.mark.parametrize(
    "other",
    [
        Outcome(None, "completed", None, result='{"n": 1}'),
        Outcome(None, "completed", None, error="the return value was not stored"),
        Outcome(None, "pending", None, delay=1.0, error="ValueError: x"),
        Outcome(None, "failed", None, error="ValueError: x"),
        Outcome(None, "cancelled", None, error="cancelled before it started"),
    ],
    ids=["result", "note", "retry", "failed", "cancelled"],
)
def test_a_batch_with_anything_but_plain_completions_uses_the_general_statement(other):
    plain = Outcome(None, "completed", None, started=time.monotonic())
    assert finish_statement([plain, other], "w")[0] == queries.FINISH
    assert finish_statement([plain], "w")[0] == queries.FINISH_COMPLETED


@pytest.mark.parametrize(
    ("second_status", "error", "statement"),
    [("completed", None, queries.FINISH_COMPLETED), ("failed", "ValueError: x", queries.FINISH)],
    ids=["plain-completions", "general"],
)
def test_an_outcome_for_a_job_taken_back_is_not_recorded_and_is_logged(
    worker, caplog, second_status, error, statement
):
    taken, kept = (enqueue("tests.noop", {"n": n}) for n in range(2))
    claims = {job.id: job.claimed_at for job in claim(worker, 2)}
    # Recovery returned the job, and another worker claimed it meanwhile.
    Job.objects.filter(id=taken.id).update(worker_id="other-worker")
    worker._outcomes = [
        Outcome(taken.id, "completed", claims[taken.id], started=time.monotonic()),
        Outcome(kept.id, second_status, claims[kept.id], started=time.monotonic(), error=error),
    ]
    assert finish_statement(worker._outcomes, worker.worker_id)[0] == statement

    with caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"):
        worker._cycle(None)

    assert worker._outcomes == []
    assert dict(worker.stats) == {second_status: 1}
    assert f"job {taken.id} was no longer held by cycle-worker" in caplog.text
    assert row(taken.id)["status"] == JobStatus.RUNNING
    assert row(taken.id)["worker_id"] == "other-worker"
    assert row(kept.id)["status"] == second_status


def test_every_outcome_written_counts_without_warning(worker, caplog):
    for n in range(3):
        enqueue("tests.noop", {"n": n})
    worker._outcomes = [
        Outcome(job.id, "completed", job.claimed_at, started=time.monotonic())
        for job in claim(worker, 3)
    ]
    with caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"):
        worker._cycle(None)
    assert dict(worker.stats) == {"completed": 3}
    assert "no longer held" not in caplog.text
    assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 3


@pytest.fixture
def database_time_zone():
    """Give new connections to the test database another default time zone."""
    name = connection.ops.quote_name(connection.settings_dict["NAME"])

    def set_zone(zone):
        # Inlined: a utility statement takes no parameters under server-side binding.
        assert zone.replace("/", "").replace("_", "").isalnum()
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {name} SET timezone TO '{zone}'")

    yield set_zone
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {name} RESET timezone")


def test_claimed_jobs_carry_utc_datetimes_as_the_orm_loads_them(worker, database_time_zone):
    database_time_zone("America/New_York")
    enqueued = enqueue("tests.noop", {"n": 1})
    [claimed] = claim(worker, 1)
    loaded = Job.objects.get(id=enqueued.id)
    for name in ("created_at", "run_at", "claimed_at", "started_at", "heartbeat_at"):
        value = getattr(claimed, name)
        assert value == getattr(loaded, name), name
        assert value.tzinfo is datetime.UTC, name


def test_claimed_jobs_are_built_through_init_when_init_signals_listen(worker):
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance)

    job = enqueue("tests.noop", {"n": 7, "label": "123"})
    Job.objects.filter(id=job.id).update(result="123")  # a JSON string of digits
    post_init.connect(receiver, sender=Job)
    try:
        [claimed] = claim(worker, 1)
    finally:
        post_init.disconnect(receiver, sender=Job)
    assert seen == [claimed]
    assert claimed.id == job.id
    assert claimed.data == {"n": 7, "label": "123"}
    assert claimed.result == "123"
    assert claimed.worker_ids == ["cycle-worker"]
    assert claimed.status == JobStatus.RUNNING
    assert not claimed._state.adding
    assert claimed._state.db == "default"


def test_claimed_jobs_without_init_signals_are_complete_instances(worker):
    job = enqueue("tests.noop", {"n": 8})
    Job.objects.filter(id=job.id).update(result="456")
    [claimed] = claim(worker, 1)
    assert claimed.get_deferred_fields() == set()
    assert claimed.data == {"n": 8}
    assert claimed.result == "456"
    assert not claimed._state.adding
    assert claimed._state.db == "default"
    loaded = Job.objects.get(id=job.id)
    for field in Job._meta.concrete_fields:
        assert getattr(claimed, field.attname) == getattr(loaded, field.attname), field.attname
