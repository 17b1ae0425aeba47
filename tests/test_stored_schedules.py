"""Schedules stored in the database (added, changed and deleted at run time) and pausing
any schedule: validated like settings, ticked exactly once by racing workers."""

from __future__ import annotations

import logging
import multiprocessing
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.utils import timezone

from django_pgqueue import periodic
from django_pgqueue.exceptions import InvalidArgumentError
from django_pgqueue.models import Job, JobStatus, PeriodicTick, StoredSchedule, WorkerRecord
from django_pgqueue.periodic import (
    enqueue_due_ticks,
    pause_schedule,
    paused_schedules,
    resume_schedule,
    run_now,
    schedules,
    stored_schedule_problems,
)
from django_pgqueue.stored_schedules import delete_schedule, save_schedule
from tests.testapp.models import Execution
from tests.workers import WorkerProcess, enqueue_ticks_in_step, wait_for

pytestmark = pytest.mark.django_db

# A Monday; "*/5 * * * *" ticks at 12:00, 12:05, ...
T0 = datetime(2030, 1, 7, 12, 1, 30, tzinfo=UTC)


def minutes(k: int) -> datetime:
    return T0 + timedelta(minutes=k)


# Adding, changing, deleting ------------------------------------------------------------


def test_a_stored_schedule_is_ticked_with_its_job_options():
    save_schedule(
        "export",
        "tests.noop",
        "*/5 * * * *",
        data={"format": "csv"},
        queue="reports",
        priority=7,
        max_attempts=2,
        unique_key="export",
        timezone="Europe/Paris",
    )

    (schedule,) = schedules()
    assert (schedule.name, schedule.cron, schedule.zone_name, schedule.stored) == (
        "export",
        "*/5 * * * *",
        "Europe/Paris",
        True,
    )
    assert enqueue_due_ticks(now=minutes(0)) == []  # first sight: recorded only
    (job,) = enqueue_due_ticks(now=minutes(5))
    assert (job.job_type, job.data, job.queue, job.priority, job.max_attempts) == (
        "tests.noop",
        {"format": "csv"},
        "reports",
        7,
        2,
    )
    assert (job.unique_key, job.run_at) == ("export", datetime(2030, 1, 7, 12, 5, tzinfo=UTC))
    assert PeriodicTick.objects.get(name="export").last_job_id == job.id


def test_unset_options_take_the_job_types_defaults():
    row = save_schedule("plain", "tests.record", "@hourly")

    assert (row.data, row.queue, row.priority, row.unique_key, row.timezone) == (
        {},
        "",
        None,
        "",
        "",
    )
    enqueue_due_ticks(now=T0)
    (job,) = enqueue_due_ticks(now=T0 + timedelta(hours=1))
    assert (job.queue, job.priority, job.unique_key) == ("default", 150, None)


def test_a_changed_expression_starts_afresh_and_other_changes_apply_at_the_next_tick():
    save_schedule("export", "tests.noop", "*/5 * * * *", data={"v": 1})
    enqueue_due_ticks(now=minutes(0))

    save_schedule("export", "tests.noop", "*/5 * * * *", data={"v": 2})
    (job,) = enqueue_due_ticks(now=minutes(5))
    assert job.data == {"v": 2}

    save_schedule("export", "tests.noop", "*/10 * * * *")
    assert enqueue_due_ticks(now=minutes(10)) == []  # a new expression: recorded only
    assert len(enqueue_due_ticks(now=minutes(20))) == 1
    assert StoredSchedule.objects.get().schedule == "*/10 * * * *"


def test_deleting_a_schedule_drops_its_ticks_and_keeps_its_jobs():
    save_schedule("export", "tests.noop", "*/5 * * * *")
    enqueue_due_ticks(now=minutes(0))
    (job,) = enqueue_due_ticks(now=minutes(5))

    assert delete_schedule("export") is True
    assert delete_schedule("export") is False

    assert schedules() == []
    assert not PeriodicTick.objects.exists()
    assert Job.objects.get() == job


def test_a_schedule_added_again_under_an_old_name_does_not_run_at_once():
    save_schedule("export", "tests.noop", "*/5 * * * *")
    enqueue_due_ticks(now=minutes(0))
    # Deleted behind the API's back: its recorded ticks stay.
    StoredSchedule.objects.all().delete()
    assert PeriodicTick.objects.filter(name="export").exists()

    save_schedule("export", "tests.noop", "*/5 * * * *")

    assert enqueue_due_ticks(now=minutes(60)) == []  # first sight, not a missed tick
    assert len(enqueue_due_ticks(now=minutes(65))) == 1


def test_deleting_a_name_that_is_not_stored_keeps_that_schedules_ticks(pgqueue_settings):
    pgqueue_settings(SCHEDULE={"digest": {"job_type": "tests.noop", "schedule": "@daily"}})
    enqueue_due_ticks(now=T0)

    assert delete_schedule("digest") is False
    assert PeriodicTick.objects.filter(name="digest").exists()


@pytest.mark.parametrize(
    ("name", "fields", "field", "message"),
    [
        ("", {}, "name", "must be a string of 1 to 255 characters"),
        ("x" * 256, {}, "name", "must be a string of 1 to 255 characters"),
        ("digest", {}, "name", "the code or settings declare a schedule named 'digest'"),
        ("s", {"schedule": "61 * * * *"}, "schedule", "is not a valid cron expression"),
        ("s", {"schedule": "* * *"}, "schedule", "has 3 fields"),
        ("s", {"job_type": "tests.nobody"}, "job_type", "no handler is registered"),
        ("s", {"job_type": ""}, "job_type", None),
        ("s", {"timezone": "Mars/Olympus"}, "timezone", "must be an IANA time zone name"),
        ("s", {"data": {"a": float("nan")}}, "data", "is nan, not a JSON number"),
        ("s", {"data": ["not", "a", "dict"]}, "data", None),
        ("s", {"data": {"big": "x" * 70_000}}, "data", None),
        ("s", {"queue": "no spaces"}, "queue", None),
        ("s", {"priority": 10**6}, "priority", None),
        ("s", {"max_attempts": 0}, "max_attempts", None),
        ("s", {"unique_key": ""}, "unique_key", None),
    ],
)
def test_bad_input_names_its_field_and_writes_nothing(
    pgqueue_settings, name, fields, field, message
):
    pgqueue_settings(SCHEDULE={"digest": {"job_type": "tests.noop", "schedule": "@daily"}})
    arguments = {"job_type": "tests.noop", "schedule": "@daily", **fields}

    with pytest.raises(InvalidArgumentError, match=message) as raised:
        save_schedule(name, **arguments)

    assert raised.value.field == field
    assert not StoredSchedule.objects.exists()


def test_a_stored_schedule_named_like_a_declared_one_is_ignored_with_a_warning(
    pgqueue_settings, caplog, monkeypatch
):
    monkeypatch.setattr(periodic, "_reported_problems", {})  # what other tests logged
    StoredSchedule.objects.create(name="digest", job_type="tests.record", schedule="* * * * *")
    pgqueue_settings(SCHEDULE={"digest": {"job_type": "tests.noop", "schedule": "@daily"}})

    with caplog.at_level(logging.WARNING, logger="django_pgqueue.periodic"):
        (found,) = schedules()
        schedules()  # said once, not on every pass

    assert (found.job_type, found.stored) == ("tests.noop", False)
    problem = stored_schedule_problems()["digest"]
    assert "the code or settings declare a schedule of the same name" in problem
    warnings = [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]
    assert warnings == [f"stored schedule digest is ignored: {problem}"]


def test_an_invalid_stored_row_is_ignored_and_the_others_run(caplog):
    StoredSchedule.objects.create(name="broken", job_type="tests.noop", schedule="every day")
    save_schedule("fine", "tests.noop", "*/5 * * * *")

    with caplog.at_level(logging.WARNING, logger="django_pgqueue.periodic"):
        assert [schedule.name for schedule in schedules()] == ["fine"]
        enqueue_due_ticks(now=minutes(0))
        assert len(enqueue_due_ticks(now=minutes(5))) == 1

    assert "schedule: 'every day' has 2 fields" in stored_schedule_problems()["broken"]
    assert "stored schedule broken is ignored: schedule: 'every day'" in caplog.text


# Pausing -------------------------------------------------------------------------------


@pytest.fixture
def every_five(pgqueue_settings):
    pgqueue_settings(SCHEDULE={"every-5": {"job_type": "tests.noop", "schedule": "*/5 * * * *"}})
    now = timezone.now()
    enqueue_due_ticks(now=now)  # first sight
    return now


def test_a_paused_schedule_enqueues_nothing_and_resumes_from_its_next_tick(every_five):
    now = every_five
    assert pause_schedule("every-5") is True
    assert pause_schedule("every-5") is False
    assert set(paused_schedules()) == {"every-5"}

    assert enqueue_due_ticks(now=now + timedelta(minutes=5)) == []
    assert enqueue_due_ticks(now=now + timedelta(minutes=10)) == []
    # Paused for a day: the ticks it missed are skipped on resume, not caught up.
    PeriodicTick.objects.filter(name="every-5").update(last_tick=now - timedelta(days=1))

    assert resume_schedule("every-5") is True
    assert resume_schedule("every-5") is False

    assert paused_schedules() == {}
    assert enqueue_due_ticks() == []
    (job,) = enqueue_due_ticks(now=now + timedelta(minutes=5))
    assert job.job_type == "tests.noop"


def test_a_schedule_paused_before_any_worker_saw_it_does_not_run_on_resume(pgqueue_settings):
    pgqueue_settings(SCHEDULE={"every-5": {"job_type": "tests.noop", "schedule": "*/5 * * * *"}})

    pause_schedule("every-5")
    assert enqueue_due_ticks() == []
    resume_schedule("every-5")

    assert enqueue_due_ticks() == []
    assert not Job.objects.exists()


def test_run_now_still_runs_a_paused_schedule(every_five):
    pause_schedule("every-5")

    job = run_now("every-5")

    assert job.job_type == "tests.noop"


def test_pausing_a_schedule_that_does_not_exist_is_a_lookup_error():
    with pytest.raises(LookupError, match="no periodic job is named 'nope'"):
        pause_schedule("nope")
    with pytest.raises(LookupError, match="no periodic job is named 'nope'"):
        resume_schedule("nope")
    assert not PeriodicTick.objects.exists()


def test_a_stored_schedule_pauses_like_any_other():
    save_schedule("export", "tests.noop", "*/5 * * * *")
    now = timezone.now()
    enqueue_due_ticks(now=now)

    pause_schedule("export")

    assert enqueue_due_ticks(now=now + timedelta(minutes=5)) == []


# Racing ---------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.django_db(transaction=True)
def test_concurrent_processes_enqueue_each_tick_of_a_stored_schedule_once():
    save_schedule("every-minute", "tests.noop", "* * * * *")
    nows = [minutes(k) for k in range(16)]
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    connections.close_all()  # children must not share the parent's socket
    processes = [
        context.Process(target=enqueue_ticks_in_step, args=(barrier, nows)) for _ in range(4)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)

    assert [process.exitcode for process in processes] == [0, 0, 0, 0]
    run_ats = Counter(Job.objects.values_list("run_at", flat=True))
    assert set(run_ats) == {minutes(k).replace(second=0) for k in range(1, 16)}
    assert set(run_ats.values()) == {1}


@pytest.mark.django_db(transaction=True)
def test_worker_processes_pick_up_a_schedule_added_while_they_run_and_tick_it_once():
    workers = [WorkerProcess("--poll-interval", "0.2") for _ in range(3)]
    try:
        running = WorkerRecord.objects.filter(stopped_at__isnull=True)
        wait_for(lambda: running.count() == 3, timeout=30)
        save_schedule("every-second", "tests.record", "* * * * * *")
        wait_for(lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() >= 5, timeout=45)
        pause_schedule("every-second")
        for worker in workers:
            worker.signal(signal.SIGTERM)
        for worker in workers:
            assert worker.wait() == 0, worker.output()
    finally:
        for worker in workers:
            worker.stop()

    run_ats = Counter(Job.objects.values_list("run_at", flat=True))
    assert max(run_ats.values()) == 1, run_ats
    completed = Job.objects.filter(status=JobStatus.COMPLETED).count()
    assert Execution.objects.count() == completed


# The command ---------------------------------------------------------------------------


def test_pgqueue_schedule_lists_stored_schedules_and_pauses_and_resumes_them():
    save_schedule("export", "tests.noop", "*/5 * * * *")
    out = StringIO()

    call_command("pgqueue_schedule", "--pause", "export", stdout=out)

    text = out.getvalue()
    assert "export paused" in text
    assert "export  */5 * * * * (UTC)  job_type=tests.noop  (stored)" in text
    assert "    next tick: none, paused since " in text
    out = StringIO()
    call_command("pgqueue_schedule", "--resume", "export", "--resume", "export", stdout=out)
    assert "export resumed\nexport was not paused" in out.getvalue()
    with pytest.raises(CommandError, match="no periodic job is named 'nope'"):
        call_command("pgqueue_schedule", "--pause", "nope", stdout=StringIO())
