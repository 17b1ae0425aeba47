"""Periodic jobs: cron schedules from ``@job(schedule=...)`` and ``PGQUEUE["SCHEDULE"]``,
each tick enqueued exactly once however many workers run, and the missed-ticks rule."""

from __future__ import annotations

import json
import multiprocessing
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from django_pgqueue import enqueue, job
from django_pgqueue.checks import check_schedules
from django_pgqueue.conf import get_settings
from django_pgqueue.cron import Schedule, validate_cron
from django_pgqueue.exceptions import InvalidJobError, SettingsError
from django_pgqueue.models import Job, JobStatus, PeriodicTick
from django_pgqueue.periodic import declared_schedules, enqueue_due_ticks
from django_pgqueue.testing import assert_enqueued
from tests.testapp.models import Execution
from tests.workers import WorkerProcess, enqueue_ticks_in_step, wait_for, worker_thread

# A Monday; "*/5 * * * *" ticks at 12:00, 12:05, ...
T0 = datetime(2030, 1, 7, 12, 1, 30, tzinfo=UTC)


def every_five_minutes(**extra):
    return {"every-5": {"job_type": "tests.noop", "schedule": "*/5 * * * *", **extra}}


# Cron expressions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "normalised"),
    [
        ("*/5 * * * *", "*/5 * * * *"),
        ("  0   3 * *  mon-fri ", "0 3 * * mon-fri"),
        ("* * * * * */10", "* * * * * */10"),
        ("@Daily", "@daily"),
        ("0 0 L * *", "0 0 L * *"),
    ],
)
def test_valid_cron_expressions_are_accepted_with_whitespace_normalised(expression, normalised):
    assert validate_cron(expression) == normalised


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("* * * *", r"has 4 fields; use 5 fields \(minute hour day-of-month month"),
        ("* * * * * * *", "has 7 fields"),
        ("61 * * * *", r"is not a valid cron expression \(.*out of range"),
        ("*/0 * * * *", "is not a valid cron expression"),
        ("0 0 30 2 *", r"never matches a date \(such as 30 February\)"),
        ("@reboot", "is not a supported alias"),
        ("", "must not be empty"),
        (5, "must be a cron expression string, got int"),
    ],
)
def test_invalid_cron_expressions_are_rejected_with_the_reason(expression, message):
    with pytest.raises(InvalidJobError, match=message) as raised:
        validate_cron(expression)
    assert raised.value.field == "schedule"


def test_job_decorator_rejects_an_invalid_schedule_at_decoration_time(clean_registry):
    with pytest.raises(InvalidJobError, match=r"^schedule: '61 \* \* \* \*' is not a valid"):

        @job("tests.periodic.bad", schedule="61 * * * *")
        def bad(job):
            pass


def test_job_decorator_keeps_the_normalised_schedule(clean_registry):
    @job("tests.periodic.nightly", schedule=" 0  3 * * * ")
    def nightly(job):
        pass

    assert nightly.schedule == "0 3 * * *"


def test_latest_tick_includes_a_tick_at_exactly_now():
    schedule = Schedule("s", "tests.noop", "*/5 * * * *", timezone="UTC")
    on_tick = datetime(2030, 1, 7, 12, 5, tzinfo=UTC)

    assert schedule.latest_tick(on_tick) == on_tick
    assert schedule.latest_tick(on_tick - timedelta(microseconds=1)) == on_tick - timedelta(
        minutes=5
    )
    assert schedule.next_tick(on_tick) == on_tick + timedelta(minutes=5)


def test_expressions_are_evaluated_in_time_zone_by_default(settings):
    settings.TIME_ZONE = "Europe/Paris"
    schedule = Schedule("s", "tests.noop", "0 3 * * *")

    assert schedule.signature == "0 3 * * * (Europe/Paris)"
    # 03:00 in Paris is 02:00 UTC in January.
    assert schedule.latest_tick(T0) == datetime(2030, 1, 7, 2, 0, tzinfo=UTC)
    assert Schedule("s", "tests.noop", "0 3 * * *", timezone="UTC").latest_tick(T0) == datetime(
        2030, 1, 7, 3, 0, tzinfo=UTC
    )


# The SCHEDULE setting ------------------------------------------------------------------


def test_schedule_setting_is_validated_into_schedules(pgqueue_settings):
    pgqueue_settings(
        SCHEDULE={
            "nightly-report": {
                "job_type": "tests.record",
                "schedule": "0 3 * * *",
                "data": {"format": "pdf"},
                "queue": "reports",
                "priority": 50,
                "max_attempts": 1,
                "timezone": "America/New_York",
            }
        }
    )

    expected = {
        "nightly-report": Schedule(
            name="nightly-report",
            job_type="tests.record",
            cron="0 3 * * *",
            timezone="America/New_York",
            data={"format": "pdf"},
            queue="reports",
            priority=50,
            max_attempts=1,
        )
    }
    validated = get_settings().SCHEDULE
    assert validated == expected


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([], r"PGQUEUE\['SCHEDULE'\] must be a dict of schedule names to dicts"),
        ({"x": "*/5 * * * *"}, r"\['x'\] must be a dict with at least 'job_type' and 'schedule'"),
        ({"x": {"job_type": "tests.noop"}}, r"\['x'\] is missing \['schedule'\]"),
        (
            {"x": {"job_type": "tests.noop", "schedule": "* * * * *", "cron": "x"}},
            r"\['x'\] has unknown keys \['cron'\]",
        ),
        (
            {"x": {"job_type": "bad type!", "schedule": "* * * * *"}},
            r"\['x'\]\['job_type'\]: 'bad type!' is not a valid job type",
        ),
        (
            {"x": {"job_type": "tests.noop", "schedule": "* * *"}},
            r"\['x'\]\['schedule'\]: '\* \* \*' has 3 fields",
        ),
        (
            {"x": {"job_type": "tests.noop", "schedule": "* * * * *", "priority": 5000}},
            r"\['x'\]\['priority'\]: must be between 0 and 1000",
        ),
        (
            {"x": {"job_type": "tests.noop", "schedule": "* * * * *", "timezone": "Mars/Base"}},
            r"\['x'\]\['timezone'\]: must be an IANA time zone name",
        ),
        (
            {"x": {"job_type": "tests.noop", "schedule": "* * * * *", "data": {"at": T0}}},
            r"\['x'\]\['data'\]: must be JSON-serialisable",
        ),
        ({"": {"job_type": "tests.noop", "schedule": "* * * * *"}}, "keys are schedule names"),
    ],
)
def test_invalid_schedule_settings_say_what_is_wrong(pgqueue_settings, schedule, message):
    pgqueue_settings(SCHEDULE=schedule)

    with pytest.raises(SettingsError, match=message):
        get_settings()


def test_schedules_come_from_decorators_and_the_setting(pgqueue_settings, clean_registry):
    @job("tests.periodic.decorated", schedule="@hourly")
    def decorated(job):
        pass

    pgqueue_settings(SCHEDULE=every_five_minutes())

    assert [(s.name, s.job_type, s.cron) for s in declared_schedules()] == [
        ("every-5", "tests.noop", "*/5 * * * *"),
        ("tests.periodic.decorated", "tests.periodic.decorated", "@hourly"),
    ]


def test_a_setting_named_like_a_decorated_schedule_is_rejected(pgqueue_settings, clean_registry):
    @job("tests.periodic.twice", schedule="@hourly")
    def twice(job):
        pass

    pgqueue_settings(
        SCHEDULE={"tests.periodic.twice": {"job_type": "tests.noop", "schedule": "@daily"}}
    )

    with pytest.raises(SettingsError, match="rename the SCHEDULE entry"):
        declared_schedules()


# Enqueueing ticks ----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_new_schedule_records_its_latest_tick_without_enqueuing(pgqueue_settings):
    pgqueue_settings(SCHEDULE=every_five_minutes())

    assert enqueue_due_ticks(now=T0) == []

    row = PeriodicTick.objects.get()
    assert (row.name, row.schedule, row.last_job_id) == ("every-5", "*/5 * * * * (UTC)", None)
    assert row.last_tick == datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_each_tick_is_enqueued_once_with_its_time_as_run_at(pgqueue_settings):
    pgqueue_settings(
        SCHEDULE=every_five_minutes(data={"kind": "digest"}, queue="periodic", priority=7)
    )
    enqueue_due_ticks(now=T0)

    jobs = enqueue_due_ticks(now=T0 + timedelta(minutes=4))
    again = enqueue_due_ticks(now=T0 + timedelta(minutes=4, seconds=20))

    assert again == []
    [enqueued] = jobs
    tick = datetime(2030, 1, 7, 12, 5, tzinfo=UTC)
    stored = Job.objects.get()
    assert stored.id == enqueued.id
    assert (stored.job_type, stored.data, stored.queue, stored.priority) == (
        "tests.noop",
        {"kind": "digest"},
        "periodic",
        7,
    )
    assert stored.run_at == tick
    row = PeriodicTick.objects.get()
    assert (row.last_tick, row.last_job_id) == (tick, stored.id)


@pytest.mark.django_db
def test_after_missed_ticks_only_the_latest_is_enqueued(pgqueue_settings):
    pgqueue_settings(SCHEDULE=every_five_minutes())
    enqueue_due_ticks(now=T0)

    # No worker for over an hour: twelve ticks passed, one job catches up.
    jobs = enqueue_due_ticks(now=T0 + timedelta(hours=1, minutes=2))

    assert [job.run_at for job in jobs] == [datetime(2030, 1, 7, 13, 0, tzinfo=UTC)]
    assert_enqueued(job_type="tests.noop", count=1)


@pytest.mark.django_db
def test_a_changed_expression_starts_afresh_without_enqueuing(pgqueue_settings):
    pgqueue_settings(SCHEDULE=every_five_minutes())
    enqueue_due_ticks(now=T0)

    pgqueue_settings(SCHEDULE={"every-5": {"job_type": "tests.noop", "schedule": "*/7 * * * *"}})
    changed = enqueue_due_ticks(now=T0 + timedelta(minutes=10))
    next_one = enqueue_due_ticks(now=T0 + timedelta(minutes=14))

    assert changed == []
    assert [job.run_at for job in next_one] == [datetime(2030, 1, 7, 12, 14, tzinfo=UTC)]
    assert PeriodicTick.objects.get().schedule == "*/7 * * * * (UTC)"


@pytest.mark.django_db
def test_a_changed_time_zone_also_starts_afresh(pgqueue_settings):
    pgqueue_settings(SCHEDULE=every_five_minutes())
    enqueue_due_ticks(now=T0)

    pgqueue_settings(SCHEDULE=every_five_minutes(timezone="Asia/Kolkata"))

    assert enqueue_due_ticks(now=T0 + timedelta(minutes=10)) == []
    assert PeriodicTick.objects.get().schedule == "*/5 * * * * (Asia/Kolkata)"


@pytest.mark.django_db
def test_decorated_schedules_use_the_job_types_defaults(clean_registry):
    @job("tests.periodic.report", schedule="0 * * * *", queue="reports", priority=300)
    def report(job):
        pass

    enqueue_due_ticks(now=T0)
    [enqueued] = enqueue_due_ticks(now=T0 + timedelta(hours=1))

    assert (enqueued.job_type, enqueued.queue, enqueued.priority) == (
        "tests.periodic.report",
        "reports",
        300,
    )
    assert enqueued.run_at == datetime(2030, 1, 7, 13, 0, tzinfo=UTC)


@pytest.mark.django_db
def test_a_schedule_that_cannot_enqueue_is_logged_retried_and_does_not_stop_others(
    pgqueue_settings, caplog
):
    pgqueue_settings(
        SCHEDULE={
            **every_five_minutes(),
            "broken": {"job_type": "tests.no_such_handler", "schedule": "*/5 * * * *"},
        }
    )
    enqueue_due_ticks(now=T0)

    with caplog.at_level("ERROR", logger="django_pgqueue.periodic"):
        jobs = enqueue_due_ticks(now=T0 + timedelta(minutes=5))

    assert [job.job_type for job in jobs] == ["tests.noop"]
    [record] = [record for record in caplog.records if record.levelname == "ERROR"]
    assert "periodic job broken could not enqueue its tick 2030-01-07T12:05:00+00:00" in (
        record.getMessage()
    )
    assert "no handler is registered for 'tests.no_such_handler'" in record.getMessage()
    # The tick was not consumed: it is enqueued once the handler exists.
    assert PeriodicTick.objects.get(name="broken").last_tick == datetime(
        2030, 1, 7, 12, 0, tzinfo=UTC
    )


@pytest.mark.django_db
def test_a_tick_is_skipped_while_the_previous_run_holds_the_unique_key(clean_registry, caplog):
    @job("tests.periodic.single", schedule="*/5 * * * *", unique_key="single")
    def single(job):
        pass

    enqueue_due_ticks(now=T0)
    [first] = enqueue_due_ticks(now=T0 + timedelta(minutes=4))
    with caplog.at_level("INFO", logger="django_pgqueue.periodic"):
        skipped = enqueue_due_ticks(now=T0 + timedelta(minutes=9))
    Job.objects.filter(id=first.id).update(status=JobStatus.COMPLETED)
    [third] = enqueue_due_ticks(now=T0 + timedelta(minutes=14))

    assert skipped == []
    assert (
        f"periodic job tests.periodic.single skipped its tick 2030-01-07T12:10:00+00:00: "
        f"job {first.id} with unique key 'single' is still pending"
    ) in caplog.text
    assert third.run_at == datetime(2030, 1, 7, 12, 15, tzinfo=UTC)
    assert assert_enqueued(job_type="tests.periodic.single", count=1) == [third]


@pytest.mark.django_db
def test_now_must_be_timezone_aware(pgqueue_settings):
    pgqueue_settings(SCHEDULE=every_five_minutes())

    with pytest.raises(InvalidJobError, match="now: must be timezone-aware"):
        enqueue_due_ticks(now=datetime(2030, 1, 7, 12, 0))


# System checks -----------------------------------------------------------------------


def test_check_reports_schedule_entries_without_a_handler(pgqueue_settings):
    pgqueue_settings(
        SCHEDULE={"typo": {"job_type": "tests.nope", "schedule": "@daily"}, **every_five_minutes()}
    )

    [error] = check_schedules()

    assert error.id == "django_pgqueue.E201"
    assert error.msg == (
        "PGQUEUE['SCHEDULE']['typo'] enqueues job type 'tests.nope', which has no handler"
    )


def test_check_reports_a_schedule_entry_named_like_a_decorated_schedule(
    pgqueue_settings, clean_registry
):
    @job("tests.periodic.hourly", schedule="@hourly")
    def hourly(job):
        pass

    pgqueue_settings(
        SCHEDULE={"tests.periodic.hourly": {"job_type": "tests.noop", "schedule": "@daily"}}
    )

    assert [error.id for error in check_schedules()] == ["django_pgqueue.E202"]


# Several processes ---------------------------------------------------------------------


# Forked on purpose: the children inherit the test's settings override. Python 3.12+
# warns that a multi-threaded parent may deadlock a forked child; the children here only
# open their own connections and enqueue.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.django_db(transaction=True)
def test_concurrent_processes_enqueue_each_tick_exactly_once(pgqueue_settings):
    pgqueue_settings(SCHEDULE={"every-minute": {"job_type": "tests.noop", "schedule": "* * * * *"}})
    # The first round is the schedule's first sight: it records, enqueues nothing.
    nows = [T0 + timedelta(minutes=k) for k in range(16)]
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
    expected = {T0.replace(second=0) + timedelta(minutes=k) for k in range(1, 16)}
    assert set(run_ats) == expected
    assert set(run_ats.values()) == {1}


# Workers -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_worker_enqueues_and_runs_each_tick(clean_registry):
    ran = []

    @job("tests.periodic.every_second", schedule="* * * * * *")
    def every_second(job):
        ran.append(job.run_at)

    with worker_thread(concurrency=2, poll_interval=0.2):
        wait_for(lambda: len(ran) >= 2, timeout=20)

    jobs = Job.objects.filter(job_type="tests.periodic.every_second")
    ticks = [job.run_at for job in jobs if job.status == JobStatus.COMPLETED]
    assert len(ticks) >= 2
    assert all(tick.microsecond == 0 for tick in ticks)
    assert len(set(ticks)) == len(ticks)


@pytest.mark.django_db(transaction=True)
def test_a_starting_worker_enqueues_the_latest_missed_tick_once(pgqueue_settings):
    pgqueue_settings(SCHEDULE={"hourly": {"job_type": "tests.record", "schedule": "@hourly"}})
    PeriodicTick.objects.create(
        name="hourly", schedule="@hourly (UTC)", last_tick=timezone.now() - timedelta(days=2)
    )

    hours = {timezone.now().replace(minute=0, second=0, microsecond=0)}
    with worker_thread(concurrency=1, poll_interval=0.2):
        wait_for(Execution.objects.exists)
    hours.add(timezone.now().replace(minute=0, second=0, microsecond=0))

    [missed] = Job.objects.all()
    assert missed.run_at in hours
    assert PeriodicTick.objects.get().last_job_id == missed.id


@pytest.mark.django_db(transaction=True)
def test_a_broken_schedule_leaves_the_worker_running_jobs(pgqueue_settings, clean_registry, caplog):
    @job("tests.periodic.clash", schedule="@hourly")
    def clash(job):
        pass

    pgqueue_settings(
        SCHEDULE={"tests.periodic.clash": {"job_type": "tests.noop", "schedule": "@daily"}}
    )
    job_ = enqueue("tests.record")

    with (
        caplog.at_level("ERROR", logger="django_pgqueue.worker"),
        worker_thread(concurrency=1, poll_interval=0.2),
    ):
        wait_for(lambda: Job.objects.get(id=job_.id).status == JobStatus.COMPLETED)

    assert "periodic jobs: PGQUEUE['SCHEDULE']['tests.periodic.clash'] has the name" in caplog.text
    assert not PeriodicTick.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_several_worker_processes_enqueue_each_tick_once():
    schedule = {"SCHEDULE": {"record": {"job_type": "tests.record", "schedule": "* * * * * *"}}}
    env = {"PGQUEUE_TEST_SETTINGS": json.dumps(schedule)}
    workers = [WorkerProcess("--poll-interval", "0.2", env=env) for _ in range(3)]
    try:
        wait_for(lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() >= 5, timeout=45)
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


@pytest.mark.django_db
def test_pgqueue_schedule_run_due_enqueues_and_lists_schedules(pgqueue_settings):
    pgqueue_settings(SCHEDULE=every_five_minutes())
    PeriodicTick.objects.create(
        name="every-5", schedule="*/5 * * * * (UTC)", last_tick=timezone.now() - timedelta(days=1)
    )
    PeriodicTick.objects.create(name="gone", schedule="@daily (UTC)", last_tick=T0)
    out = StringIO()

    call_command("pgqueue_schedule", "--run-due", stdout=out)

    job = Job.objects.get()
    text = out.getvalue()
    assert f"enqueued tests.noop for {job.run_at:%Y-%m-%d %H:%M:%S} UTC" in text
    assert f"job {job.id}" in text
    assert "every-5  */5 * * * * (UTC)  job_type=tests.noop" in text
    assert "gone  @daily (UTC)  (no longer declared; --forget-undeclared deletes it)" in text


@pytest.mark.django_db
def test_pgqueue_schedule_forgets_undeclared_schedules(pgqueue_settings):
    pgqueue_settings(SCHEDULE=every_five_minutes())
    PeriodicTick.objects.create(name="gone", schedule="@daily (UTC)", last_tick=T0)
    out = StringIO()

    call_command("pgqueue_schedule", "--forget-undeclared", stdout=out)

    assert "forgot gone" in out.getvalue()
    assert not PeriodicTick.objects.filter(name="gone").exists()
    assert "every-5  */5 * * * * (UTC)" in out.getvalue()
