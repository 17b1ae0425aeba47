"""Durable sleeps and waits for events: ``job.sleep()``, ``job.wait_for_event()`` and
``emit_event()``. A suspended job holds no slot, spends no attempt, and resumes past the
sleep or the wait with its earlier steps answered from their checkpoints."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import connection, transaction
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import EventTimeout, JobSuspended, emit_event, enqueue, job
from django_pgqueue.exceptions import InvalidArgumentError, StepError
from django_pgqueue.models import EmittedEvent, Job, JobAttempt, JobStatus, JobStep
from django_pgqueue.pruning import prune_events
from django_pgqueue.testing import drain, run_job
from django_pgqueue.worker import Worker
from tests.workers import run_until_finished, wait_for, worker_thread

#: What the handlers did, in order, for the tests to read.
calls: list = []


@pytest.fixture(autouse=True)
def _fresh_calls():
    calls.clear()


def burst() -> None:
    Worker(burst=True, concurrency=1).run()


@pytest.fixture
def settle(clean_registry):
    """``tests.settle``: charge, sleep ``data["sleep"]`` seconds, capture."""

    @job("tests.settle", max_attempts=1, atomic=False)
    def settle_handler(job_):
        charged = job_.step("charge", lambda: calls.append("charge") or {"id": "ch_1"})
        job_.sleep("settlement", job_.data["sleep"])
        job_.step("capture", lambda: calls.append(f"capture {charged['id']}"))
        return "settled"

    return settle_handler


@pytest.fixture
def ship(clean_registry):
    """``tests.ship``: waits for ``packed:<order>`` (``data["timeout"]``), returns it."""

    @job("tests.ship", max_attempts=1, atomic=False)
    def ship_handler(job_):
        job_.step("reserve", lambda: calls.append("reserve"))
        try:
            parcel = job_.wait_for_event(
                f"packed:{job_.data['order']}", timeout=job_.data.get("timeout", 60)
            )
        except EventTimeout as exc:
            calls.append(f"timed out: {exc.event}")
            return "late"
        calls.append(("parcel", parcel))
        return parcel

    return ship_handler


@pytest.mark.django_db(transaction=True)
def test_a_sleep_suspends_the_job_and_it_resumes_past_it_without_an_attempt(settle):
    created = enqueue("tests.settle", {"sleep": 0.4})
    burst()

    sleeping = Job.objects.get(pk=created.pk)
    assert sleeping.status == JobStatus.PENDING
    assert sleeping.attempts == 0  # not spent: max_attempts=1 still lets it finish
    assert sleeping.worker_id is None
    assert sleeping.run_at > timezone.now() + timedelta(seconds=0.1)
    checkpoint = JobStep.objects.get(job=sleeping, name="settlement")
    assert checkpoint.kind == "sleep"
    assert abs((checkpoint.wake_at - sleeping.run_at).total_seconds()) < 0.2
    assert list(JobAttempt.objects.filter(job=sleeping).values_list("outcome", flat=True)) == [
        "suspended"
    ]

    done = run_until_finished(sleeping)
    assert done.status == JobStatus.COMPLETED and done.result == "settled"
    assert calls == ["charge", "capture ch_1"]  # the charge ran once, before the sleep
    assert done.attempts == 1


@pytest.mark.django_db(transaction=True)
def test_a_sleep_keeps_its_end_when_the_job_runs_again_early(settle):
    created = enqueue("tests.settle", {"sleep": 3600})
    burst()
    first_end = JobStep.objects.get(job=created, name="settlement").wake_at
    Job.objects.filter(pk=created.pk).update(run_at=timezone.now())  # "run now"

    burst()

    again = Job.objects.get(pk=created.pk)
    assert again.status == JobStatus.PENDING
    assert JobStep.objects.get(job=created, name="settlement").wake_at == first_end
    assert abs((again.run_at - first_end).total_seconds()) < 1
    assert calls == ["charge"]


@pytest.mark.django_db(transaction=True)
def test_a_wait_resumes_with_the_payload_once_the_event_is_emitted(ship):
    created = enqueue("tests.ship", {"order": 7})
    burst()
    waiting = Job.objects.get(pk=created.pk)
    assert waiting.status == JobStatus.PENDING
    assert waiting.run_at > timezone.now() + timedelta(seconds=50)
    wait = JobStep.objects.get(job=waiting, name="packed:7")
    assert (wait.kind, wait.result) == ("event", None)

    assert emit_event("packed:8", {"weight": 1}) == 0  # another order's
    assert emit_event("packed:7", {"weight": 3}) == 1

    woken = Job.objects.get(pk=created.pk)
    assert woken.run_at <= timezone.now()
    burst()
    done = Job.objects.get(pk=created.pk)
    assert done.status == JobStatus.COMPLETED and done.result == {"weight": 3}
    assert calls == ["reserve", ("parcel", {"weight": 3})]
    assert JobStep.objects.get(job=done, name="packed:7").result == {"weight": 3}


@pytest.mark.django_db(transaction=True)
def test_an_event_emitted_before_the_wait_is_received_at_once(ship):
    emit_event("packed:9", None)
    done = run_until_finished(enqueue("tests.ship", {"order": 9}), rounds=1)
    assert done.status == JobStatus.COMPLETED and done.result is None
    assert calls == ["reserve", ("parcel", None)]
    assert not JobAttempt.objects.filter(job=done).exists()  # never suspended


@pytest.mark.django_db(transaction=True)
def test_an_emit_in_a_rolled_back_transaction_wakes_nothing(ship):
    created = enqueue("tests.ship", {"order": 3})
    burst()
    run_at = Job.objects.get(pk=created.pk).run_at

    with pytest.raises(RuntimeError), transaction.atomic():
        assert emit_event("packed:3", {"weight": 1}) == 1
        raise RuntimeError("the packing failed")

    assert not EmittedEvent.objects.filter(name="packed:3").exists()
    assert Job.objects.get(pk=created.pk).run_at == run_at


@pytest.mark.django_db(transaction=True)
def test_a_wait_times_out_with_event_timeout_in_the_handler(ship):
    created = enqueue("tests.ship", {"order": 4, "timeout": 0.3})
    burst()
    assert Job.objects.get(pk=created.pk).status == JobStatus.PENDING

    done = run_until_finished(Job.objects.get(pk=created.pk))

    assert done.status == JobStatus.COMPLETED and done.result == "late"
    assert calls == ["reserve", "timed out: packed:4"]


@pytest.mark.django_db(transaction=True)
def test_an_event_emitted_while_the_waiting_job_still_runs_makes_it_due_at_once(
    clean_registry,
):
    # The emit lands after the wait was recorded and before the worker sets the job
    # pending: the worker's statement must not push the job to its timeout.
    @job("tests.racing", max_attempts=1, atomic=False)
    def racing(job_):
        try:
            return job_.wait_for_event("racing", timeout=3600)
        except JobSuspended:
            emit_event("racing", "here")  # in autocommit: committed now
            raise

    created = enqueue("tests.racing")
    burst()  # due at once, so this burst runs it again: it receives the event

    done = Job.objects.get(pk=created.pk)
    assert (done.status, done.result) == (JobStatus.COMPLETED, "here")
    assert list(JobAttempt.objects.filter(job=done).values_list("outcome", flat=True)) == [
        "suspended"
    ]


@pytest.mark.django_db(transaction=True)
def test_no_wake_up_is_lost_when_emits_race_the_waits(clean_registry):
    @job("tests.racer", max_attempts=1, atomic=False)
    def racer(job_):
        return job_.wait_for_event(f"race:{job_.data['n']}", timeout=3600)

    count = 40
    jobs = [enqueue("tests.racer", {"n": n}) for n in range(count)]

    def emit_all() -> None:
        try:
            order = list(range(count))
            random.Random(4).shuffle(order)
            for n in order:
                time.sleep(random.Random(n).random() * 0.01)
                emit_event(f"race:{n}", n)
        finally:
            connection.close()

    with worker_thread(concurrency=4, poll_interval=0.05):
        emitter = threading.Thread(target=emit_all)
        emitter.start()
        emitter.join()
        # A lost wake-up leaves its job pending until its timeout, an hour away.
        wait_for(
            lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == count, timeout=30
        )
    results = sorted(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("result", flat=True)
    )
    assert results == list(range(count))


@pytest.mark.django_db(transaction=True)
def test_async_handlers_sleep_and_wait_too(clean_registry):
    @job("tests.async_waiter", max_attempts=1, atomic=False)
    async def async_waiter(job_):
        await job_.asleep("nap", 0.2)
        return await job_.await_for_event("async-event", timeout=60)

    created = enqueue("tests.async_waiter")
    burst()
    assert JobStep.objects.get(job=created, name="nap").kind == "sleep"
    time.sleep(0.25)
    burst()
    assert JobStep.objects.get(job=created, name="async-event").result is None
    emit_event("async-event", [1, 2])
    burst()
    assert Job.objects.get(pk=created.pk).result == [1, 2]


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_waiting_job_cancels_it(ship):
    created = enqueue("tests.ship", {"order": 5})
    burst()
    assert Job.objects.filter(pk=created.pk).cancel() == 1
    assert Job.objects.get(pk=created.pk).status == JobStatus.CANCELLED
    assert emit_event("packed:5") == 0  # a cancelled job is not woken


@pytest.mark.django_db
def test_drain_runs_sleeps_with_include_delayed_and_waits_once_emitted(settle, ship):
    enqueue("tests.settle", {"sleep": 3600})
    enqueue("tests.ship", {"order": 6})

    first = drain()
    assert sorted((run.job.job_type, run.suspended) for run in first) == [
        ("tests.settle", True),
        ("tests.ship", True),
    ]
    assert drain() == []  # nothing due: one sleeps, one waits

    # include_delayed ends the sleep; the wait goes on waiting for its event.
    assert [(run.job.job_type, run.status) for run in drain(include_delayed=True)] == [
        ("tests.settle", "completed")
    ]
    emit_event("packed:6", {"weight": 2})
    ran = drain()
    assert [(run.job.job_type, run.result) for run in ran] == [("tests.ship", {"weight": 2})]
    assert calls.count("charge") == 1 and calls.count("reserve") == 1


@pytest.mark.django_db
def test_run_job_reports_a_sleep_as_suspended_and_writes_nothing(settle):
    run = run_job("tests.settle", {"sleep": 60})
    assert (run.status, run.suspended, run.error) == ("pending", True, "")
    assert 59 < run.retry_in <= 60
    assert not JobStep.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda j: j.sleep("", 1), "name: must not be empty"),
        (lambda j: j.sleep("x" * 201, 1), "name: must be at most 200 characters"),
        (lambda j: j.sleep("nap", -1), "duration"),
        (lambda j: j.sleep("nap", float("nan")), "duration"),
        (lambda j: j.sleep("nap", timedelta(days=366 * 1001)), "duration: must be at most"),
        (lambda j: j.wait_for_event(3, timeout=1), "name: must be a string"),
        (lambda j: j.wait_for_event("a\x00b", timeout=1), "NUL"),
        (lambda j: j.wait_for_event("e", timeout=-5), "timeout"),
    ],
)
def test_bad_sleeps_and_waits_are_refused_and_write_nothing(clean_registry, call, message):
    @job("tests.bad_wait", max_attempts=1)
    def bad_wait(job_):
        call(job_)

    run = run_job("tests.bad_wait")
    assert run.status == "failed"
    assert "InvalidJobError" in run.error and message in run.error
    assert not JobStep.objects.exists()


@pytest.mark.django_db
def test_a_sleep_or_wait_outside_a_running_job_is_refused(clean_registry):
    @job("tests.idle")
    def idle(job_):
        return None

    pending = enqueue("tests.idle")
    with pytest.raises(StepError, match="inside the handler of a running job"):
        pending.sleep("nap", 1)
    with pytest.raises(StepError, match="inside the handler of a running job"):
        pending.wait_for_event("e", timeout=1)


@pytest.mark.django_db
def test_a_name_stored_as_a_step_cannot_be_a_sleep(clean_registry):
    @job("tests.renamed", max_attempts=2, atomic=False)
    def renamed(job_):
        if job_.attempts == 1:
            job_.step("settlement", lambda: 1)
            raise ValueError("first attempt fails")
        job_.sleep("settlement", 1)

    enqueue("tests.renamed")
    runs = drain(include_delayed=True)
    assert [run.status for run in runs] == ["pending", "failed"]
    assert "is a step of job" in runs[1].error and "not a sleep" in runs[1].error


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "payload", "message"),
    [
        ("", None, "name: must not be empty"),
        ("e", {"a": float("nan")}, "payload"),
        ("e", object(), "payload: must be JSON-serialisable"),
        ("e", "x" * 70_000, "payload: is 70002 bytes of JSON"),
    ],
)
def test_a_bad_emit_is_refused_and_stores_nothing(name, payload, message):
    with pytest.raises(InvalidArgumentError, match=message):
        emit_event(name, payload)
    assert not EmittedEvent.objects.exists()


@pytest.mark.django_db
def test_pruning_deletes_old_events_only():
    emit_event("old")
    emit_event("new")
    EmittedEvent.objects.filter(name="old").update(emitted_at=timezone.now() - timedelta(days=8))
    assert prune_events(7 * 86400) == 1
    assert list(EmittedEvent.objects.values_list("name", flat=True)) == ["new"]


def job_page(client, job_) -> str:
    response = client.get(reverse("admin:django_pgqueue_job_change", args=[job_.pk]))
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
def test_the_job_page_says_what_a_suspended_job_waits_for_and_until_when(
    settle, ship, admin_client
):
    sleeper = enqueue("tests.settle", {"sleep": 3600})
    waiter = enqueue("tests.ship", {"order": 11})
    forever = enqueue("tests.ship", {"order": 12, "timeout": None})
    drain()

    page = job_page(admin_client, sleeper)
    assert "Sleeping at “settlement” until" in page
    assert "<td><code>settlement</code></td><td>Sleep</td>" in page
    assert "sleeping until" in page
    assert "End sleep or wait now" in page
    page = job_page(admin_client, waiter)
    assert "Waiting for event “packed:11” until" in page
    assert "<td><code>packed:11</code></td><td>Wait for an event</td>" in page
    assert "Waiting for event “packed:12”, without a timeout." in job_page(admin_client, forever)

    emit_event("packed:11", {"weight": 5})
    drain()
    page = job_page(admin_client, waiter)
    assert "Waiting for event" not in page and "End sleep or wait now" not in page
    assert "received at" in page and "&quot;weight&quot;: 5" in page


@pytest.mark.django_db
def test_staff_end_a_sleep_and_a_wait_early_and_the_admin_log_records_it(settle, ship, staff):
    operator = staff("view_job", "retry_job")
    sleeper = enqueue("tests.settle", {"sleep": 3600})
    waiter = enqueue("tests.ship", {"order": 13})
    plain = enqueue("tests.settle", {"sleep": 0}, run_at=timezone.now() + timedelta(hours=1))
    drain()

    operator.post(reverse("admin:django_pgqueue_job_action", args=[sleeper.pk, "end-wait"]))
    response = operator.post(
        reverse("admin:django_pgqueue_job_changelist"),
        {"action": "end_waits", "_selected_action": [str(waiter.pk), str(plain.pk)], "index": "0"},
        follow=True,
    )
    assert "End sleeps and waits: 1 changed, 1 skipped" in response.content.decode()

    for ended in (sleeper, waiter):
        assert Job.objects.get(pk=ended.pk).run_at <= timezone.now()
        entry = LogEntry.objects.get(object_id=str(ended.pk))
        assert (entry.change_message, entry.action_flag) == ("Ended its sleep or wait now.", CHANGE)
    assert not LogEntry.objects.filter(object_id=str(plain.pk)).exists()
    assert Job.objects.get(pk=plain.pk).run_at > timezone.now()

    runs = {run.job.pk: run for run in drain()}
    assert runs[sleeper.pk].status == "completed"  # the sleep is over
    assert runs[waiter.pk].result == "late"  # the wait timed out
    assert "timed out: packed:13" in calls


@pytest.mark.django_db
def test_end_waits_leaves_jobs_that_do_not_sleep_or_wait(settle):
    enqueue("tests.settle", {"sleep": 1}, run_at=timezone.now() + timedelta(hours=1))
    assert Job.objects.all().end_waits() == 0


@pytest.mark.django_db(transaction=True)
def test_workers_prune_events_past_their_retention():
    emit_event("old")
    emit_event("recent")
    EmittedEvent.objects.filter(name="old").update(emitted_at=timezone.now() - timedelta(hours=2))
    with (
        override_settings(
            PGQUEUE={"EVENT_RETENTION": 3600, "HEARTBEAT_INTERVAL": 0.1, "RECOVER_INTERVAL": 0.1}
        ),
        worker_thread(concurrency=1, poll_interval=0.1),
    ):
        wait_for(lambda: not EmittedEvent.objects.filter(name="old").exists(), timeout=10)
    assert EmittedEvent.objects.filter(name="recent").exists()


@pytest.mark.django_db(transaction=True)
def test_async_steps_run_once_across_retries(clean_registry):
    async def fetch(order):
        calls.append(f"fetch {order}")
        return {"order": order}

    def tag(order):
        calls.append(f"tag {order}")
        return order * 2

    @job("tests.async_steps", max_attempts=2, retry_backoff=lambda attempt: 0.0, atomic=False)
    async def async_steps(job_):
        fetched = await job_.astep("fetch", fetch, job_.data["order"])
        doubled = await job_.astep("tag", tag, fetched["order"])
        if job_.attempts == 1:
            raise RuntimeError("the CRM is down")
        return doubled

    done = run_until_finished(enqueue("tests.async_steps", {"order": 21}))

    assert (done.status, done.result) == (JobStatus.COMPLETED, 42)
    assert calls == ["fetch 21", "tag 21"]


@pytest.mark.django_db
def test_an_atomic_step_of_an_async_function_is_refused(clean_registry):
    async def fetch():
        return 1

    @job("tests.async_atomic", max_attempts=1)
    async def async_atomic(job_):
        await job_.astep("fetch", fetch, atomic=True)

    run = run_job("tests.async_atomic")
    assert run.status == "failed"
    assert "StepError" in run.error and "Django runs no transaction across awaits" in run.error


@pytest.fixture
def three_steps(clean_registry):
    """``tests.three_steps``: steps one, two, three, then fails unless ``data["ok"]``."""

    @job("tests.three_steps", max_attempts=1, atomic=False)
    def three_steps_handler(job_):
        for name in ("one", "two", "three"):
            job_.step(name, lambda name=name: calls.append(name) or name)
        if not job_.data.get("ok"):
            raise ValueError("step three's result was wrong")
        return "ok"

    return three_steps_handler


@pytest.mark.django_db
def test_staff_rerun_a_failed_job_from_a_chosen_step(three_steps, staff):
    operator = staff("view_job", "retry_job")
    failed = enqueue("tests.three_steps")
    drain()
    assert Job.objects.get(pk=failed.pk).status == JobStatus.FAILED
    page = job_page(operator, failed)
    assert "Re-run from step" in page and '<option value="two">two</option>' in page

    response = operator.post(
        reverse("admin:django_pgqueue_job_action", args=[failed.pk, "rerun-from"]),
        {"step": "two"},
        follow=True,
    )

    assert "Re-ran from step “two”: 2 checkpoint(s) cleared. Retried." in (
        response.content.decode()
    )
    assert list(JobStep.objects.filter(job=failed).values_list("name", flat=True)) == ["one"]
    assert Job.objects.get(pk=failed.pk).status == JobStatus.PENDING
    entry = LogEntry.objects.get(object_id=str(failed.pk))
    assert entry.change_message.startswith("Re-ran from step “two”")
    calls.clear()
    # include_delayed: the retry's run_at (the statement's time) is after the test
    # transaction's now().
    drain(include_delayed=True)
    assert calls == ["two", "three"]  # "one" came from its checkpoint


@pytest.mark.django_db
def test_a_completed_job_or_an_unknown_step_cannot_be_rerun(three_steps, staff):
    operator = staff("view_job", "retry_job")
    done = enqueue("tests.three_steps", {"ok": True})
    failed = enqueue("tests.three_steps")
    drain()
    assert "Re-run from step" not in job_page(operator, done)

    def rerun(job_, step):
        url = reverse("admin:django_pgqueue_job_action", args=[job_.pk, "rerun-from"])
        return operator.post(url, {"step": step}, follow=True).content.decode()

    assert "is completed: only a failed, cancelled, pending or waiting job" in rerun(done, "two")
    assert "has no step, sleep or wait named &#x27;four&#x27;" in rerun(failed, "four")
    assert JobStep.objects.filter(job__in=[done, failed]).count() == 6
    assert Job.objects.get(pk=failed.pk).status == JobStatus.FAILED
    assert not LogEntry.objects.exists()


@pytest.mark.django_db
def test_view_only_staff_see_no_rerun_form_and_cannot_post_it(three_steps, staff):
    viewer = staff("view_job")
    failed = enqueue("tests.three_steps")
    drain()
    assert "Re-run from step" not in job_page(viewer, failed)
    url = reverse("admin:django_pgqueue_job_action", args=[failed.pk, "rerun-from"])
    assert viewer.post(url, {"step": "one"}).status_code == 403
    assert JobStep.objects.filter(job=failed).count() == 3


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kind", "result", "wake_in", "is_open"),
    [
        ("sleep", None, 60, True),
        ("sleep", None, -60, False),
        ("event", None, None, True),
        ("event", None, 60, True),
        ("event", None, -60, False),  # timed out
        ("event", {"paid": True}, 60, False),  # received
        ("step", 1, None, False),
    ],
)
def test_an_open_wait_is_a_sleep_before_its_end_or_a_wait_not_received_nor_timed_out(
    kind, result, wake_in, is_open
):
    # schema.open_wait(): the one rule the job page and end_waits() share.
    from django_pgqueue.admin.attempts import current_wait
    from django_pgqueue.schema import open_wait

    suspended = enqueue("tests.noop")
    wake_at = None if wake_in is None else timezone.now() + timedelta(seconds=wake_in)
    step = JobStep.objects.create(
        job=suspended,
        name="n",
        kind=kind,
        attempt=1,
        result=result,
        wake_at=wake_at,
        started_at=timezone.now(),
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {open_wait()} FROM pgqueue_job_steps WHERE id = %s", [step.pk])
        assert cursor.fetchone()[0] is is_open
    assert (current_wait(suspended) == step) is is_open
    assert (Job.objects.filter(pk=suspended.pk).end_waits() == 1) is is_open
