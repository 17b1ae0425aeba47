"""Concurrency limits: declaring them (settings, ``@job``), writing them to
``pgqueue_limits``, and ``claim_job_batch`` keeping them, also under concurrent claimers
and several real worker processes."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.utils import timezone

from django_pgqueue import conf, enqueue_many, job
from django_pgqueue.exceptions import JobRegistrationError, SettingsError
from django_pgqueue.limits import declared_limits, stored_limits, sync_declared_limits
from django_pgqueue.models import ConcurrencyLimit, Job, JobStatus
from tests.testapp.models import Execution
from tests.workers import WorkerProcess, wait_for

# -- Declaring limits ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("QUEUE_LIMITS", ["video"], "PGQUEUE['QUEUE_LIMITS'] must be a dict of queue names"),
        ("QUEUE_LIMITS", {"video": 0}, "PGQUEUE['QUEUE_LIMITS']['video'] must be an integer"),
        ("QUEUE_LIMITS", {"video": 2.5}, "must be an integer from 1 to 1000000"),
        ("QUEUE_LIMITS", {"video": True}, "must be an integer from 1 to 1000000"),
        ("QUEUE_LIMITS", {"video": None}, "must be an integer from 1 to 1000000"),
        ("QUEUE_LIMITS", {"bad name": 2}, "'bad name' is not a valid queue name"),
        ("JOB_TYPE_LIMITS", {"media.transcode": -1}, "must be an integer from 1 to"),
        ("JOB_TYPE_LIMITS", {"bad type!": 2}, "'bad type!' is not a valid job type"),
        ("JOB_TYPE_LIMITS", "media.transcode=2", "must be a dict of job types to integers"),
    ],
)
def test_malformed_limit_settings_are_rejected_with_the_fix(pgqueue_settings, key, value, message):
    pgqueue_settings(**{key: value})

    with pytest.raises(SettingsError) as excinfo:
        conf.get_settings()

    assert message in str(excinfo.value)


def test_a_malformed_limit_setting_is_reported_by_the_system_check(pgqueue_settings):
    pgqueue_settings(QUEUE_LIMITS={"video": 0})

    errors = [m for m in run_checks() if m.id == "django_pgqueue.E001"]

    assert len(errors) == 1 and "QUEUE_LIMITS" in errors[0].msg


def test_a_limit_on_a_job_type_without_a_handler_is_warned_about(pgqueue_settings):
    pgqueue_settings(JOB_TYPE_LIMITS={"tests.record": 2, "tests.recrod": 2})

    warnings = [m for m in run_checks() if m.id == "django_pgqueue.W301"]

    assert [w.msg for w in warnings] == [
        "PGQUEUE['JOB_TYPE_LIMITS'] limits job type 'tests.recrod', which has no handler"
    ]


@pytest.mark.parametrize("value", [0, -2, 1.5, "2", True, 10**7])
def test_job_concurrency_must_be_a_positive_integer(clean_registry, value):
    with pytest.raises(JobRegistrationError, match="must be an integer from 1 to 1000000"):

        @job("tests.limited_bad", concurrency=value)
        def handler(job: Job) -> None: ...


def test_declared_limits_come_from_settings_and_job_decorators(clean_registry, pgqueue_settings):
    @job("tests.limited_a", concurrency=2)
    def limited_a(job: Job) -> None: ...

    pgqueue_settings(QUEUE_LIMITS={"video": 3}, JOB_TYPE_LIMITS={"tests.limited_b": 1})

    assert declared_limits() == {
        ("job_type", "tests.limited_a"): 2,
        ("job_type", "tests.limited_b"): 1,
        ("queue", "video"): 3,
    }


def test_the_setting_wins_over_the_decorator_and_none_lifts_its_limit(
    clean_registry, pgqueue_settings
):
    @job("tests.limited_a", concurrency=2)
    def limited_a(job: Job) -> None: ...

    @job("tests.limited_b", concurrency=2)
    def limited_b(job: Job) -> None: ...

    pgqueue_settings(JOB_TYPE_LIMITS={"tests.limited_a": 5, "tests.limited_b": None})

    assert declared_limits() == {("job_type", "tests.limited_a"): 5}


# -- Writing them to pgqueue_limits -------------------------------------------------------


@pytest.mark.django_db
def test_sync_makes_the_table_equal_to_the_declared_limits(pgqueue_settings, caplog):
    ConcurrencyLimit.objects.create(scope="queue", name="video", declared=5)
    ConcurrencyLimit.objects.create(scope="queue", name="gone", declared=1)
    pgqueue_settings(QUEUE_LIMITS={"video": 2}, JOB_TYPE_LIMITS={"tests.record": 3})

    with caplog.at_level("INFO", logger="django_pgqueue.limits"):
        sync_declared_limits("default")

    assert stored_limits() == {("job_type", "tests.record"): 3, ("queue", "video"): 2}
    assert sorted(r.getMessage() for r in caplog.records) == [
        "concurrency limit removed: queue gone (was 1)",
        "concurrency limit set: job_type tests.record = 3 (was none)",
        "concurrency limit set: queue video = 2 (was 5)",
    ]


@pytest.mark.django_db
def test_sync_leaves_unchanged_limits_alone(pgqueue_settings):
    long_ago = timezone.now() - timedelta(days=30)
    ConcurrencyLimit.objects.create(scope="queue", name="video", declared=2, updated_at=long_ago)
    pgqueue_settings(QUEUE_LIMITS={"video": 2})

    sync_declared_limits("default")

    assert ConcurrencyLimit.objects.get().updated_at == long_ago


@pytest.mark.django_db
def test_sync_with_nothing_declared_removes_every_limit():
    ConcurrencyLimit.objects.create(scope="job_type", name="tests.record", declared=2)

    sync_declared_limits("default")

    assert stored_limits() == {}


# -- The claim keeps them -----------------------------------------------------------------


def claim(batch_size: int = 10, conn: Any = None) -> list[Job]:
    """Call ``claim_job_batch`` on Django's connection, or on ``conn`` (psycopg)."""
    sql = "SELECT id FROM claim_job_batch('w', NULL, %s, NULL)"
    if conn is not None:
        return [row[0] for row in conn.execute(sql, [batch_size]).fetchall()]
    with connection.cursor() as cursor:
        cursor.execute(sql, [batch_size])
        return [row[0] for row in cursor.fetchall()]


def limit(scope: str, name: str, max_running: int) -> None:
    ConcurrencyLimit.objects.create(scope=scope, name=name, declared=max_running)


@pytest.mark.django_db
def test_a_queue_limit_caps_a_claim_and_other_queues_fill_the_batch(make_job):
    video = [make_job(queue="video", priority=200) for _ in range(5)]
    emails = [make_job(queue="emails") for _ in range(3)]
    limit("queue", "video", 2)

    claimed = set(claim(batch_size=10))

    assert claimed == {video[0].id, video[1].id, *(job.id for job in emails)}


@pytest.mark.django_db
def test_jobs_already_claimed_or_running_count_towards_the_limit(make_job):
    make_job(job_type="tests.record", status="running", worker_id="x")
    make_job(job_type="tests.record", status="claimed", worker_id="x")
    waiting = [make_job(job_type="tests.record") for _ in range(3)]
    limit("job_type", "tests.record", 3)

    assert claim() == [waiting[0].id]
    assert claim() == []


@pytest.mark.django_db
def test_under_a_limit_the_job_due_earliest_takes_the_room(make_job):
    now = timezone.now()
    due_later = make_job(
        job_type="tests.record",
        created_at=now - timedelta(hours=2),
        run_at=now - timedelta(minutes=5),
    )
    due_first = make_job(
        job_type="tests.record",
        created_at=now - timedelta(hours=1),
        run_at=now - timedelta(minutes=30),
    )
    limit("job_type", "tests.record", 1)

    assert claim() == [due_first.id]
    assert due_later.id not in claim()


def claim_all() -> list[Any]:
    """Claim until a claim returns nothing (a claim may leave some room to the next)."""
    claimed: list[Any] = []
    while batch := claim():
        claimed += batch
    return claimed


@pytest.mark.django_db
def test_a_job_under_a_queue_and_a_job_type_limit_keeps_both(make_job):
    transcodes = [make_job(queue="video", job_type="tests.record", priority=200) for _ in range(3)]
    others = [make_job(queue="video", job_type="tests.noop") for _ in range(3)]
    limit("queue", "video", 3)
    limit("job_type", "tests.record", 1)

    claimed = claim_all()

    # One transcode (its type's limit), then other jobs of the queue up to its limit of 3.
    assert set(claimed) == {transcodes[0].id, others[0].id, others[1].id}


@pytest.mark.django_db
def test_finished_jobs_free_room_under_the_limit(make_job):
    jobs = [make_job(queue="video") for _ in range(3)]
    limit("queue", "video", 1)
    assert claim() == [jobs[0].id]

    Job.objects.filter(pk=jobs[0].pk).update(status=JobStatus.COMPLETED)

    assert claim() == [jobs[1].id]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("scope", "name"), [("queue", "video"), ("job_type", "tests.record")], ids=["queue", "type"]
)
def test_concurrent_claimers_never_exceed_a_limit_together(scope, name):
    enqueue_many([{"job_type": "tests.record", "queue": "video"} for _ in range(20)])
    limit(scope, name, 2)

    claimed = claim_concurrently(claimers=8, batch_size=5)

    assert sum(len(ids) for ids in claimed) == 2
    assert Job.objects.filter(status=JobStatus.CLAIMED).count() == 2


def claim_concurrently(claimers: int, batch_size: int) -> list[list[Any]]:
    """Let ``claimers`` connections claim at the same moment, each holding its claim
    uncommitted a while (a claimer that ignored the locks would then see room that is
    not there); return what each claimed. Fails if any claimer fails."""
    barrier = threading.Barrier(claimers)
    claimed: list[list[Any]] = []
    errors: list[BaseException] = []

    def claimer() -> None:
        conn = connection.get_new_connection(connection.get_connection_params())
        conn.autocommit = True
        try:
            with conn.transaction():
                barrier.wait(timeout=10)
                ids = claim(batch_size=batch_size, conn=conn)
                threading.Event().wait(0.2)
            claimed.append(ids)
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=claimer) for _ in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    return claimed


# -- Several real worker processes --------------------------------------------------------


def most_at_once(intervals: list[tuple[Any, Any]]) -> int:
    """The most intervals that overlap at any instant (an end before a start at a tie)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def drain_then_runs(jobs: list[Job], workers: list[WorkerProcess]) -> list[tuple[Any, ...]]:
    """Wait until ``workers`` completed ``jobs``, stop them, and return every recorded
    run as (started_at, finished_at, worker_id)."""
    try:
        wait_for(
            lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == len(jobs),
            timeout=90,
        )
    finally:
        for worker in workers:
            worker.stop()
    return list(Execution.objects.values_list("started_at", "finished_at", "worker_id"))


# A worker stalled for seconds on a loaded machine would have its jobs recovered and run
# again while it still runs them: at-least-once, but no longer "at most 2 at once".
def worker_settings(scope: str, name: str, max_running: int) -> dict[str, str]:
    setting = "QUEUE_LIMITS" if scope == "queue" else "JOB_TYPE_LIMITS"
    return {
        "PGQUEUE_TEST_SETTINGS": json.dumps(
            {"HEARTBEAT_INTERVAL": 1, "STALE_AFTER": 60, setting: {name: max_running}}
        )
    }


# Each variant splits the jobs in two groups under one limit, and gives each group its own
# workers: several processes then necessarily compete for the same limit (unrestricted
# workers would let whichever process starts first keep re-claiming every freed place).
VARIANTS = {
    "queue": (
        ("queue", "video"),
        [("tests.record", "video"), ("tests.durable", "video")],
        [["--job-types", "tests.record"], ["--job-types", "tests.durable"]],
    ),
    "type": (
        ("job_type", "tests.record"),
        [("tests.record", "video"), ("tests.record", "images")],
        [["--queues", "video"], ["--queues", "images"]],
    ),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("variant", VARIANTS)
def test_worker_processes_never_run_more_jobs_at_once_than_the_limit(variant):
    (scope, name), groups, restrictions = VARIANTS[variant]
    # The workers write the limit from their settings when they start.
    jobs = enqueue_many(
        [
            {"job_type": job_type, "queue": queue, "data": {"sleep": 0.08}}
            for job_type, queue in groups
            for _ in range(12)
        ]
    )
    workers = [
        WorkerProcess(
            "--concurrency",
            "4",
            "--poll-interval",
            "0.2",
            "--worker-id",
            f"w{i}",
            *restriction,
            env=worker_settings(scope, name, 2),
        )
        for i, restriction in enumerate([*restrictions, restrictions[0]])
    ]
    executions = drain_then_runs(jobs, workers)

    assert len(executions) == len(jobs)  # each job ran once
    assert most_at_once([(start, end) for start, end, _ in executions]) == 2
    assert len({worker_id for _, _, worker_id in executions}) >= 2
    assert ConcurrencyLimit.objects.filter(scope=scope, name=name, max_running=2).exists()
