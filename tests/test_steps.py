"""Durable steps: ``job.step(name, func, ...)`` runs ``func`` once per job and name, and
every later attempt gets its stored result back."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import enqueue, job
from django_pgqueue.exceptions import InvalidArgumentError, RetryJob, StepError
from django_pgqueue.models import Job, JobStatus, JobStep
from django_pgqueue.pruning import prune_jobs
from django_pgqueue.recovery import recover_stale_jobs
from django_pgqueue.testing import drain, run_job
from tests.testapp.models import Execution
from tests.workers import WorkerProcess, run_until_finished

#: What the steps' functions did, in order, for the tests to read.
calls: list = []


@pytest.fixture(autouse=True)
def _fresh_calls():
    calls.clear()


def charge(order_id: int) -> dict:
    calls.append(f"charge {order_id}")
    return {"charge_id": f"ch_{order_id}", "amount": (12, 50)}


def email(charge_id: str) -> None:
    calls.append(f"email {charge_id}")


def record_attempt(job_: Job) -> None:
    """A write of the attempt, in the jobs database (tests.testapp's Execution)."""
    Execution.objects.create(
        job_id=job_.id,
        worker_id="w",
        attempt=job_.attempts,
        started_at=job_.started_at,
        finished_at=job_.started_at,
    )


@pytest.fixture
def checkout(clean_registry):
    """``tests.checkout``: charge, then email; the first attempt fails after the charge."""

    @job("tests.checkout", max_attempts=3)
    def checkout_handler(job_):
        charged = job_.step("charge", charge, job_.data["order_id"])
        calls.append((f"attempt {job_.attempts} got", charged))
        if job_.attempts == 1:
            raise RetryJob("the mail server is down", delay=0)
        job_.step("email", email, charged["charge_id"])
        return charged

    return checkout_handler


@pytest.mark.django_db(transaction=True)
def test_a_step_that_committed_is_not_run_again_by_a_retry(checkout):
    done = run_until_finished(enqueue("tests.checkout", {"order_id": 7}))

    stored = {"charge_id": "ch_7", "amount": [12, 50]}
    assert calls == [
        "charge 7",
        ("attempt 1 got", stored),  # through JSON the first time too: a list, not a tuple
        ("attempt 2 got", stored),
        "email ch_7",
    ]
    assert done.status == JobStatus.COMPLETED and done.result == stored
    steps = list(JobStep.objects.filter(job=done).values_list("name", "attempt", "result"))
    assert steps == [("charge", 1, stored), ("email", 2, None)]


@pytest.mark.django_db(transaction=True)
def test_a_plain_step_survives_the_rollback_of_its_atomic_handler(clean_registry):
    @job("tests.rolled_back", max_attempts=2)  # atomic: the handler's transaction
    def rolled_back(job_):
        job_.step("charge", charge, 1)
        record_attempt(job_)
        if job_.attempts == 1:
            raise RetryJob("try again", delay=0)

    run_until_finished(enqueue("tests.rolled_back"))

    assert calls == ["charge 1"]
    # The first attempt's own write rolled back with it; the checkpoint did not.
    assert list(Execution.objects.values_list("attempt", flat=True)) == [2]


@pytest.mark.django_db(transaction=True)
def test_a_step_that_raised_stores_nothing_and_runs_again(clean_registry):
    @job("tests.flaky_step", max_attempts=3)
    def flaky_step(job_):
        def call_gateway():
            calls.append(f"gateway, attempt {job_.attempts}")
            if job_.attempts == 1:
                raise ConnectionError("gateway timeout")
            return "ok"

        return job_.step("gateway", call_gateway)

    done = run_until_finished(enqueue("tests.flaky_step"))

    assert calls == ["gateway, attempt 1", "gateway, attempt 2"]
    assert done.result == "ok"
    assert list(JobStep.objects.filter(job=done).values_list("attempt", flat=True)) == [2]


@pytest.mark.django_db(transaction=True)
def test_steps_are_found_by_name_when_the_code_around_them_changes(clean_registry):
    @job("tests.reordered", max_attempts=2)
    def reordered(job_):
        names = ["a", "b"] if job_.attempts == 1 else ["b", "new", "a"]
        results = [
            job_.step(name, calls.append, f"{name} in attempt {job_.attempts}") for name in names
        ]
        if job_.attempts == 1:
            raise RetryJob("again", delay=0)
        return results

    run_until_finished(enqueue("tests.reordered"))

    assert calls == ["a in attempt 1", "b in attempt 1", "new in attempt 2"]


@pytest.mark.django_db(transaction=True)
def test_an_atomic_step_happens_once_when_its_worker_is_killed_right_after_it():
    crashing = enqueue("tests.steps.crash_after_step", {"crash": True})

    worker = WorkerProcess("--burst")
    try:
        assert worker.wait(timeout=60) < 0, worker.output()  # killed by SIGKILL
    finally:
        worker.stop()
    time.sleep(0.05)
    recover_stale_jobs(stale_after=0.01)
    done = run_until_finished(crashing)

    assert done.status == JobStatus.COMPLETED and done.attempts == 2
    assert Execution.objects.filter(job_id=crashing.id).count() == 1
    (step,) = JobStep.objects.filter(job=crashing)
    assert (step.name, step.attempt) == ("record", 1)


@pytest.mark.django_db(transaction=True)
def test_an_atomic_steps_writes_and_checkpoint_roll_back_together(clean_registry):
    @job("tests.atomic_fails", max_attempts=2, atomic=False)
    def atomic_fails(job_):
        def write_then_fail():
            record_attempt(job_)
            if job_.attempts == 1:
                raise ValueError("after the write")
            return job_.attempts

        return job_.step("write", write_then_fail, atomic=True)

    done = run_until_finished(enqueue("tests.atomic_fails"))

    assert done.result == 2
    assert list(Execution.objects.values_list("attempt", flat=True)) == [2]


@pytest.mark.django_db
def test_drain_in_the_tests_transaction_keeps_the_checkpoints(checkout):
    enqueue("tests.checkout", {"order_id": 9})

    runs = drain(include_delayed=True)

    assert [run.status for run in runs] == ["pending", "completed"]
    assert calls.count("charge 9") == 1


@pytest.mark.django_db
def test_run_job_runs_every_step_and_stores_nothing(checkout):
    first = run_job("tests.checkout", {"order_id": 3})
    second = run_job("tests.checkout", {"order_id": 3}, attempt=2)

    assert (first.status, second.status) == ("pending", "completed")
    assert calls.count("charge 3") == 2
    assert not JobStep.objects.exists()


@pytest.mark.django_db
def test_a_step_outside_a_running_job_is_refused(clean_registry):
    pending = enqueue("tests.noop")

    with pytest.raises(
        StepError, match=r"is pending: steps, sleeps and waits run inside the handler"
    ):
        pending.step("charge", charge, 1)
    assert calls == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "name: must not be empty"),
        (7, "name: must be a string, got int"),
        ("x" * 201, "name: must be at most 200 characters"),
        ("a\x00b", "name: must not contain NUL characters"),
    ],
)
def test_a_bad_step_name_is_refused_before_the_step_runs(clean_registry, name, message):
    errors = []

    @job("tests.bad_name", max_attempts=1)
    def bad_name(job_):
        try:
            job_.step(name, charge, 1)
        except InvalidArgumentError as exc:
            errors.append(str(exc))

    run_job("tests.bad_name")

    assert calls == [] and len(errors) == 1 and errors[0].startswith(message)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("result", "message"),
    [
        (object(), "result: must be JSON-serialisable"),
        (float("nan"), "result: is nan, not a JSON number"),
        ("x" * 70_000, "result: is 70002 bytes of JSON, over the limit of 65536"),
    ],
)
def test_a_result_that_cannot_be_stored_fails_the_step(clean_registry, result, message):
    @job("tests.bad_result", max_attempts=1)
    def bad_result(job_):
        job_.step("produce", lambda: result)

    run = run_job("tests.bad_result")

    assert run.status == "failed"
    assert run.error.startswith(f"InvalidJobError: {message}")


@pytest.mark.django_db
def test_a_name_used_twice_in_one_attempt_is_an_error(clean_registry):
    @job("tests.twice", max_attempts=1)
    def twice(job_):
        job_.step("charge", charge, 1)
        job_.step("charge", charge, 2)

    run = run_job("tests.twice")

    assert run.status == "failed"
    assert "'charge' was already used in this attempt" in run.error
    assert calls == ["charge 1"]


@pytest.mark.django_db(transaction=True)
def test_deleting_jobs_deletes_their_checkpoints_only(checkout):
    done = [run_until_finished(enqueue("tests.checkout", {"order_id": n})) for n in (5, 6, 7)]
    kept = JobStep.objects.filter(job_id=done[2].pk)
    assert kept.count() == 2

    with connection.cursor() as cursor:  # SQL, one statement for two jobs
        cursor.execute("DELETE FROM pgqueue_jobs WHERE id = ANY(%s)", [[done[0].pk, done[1].pk]])

    assert set(JobStep.objects.values_list("job_id", flat=True)) == {done[2].pk}

    Job.objects.filter(pk=done[2].pk).delete()  # the ORM

    assert not JobStep.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_pruning_a_finished_job_deletes_its_checkpoints(checkout):
    old, recent = (run_until_finished(enqueue("tests.checkout", {"order_id": n})) for n in (1, 2))
    Job.objects.filter(pk=old.pk).update(completed_at=timezone.now() - timedelta(days=30))

    assert prune_jobs(7 * 86400) == 1

    assert set(JobStep.objects.values_list("job_id", flat=True)) == {recent.pk}


@pytest.mark.django_db(transaction=True)
def test_the_jobs_page_lists_its_steps_and_a_job_without_steps_has_none(checkout, admin_client):
    done = run_until_finished(enqueue("tests.checkout", {"order_id": 8}))
    plain = enqueue("tests.noop")

    page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[done.pk]))
    other = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[plain.pk]))

    html = page.content.decode()
    assert html.count('<tr class="pgqueue-step">') == 2
    assert "<td><code>charge</code></td><td>Step</td><td>1</td>" in html
    assert "<td><code>email</code></td><td>Step</td><td>2</td>" in html
    assert "&quot;charge_id&quot;: &quot;ch_8&quot;" in html
    assert "pgqueue-steps" not in other.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(("unflushed", "setting"), [(True, "off"), (False, "on")])
def test_a_plain_checkpoints_commit_does_not_wait_for_the_disk(unflushed, setting):
    # Plain steps are at least once: their checkpoint's own transaction commits with
    # synchronous_commit off (the job's outcome, committed after it, waits for the disk).
    # An atomic step's is written in the caller's transaction, whose commit it leaves as
    # it was. Read here inside the test's transaction, where the function's setting stays.
    from django_pgqueue import steps

    held = enqueue("tests.noop")
    Job.objects.filter(pk=held.pk).update(status="running", worker_id="w", attempts=1)
    held.refresh_from_db()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit = on")
        params = steps._params(held, "only", "step", "null", None, 0.0, unflushed)
        assert steps._write(connection, params)
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == setting
    assert JobStep.objects.get(job=held).name == "only"


@pytest.mark.django_db
def test_no_checkpoint_is_written_for_an_attempt_that_lost_its_job():
    from django_pgqueue import steps

    held = enqueue("tests.noop")
    Job.objects.filter(pk=held.pk).update(status="running", worker_id="w", attempts=2)
    held.refresh_from_db()
    for worker_id, attempts in (("other", 2), ("w", 1)):
        held.worker_id, held.attempts = worker_id, attempts
        assert not steps._write(connection, steps._params(held, "s", "step", "1", None, 0.0))
    assert not JobStep.objects.filter(job=held).exists()


@pytest.mark.django_db
def test_the_jobs_of_one_claim_read_their_checkpoints_in_one_query():
    import pickle

    from django.test.utils import CaptureQueriesContext

    from django_pgqueue import steps

    jobs = [enqueue("tests.noop") for _ in range(3)]
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
        status="running", worker_id="w", attempts=1
    )
    for held in jobs:
        held.refresh_from_db()
    for number, held in enumerate(jobs[:2]):
        steps._write(connection, steps._params(held, "charge", "step", str(number), None, 0.0))
    steps.prepare_claimed(jobs, None)
    with CaptureQueriesContext(connection) as queries:
        results = [held.step("charge", lambda: "ran") for held in jobs]
        assert results == [0, 1, "ran"]
    reads = [query for query in queries if "FROM pgqueue_job_steps" in query["sql"]]
    assert len(reads) == 1
    # A job sent to a child process reads its own checkpoints there.
    fresh = Job.objects.get(pk=jobs[1].pk)
    fresh.__dict__["_steps_batch"] = pickle.loads(pickle.dumps(jobs[1].__dict__["_steps_batch"]))
    assert fresh.step("charge", lambda: "ran") == 1
