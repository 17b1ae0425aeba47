"""Rate limits: declaring them (``@job``, settings, overrides), ``claim_job_batch``
keeping them over any window, under concurrent claimers and real worker processes, and
what they look like to staff."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import DataError, connection
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import conf, enqueue, enqueue_many, job, registry
from django_pgqueue.exceptions import (
    InvalidArgumentError,
    InvalidJobError,
    JobRegistrationError,
    SettingsError,
)
from django_pgqueue.models import Job, JobStatus, RateLimit, RateLimitStart
from django_pgqueue.rate_limits import (
    declared_rate_limits,
    override_rate_limit,
    prune_rate_starts,
    rate_limit_states,
    sync_declared_rate_limits,
)
from django_pgqueue.rates import Rate, parse_rate
from django_pgqueue.recovery import release_held_jobs
from django_pgqueue.worker import Worker
from django_pgqueue.worker.pacing import RATED_START_WITHIN
from tests.plans import plan_nodes, scans_of, statement_plans
from tests.testapp import rated_jobs
from tests.workers import WorkerProcess, wait_for, worker_thread

# -- Rates --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("100/m", Rate(100, 60)),
        ("10/s", Rate(10, 1)),
        ("5000/h", Rate(5000, 3600)),
        ("20/d", Rate(20, 86_400)),
        ("30/10s", Rate(30, 10)),
        ("100 / 15 minutes", Rate(100, 900)),
        ("1/second", Rate(1, 1)),
        ("7/2 Hours", Rate(7, 7200)),
    ],
)
def test_rates_are_read_as_jobs_per_period(text, rate):
    assert parse_rate(text, "rate_limit") == rate


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10/fortnight", "must be a rate such as"),
        ("10/ms", "must be a rate such as"),
        ("10", "must be a rate such as"),
        ("1.5/s", "must be a rate such as"),
        ("-1/s", "must be a rate such as"),
        ("0/s", "allows from 1 to 1000000 jobs per period, got 0"),
        ("1000001/s", "allows from 1 to 1000000 jobs per period"),
        ("10/0s", "must have a period from 1 second to 7 days, got 0"),
        ("10/8d", "must have a period from 1 second to 7 days"),
        (10, 'must be a rate such as "100/m" or "10/s", got int'),
        (None, "got NoneType"),
    ],
)
def test_malformed_rates_are_refused_naming_the_field(value, message):
    with pytest.raises(InvalidArgumentError) as excinfo:
        parse_rate(value, "rate_limit")

    assert excinfo.value.field == "rate_limit"
    assert message in str(excinfo.value)


def test_a_rate_reads_back_as_written():
    assert [str(parse_rate(t, "r")) for t in ["100/m", "10/s", "5/h", "2/d", "30/10s"]] == [
        "100/m",
        "10/s",
        "5/h",
        "2/d",
        "30/10s",
    ]


# -- Declaring them -----------------------------------------------------------------------


def test_a_job_type_declares_its_rate_limit(clean_registry):
    @job("tests.rated", rate_limit="100/m")
    def rated(job: Job) -> None: ...

    assert rated.rate_limit == Rate(100, 60)
    assert declared_rate_limits() == {("job_type", "tests.rated"): Rate(100, 60)}


@pytest.mark.parametrize("rate_limit", ["10/fortnight", "0/m", "-3/s", 2.5, "3.5/m"])
def test_a_malformed_rate_limit_is_refused_at_registration(clean_registry, rate_limit):
    with pytest.raises(InvalidArgumentError, match="rate_limit"):

        @job("tests.badly_rated", rate_limit=rate_limit)
        def badly_rated(job: Job) -> None: ...

    assert "tests.badly_rated" not in declared_rate_limits()


def test_settings_declare_queue_rates_and_win_over_a_job_types_own(
    clean_registry, pgqueue_settings
):
    @job("tests.rated_a", rate_limit="10/s")
    def rated_a(job: Job) -> None: ...

    @job("tests.rated_b", rate_limit="10/s")
    def rated_b(job: Job) -> None: ...

    pgqueue_settings(
        QUEUE_RATE_LIMITS={"emails": "100/m"},
        JOB_TYPE_RATE_LIMITS={"tests.rated_a": "5/h", "tests.rated_b": None},
    )

    assert declared_rate_limits() == {
        ("job_type", "tests.rated_a"): Rate(5, 3600),
        ("queue", "emails"): Rate(100, 60),
    }


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("QUEUE_RATE_LIMITS", ["emails"], "must be a dict of queue names to rates"),
        ("QUEUE_RATE_LIMITS", {"emails": "10/fortnight"}, "['emails']: must be a rate"),
        ("QUEUE_RATE_LIMITS", {"emails": None}, "must be a rate such as"),
        ("QUEUE_RATE_LIMITS", {"bad name": "1/s"}, "'bad name' is not a valid queue name"),
        ("JOB_TYPE_RATE_LIMITS", {"a.b": "0/s"}, "allows from 1 to 1000000 jobs"),
        ("JOB_TYPE_RATE_LIMITS", "a.b=1/s", "must be a dict of job types to rates"),
    ],
)
def test_malformed_rate_limit_settings_are_refused_with_the_fix(
    pgqueue_settings, key, value, message
):
    pgqueue_settings(**{key: value})

    with pytest.raises(SettingsError) as excinfo:
        conf.get_settings()

    assert message in str(excinfo.value)


@pytest.mark.django_db
def test_sync_writes_the_declared_rates_and_keeps_overrides(pgqueue_settings, caplog):
    RateLimit.objects.create(scope="queue", name="gone", declared_jobs=1, declared_seconds=1)
    RateLimit.objects.create(
        scope="queue",
        name="overridden",
        declared_jobs=1,
        declared_seconds=1,
        override_jobs=9,
        override_seconds=60,
    )
    pgqueue_settings(QUEUE_RATE_LIMITS={"emails": "100/m"})

    with caplog.at_level("INFO", logger="django_pgqueue.limits"):
        sync_declared_rate_limits()

    states = {(s.scope, s.name): s for s in rate_limit_states()}
    assert {key: (s.declared, s.override, s.rate) for key, s in states.items()} == {
        ("queue", "emails"): (Rate(100, 60), None, Rate(100, 60)),
        ("queue", "overridden"): (None, Rate(9, 60), Rate(9, 60)),
    }
    assert sorted(r.getMessage() for r in caplog.records) == [
        "rate limit removed: queue gone (was 1/s)",
        "rate limit removed: queue overridden (was 1/s)",
        "rate limit set: queue emails = 100/m (was none)",
    ]


@pytest.mark.django_db
def test_an_override_wins_until_cleared(pgqueue_settings):
    pgqueue_settings(QUEUE_RATE_LIMITS={"emails": "100/m"})
    sync_declared_rate_limits()

    state = override_rate_limit("queue", "emails", "5/s")
    assert (state.declared, state.override, state.rate) == (Rate(100, 60), Rate(5, 1), Rate(5, 1))

    state = override_rate_limit("queue", "emails", None)
    assert (state.override, state.rate) == (None, Rate(100, 60))
    assert override_rate_limit("job_type", "tests.record", "1/h").rate == Rate(1, 3600)
    assert override_rate_limit("job_type", "tests.record", None) is None
    assert not RateLimit.objects.filter(name="tests.record").exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("scope", "name", "rate", "field"),
    [
        ("tenant", "tests.record", "1/s", "scope"),
        ("queue", "bad name", "1/s", "name"),
        ("queue", "emails", "10/fortnight", "rate"),
        ("queue", "emails", "0/s", "rate"),
    ],
)
def test_a_bad_override_is_refused_and_nothing_is_written(scope, name, rate, field):
    with pytest.raises(InvalidArgumentError) as excinfo:
        override_rate_limit(scope, name, rate)

    assert excinfo.value.field == field
    assert not RateLimit.objects.exists()


# -- The claim keeps them -----------------------------------------------------------------


def claim(
    batch_size: int = 10,
    free_slots: int | None = None,
    conn: Any = None,
    start_within: float | None = None,
) -> list[Any]:
    """Call ``claim_job_batch`` as a worker does (``p_start``); return the ids claimed."""
    sql = "SELECT id FROM claim_job_batch('w', NULL, %s, NULL, true, %s, %s)"
    params = [batch_size, free_slots, start_within]
    if conn is not None:
        return [row[0] for row in conn.execute(sql, params).fetchall()]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def rate(scope: str, name: str, text: str) -> None:
    parsed = parse_rate(text, "rate")
    RateLimit.objects.create(
        scope=scope, name=name, declared_jobs=parsed.jobs, declared_seconds=parsed.seconds
    )


def records(count: int, **options: Any) -> list[Job]:
    return enqueue_many([{"job_type": "tests.record", **options} for _ in range(count)])


@pytest.mark.django_db
def test_a_job_type_over_its_rate_stays_pending_without_spending_an_attempt():
    rate("job_type", "tests.record", "3/m")
    jobs = records(10)
    other = enqueue("tests.noop")

    first = claim()
    again = claim()

    assert len(first) == 4 and other.id in first  # 3 of the limited type, and the other
    assert again == []
    waiting = Job.objects.filter(pk__in=[j.pk for j in jobs], status=JobStatus.PENDING)
    assert waiting.count() == 7
    assert {(j.attempts, j.worker_id) for j in waiting} == {(0, None)}


@pytest.mark.django_db
def test_a_queue_over_its_rate_stays_pending_and_other_queues_go_on():
    rate("queue", "emails", "2/m")
    records(5, queue="emails")
    others = records(3, queue="reports")

    claimed = claim()

    assert Job.objects.filter(pk__in=claimed, queue="emails").count() == 2
    assert set(claimed) >= {j.id for j in others}


@pytest.mark.django_db
def test_the_window_slides_each_claim_counts_until_its_period_has_passed():
    rate("job_type", "tests.record", "2/2s")
    records(5)

    assert len(claim(batch_size=1)) == 1
    time.sleep(0.8)
    assert len(claim()) == 1  # the second of the window
    assert claim() == []
    time.sleep(1.4)  # the first claim left the window; the second not yet
    assert len(claim()) == 1
    assert claim() == []


@pytest.mark.django_db
def test_the_tightest_of_a_queue_and_a_job_type_rate_applies():
    rate("queue", "default", "5/m")
    rate("job_type", "tests.record", "2/m")
    records(4)
    noops = [enqueue("tests.noop") for _ in range(4)]

    claimed = set(claim()) | set(claim())  # a pass may leave room for the next claim

    assert len(claimed) == 5
    assert Job.objects.filter(pk__in=claimed, job_type="tests.record").count() == 2
    assert len(claimed & {j.id for j in noops}) == 3


@pytest.mark.django_db
def test_a_batch_holding_rate_limited_jobs_is_no_larger_than_the_free_slots():
    rate("job_type", "tests.record", "100/m")
    records(10)

    assert len(claim(batch_size=10, free_slots=3)) == 3


@pytest.mark.django_db
def test_without_a_free_slot_rate_limited_jobs_are_left_and_others_prefetched():
    rate("job_type", "tests.record", "100/m")
    limited = records(3, priority=200)
    others = [enqueue("tests.noop") for _ in range(2)]

    claimed = claim(batch_size=10, free_slots=0)

    assert set(claimed) == {j.id for j in others}
    assert not Job.objects.filter(pk__in=[j.pk for j in limited]).exclude(status="pending")


@pytest.mark.django_db
def test_jobs_without_a_rate_fill_the_batch_past_the_free_slots():
    rate("job_type", "tests.other", "1/m")
    records(10)

    assert len(claim(batch_size=10, free_slots=2)) == 10


@pytest.mark.django_db
def test_a_prefetching_claim_counts_rated_jobs_as_started_when_they_must_start():
    rate("job_type", "tests.record", "100/m")
    limited = records(6)
    other = enqueue("tests.noop")

    claimed = Job.objects.filter(pk__in=claim(batch_size=10, free_slots=2, start_within=0.25))

    assert {j.id for j in claimed} == {j.id for j in limited} | {other.id}
    (start,) = RateLimitStart.objects.all()
    assert start.jobs == 6
    for claimed_job in claimed:
        start_gap = claimed_job.started_at - claimed_job.claimed_at
        if claimed_job.job_type == "tests.record":  # must start by the moment it is counted at
            assert claimed_job.started_at == start.started_at
            assert start_gap == timedelta(seconds=0.25)
        else:
            assert start_gap == timedelta(0)


@pytest.mark.django_db
def test_a_claim_that_fits_its_free_slots_counts_its_jobs_at_once():
    rate("job_type", "tests.record", "100/m")
    records(6)

    claimed = Job.objects.filter(pk__in=claim(batch_size=3, free_slots=3, start_within=0.25))

    (start,) = RateLimitStart.objects.all()
    assert {(j.claimed_at, j.started_at) for j in claimed} == {(start.started_at,) * 2}


@pytest.mark.django_db(transaction=True)
def test_a_job_counted_later_holds_its_window_until_a_period_after_that():
    rate("job_type", "tests.record", "2/s")
    records(4)

    assert len(claim(batch_size=4, free_slots=1, start_within=0.6)) == 2
    time.sleep(1.2)  # a period after the claim, not after the moment it counted
    assert claim(batch_size=4, free_slots=4) == []
    time.sleep(0.6)
    assert len(claim(batch_size=4, free_slots=4)) == 2


@pytest.mark.django_db
@pytest.mark.parametrize("start_within", [0, -1, 60.5, float("nan"), float("inf")])
def test_a_claim_refuses_a_start_within_out_of_range(start_within):
    records(1)

    with pytest.raises(DataError, match="p_start_within must be NULL or more than 0"):
        claim(batch_size=2, free_slots=1, start_within=start_within)


@pytest.mark.django_db
def test_a_claim_records_its_jobs_start_at_the_moment_it_decided():
    rate("job_type", "tests.record", "2/m")
    records(3)

    claimed = Job.objects.filter(pk__in=claim())

    (start,) = RateLimitStart.objects.all()
    assert (start.scope, start.name, start.jobs) == ("job_type", "tests.record", 2)
    assert {(j.claimed_at, j.started_at) for j in claimed} == {(start.started_at,) * 2}


@pytest.mark.django_db
def test_the_state_shows_the_window_and_when_it_has_room(pgqueue_settings):
    rate("job_type", "tests.record", "2/m")
    records(3)
    claim()

    (state,) = rate_limit_states()

    assert (state.scope, state.name, state.rate, state.started_in_window) == (
        "job_type",
        "tests.record",
        Rate(2, 60),
        2,
    )
    assert 55 < state.room_in <= 60


@pytest.mark.django_db
def test_the_wait_function_says_when_a_full_limit_has_room_for_a_worker():
    rate("job_type", "tests.record", "1/m")
    rate("queue", "emails", "1/m")
    records(2)

    def wait(job_types: list[str] | None, queues: list[str] | None) -> float | None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pgqueue_rate_limit_wait(%s, %s)", [job_types, queues])
            return cursor.fetchone()[0]

    assert wait(None, None) is None  # no limit is full
    claim()
    assert 55 < wait(None, None) <= 60
    assert 55 < wait(["tests.record"], ["default"]) <= 60
    assert wait(["tests.noop"], None) is None  # full, but not of these job types
    assert wait(None, ["emails"]) is not None  # the job type's limit is full


@pytest.mark.django_db
def test_a_window_that_got_room_while_the_claim_ran_says_claim_again_at_once():
    # The claim saw the window full; its oldest start left the window a moment later,
    # before the worker asked when to claim next. "No limit is full" (NULL) would send
    # the worker to sleep until its next poll while the room goes unused.
    rate("job_type", "tests.record", "1/s")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_rate_starts (scope, name, started_at, jobs) "
            "VALUES ('job_type', 'tests.record', now() - interval '950 ms', 1)"
        )
        cursor.execute("SELECT pg_sleep(0.1)")  # the start leaves the window meanwhile
        cursor.execute("SELECT pgqueue_rate_limit_wait(NULL, NULL)")
        assert cursor.fetchone() == (0.0,)


@pytest.mark.django_db
def test_recovery_prunes_starts_that_left_their_window_and_those_of_removed_limits():
    rate("job_type", "tests.record", "5/s")
    now = timezone.now()
    # Kept a minute past the window: a claim counting the window must not lose a row
    # that a prune, running meanwhile, found expired.
    for scope, name, age in [
        ("job_type", "tests.record", 0),
        ("job_type", "tests.record", 30),
        ("job_type", "tests.record", 62),
        ("queue", "removed", 0),
    ]:
        RateLimitStart.objects.create(
            scope=scope, name=name, started_at=now - timedelta(seconds=age), jobs=1
        )

    assert prune_rate_starts() == 2
    assert list(RateLimitStart.objects.values_list("name", flat=True)) == ["tests.record"] * 2


def claim_concurrently(claimers: int, rounds: int) -> list[Any]:
    """``claimers`` connections claim one job at a time, ``rounds`` times each, as fast as
    they can; return every id claimed. Fails if any claimer fails (a deadlock would)."""
    barrier = threading.Barrier(claimers)
    claimed: list[Any] = []
    errors: list[BaseException] = []

    def claimer() -> None:
        conn = connection.get_new_connection(connection.get_connection_params())
        conn.autocommit = True
        try:
            barrier.wait(timeout=10)
            for _ in range(rounds):
                claimed.extend(claim(batch_size=2, conn=conn))
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=claimer) for _ in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return claimed


def most_in_any_window(starts: list[Any], seconds: float) -> int:
    """The most of ``starts`` within any half-open window ``(t - seconds, t]``."""
    ordered = sorted(starts)
    most = first = 0
    for last, start in enumerate(ordered):
        while ordered[first] <= start - timedelta(seconds=seconds):
            first += 1
        most = max(most, last - first + 1)
    return most


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_exceed_a_rate_in_any_window():
    rate("queue", "default", "5/s")
    rate("job_type", "tests.record", "3/s")
    records(60)
    enqueue_many([{"job_type": "tests.noop"} for _ in range(60)])
    started = time.monotonic()

    claimed = claim_concurrently(claimers=4, rounds=40)

    elapsed = time.monotonic() - started
    jobs = Job.objects.filter(pk__in=claimed)
    assert len(set(claimed)) == len(claimed)
    assert most_in_any_window([j.started_at for j in jobs], 1) <= 5
    assert most_in_any_window([j.started_at for j in jobs if j.job_type == "tests.record"], 1) <= 3
    assert len(claimed) <= 5 * (elapsed + 1)


@pytest.mark.django_db(transaction=True)
def test_a_worker_starts_rate_limited_jobs_no_later_than_they_were_counted(
    pgqueue_settings,
):
    pgqueue_settings(JOB_TYPE_RATE_LIMITS={"tests.record": "4/s"})
    enqueue_many([{"job_type": "tests.noop"} for _ in range(5)])  # how fast jobs run
    jobs = records(8)

    with worker_thread(concurrency=2, prefetch=10, poll_interval=5):
        wait_for(
            lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == len(jobs) + 5,
            timeout=20,
        )

    done = list(Job.objects.filter(job_type="tests.record"))
    counted = sorted(start.started_at for start in RateLimitStart.objects.all())
    longest = timedelta(seconds=RATED_START_WITHIN[1])
    for done_job in done:  # started after its claim, by the moment its limit counted it at
        claimed_at, started_at = done_job.claimed_at, done_job.started_at
        assert claimed_at <= started_at
        assert any(started_at <= m and claimed_at <= m <= claimed_at + longest for m in counted)
    assert sum(start.jobs for start in RateLimitStart.objects.all()) == len(jobs)
    assert most_in_any_window([j.started_at for j in done], 1) <= 4
    # It claimed when the window had room, not at its 5 s poll.
    span = max(j.started_at for j in done) - min(j.started_at for j in done)
    assert span < timedelta(seconds=3)


@pytest.mark.django_db(transaction=True)
def test_a_prefetched_job_not_started_by_its_counted_moment_is_handed_back(
    pgqueue_settings, caplog
):
    pgqueue_settings(QUEUE_RATE_LIMITS={"rated": "100/s"})
    enqueue_many([{"job_type": "tests.noop"} for _ in range(20)])  # fast: a deep buffer

    with worker_thread(concurrency=1, prefetch=50, poll_interval=0.2):
        wait_for(lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == 20)
        slow = enqueue("tests.record", data={"sleep": 0.8})
        wait_for(lambda: Job.objects.filter(pk=slow.pk, status=JobStatus.RUNNING).exists())
        rated = [enqueue("tests.noop", queue="rated") for _ in range(3)]
        # Prefetched behind the slow job, counted as started ~10 ms after their claim.
        wait_for(lambda: RateLimitStart.objects.exists())
        wait_for(lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == 24, timeout=20)

    assert "handed back" in caplog.text
    # Counted once each: handed back, their attempt and their room went back with them.
    assert sum(start.jobs for start in RateLimitStart.objects.all()) == 3
    assert {j.attempts for j in Job.objects.filter(pk__in=[j.pk for j in rated])} == {1}


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_waits_out_the_window_of_due_rate_limited_jobs(pgqueue_settings):
    pgqueue_settings(JOB_TYPE_RATE_LIMITS={"tests.record": "5/s"})
    jobs = records(12)

    Worker(concurrency=4, burst=True, poll_interval=5).run()

    done = Job.objects.filter(status=JobStatus.COMPLETED)
    assert done.count() == len(jobs)
    assert most_in_any_window([j.started_at for j in done], 1) <= 5


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_does_not_wait_for_a_full_window_with_nothing_due(pgqueue_settings):
    pgqueue_settings(JOB_TYPE_RATE_LIMITS={"tests.record": "1/h"})
    records(1)
    later = enqueue("tests.record", delay=3600)
    started = time.monotonic()

    Worker(concurrency=2, burst=True, poll_interval=5).run()

    assert time.monotonic() - started < 4
    assert Job.objects.get(pk=later.pk).status == JobStatus.PENDING
    assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 1


def rated_worker(worker_id: str, rates: dict[str, str]) -> WorkerProcess:
    return WorkerProcess(
        "--concurrency",
        "4",
        "--worker-id",
        worker_id,
        env={
            "PGQUEUE_TEST_SETTINGS": json.dumps(
                {"HEARTBEAT_INTERVAL": 1, "STALE_AFTER": 60, "JOB_TYPE_RATE_LIMITS": rates}
            )
        },
    )


@pytest.mark.django_db(transaction=True)
def test_worker_processes_keep_a_rate_in_every_window_and_use_it_fully():
    # Jobs of 50 ms, as calls to a rate-limited API are: a worker prefetches few of them,
    # so every window is claimed by several processes at once. (Fast jobs let the first
    # worker to claim take a whole window into its buffer.)
    jobs = records(40, data={"sleep": 0.05})
    workers = [rated_worker(f"w{i}", {"tests.record": "10/s"}) for i in range(3)]
    try:
        wait_for(
            lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == len(jobs),
            timeout=60,
        )
    finally:
        for worker in workers:
            worker.stop()

    done = list(Job.objects.all())
    starts = [j.started_at for j in done]
    assert {j.attempts for j in done} == {1}
    assert most_in_any_window(starts, 1) <= 10
    # 40 jobs at 10 a second: the first 10 at once, the rest within about 3 more seconds.
    assert max(starts) - min(starts) < timedelta(seconds=5)
    assert len({j.worker_id for j in done}) > 1


# -- The admin ----------------------------------------------------------------------------


CHANGELIST = "admin:django_pgqueue_ratelimit_changelist"


def test_the_admin_shows_each_rate_and_how_full_its_window_is(staff, pgqueue_settings):
    pgqueue_settings(JOB_TYPE_RATE_LIMITS={"tests.record": "2/m"}, QUEUE_RATE_LIMITS={"q": "5/s"})
    sync_declared_rate_limits()
    override_rate_limit("queue", "q", "10/h")
    records(3)
    claim()
    client = staff("view_ratelimit")

    page = client.get(reverse(CHANGELIST)).content.decode()

    assert '<td class="field-declared">2/m</td>' in page
    assert '<td class="field-declared">5/s</td>' in page
    assert '<td class="field-override">10/h</td>' in page
    assert '<td class="field-enforced">10/h</td>' in page
    assert '<td class="field-window">2 of 2</td>' in page
    assert '<td class="field-window">0 of 10</td>' in page
    assert re.search(r'<td class="field-room_in">in (5[5-9]|60)\.\d s</td>', page)
    assert '<td class="field-room_in">now</td>' in page


def test_staff_override_a_declared_rate_in_the_admin_and_clear_it(staff, pgqueue_settings):
    pgqueue_settings(QUEUE_RATE_LIMITS={"emails": "100/m"})
    sync_declared_rate_limits()
    limit = RateLimit.objects.get()
    client = staff("view_ratelimit", "change_ratelimit")
    url = reverse("admin:django_pgqueue_ratelimit_change", args=[limit.pk])

    assert client.post(url, {"override": "5/s"}).status_code == 302
    assert [(s.override, s.rate) for s in rate_limit_states()] == [(Rate(5, 1), Rate(5, 1))]
    assert 'value="5/s"' in client.get(url).content.decode()
    assert client.post(url, {"override": ""}).status_code == 302
    assert [(s.override, s.rate) for s in rate_limit_states()] == [(None, Rate(100, 60))]


def test_staff_rate_limit_a_queue_nothing_declares_and_delete_it(staff):
    client = staff("view_ratelimit", "add_ratelimit", "change_ratelimit", "delete_ratelimit")

    added = client.post(
        reverse("admin:django_pgqueue_ratelimit_add"),
        {"scope": "queue", "name": "reports", "override": "30/10s"},
    )

    assert added.status_code == 302
    limit = RateLimit.objects.get()
    assert (limit.scope, limit.name, limit.declared_jobs, limit.rate) == (
        "queue",
        "reports",
        None,
        Rate(30, 10),
    )
    deleted = client.post(
        reverse("admin:django_pgqueue_ratelimit_delete", args=[limit.pk]), {"post": "yes"}
    )
    assert deleted.status_code == 302
    assert not RateLimit.objects.exists()


def test_the_admin_refuses_a_malformed_or_missing_rate_and_a_bad_name(staff):
    client = staff("view_ratelimit", "add_ratelimit")
    url = reverse("admin:django_pgqueue_ratelimit_add")

    empty = client.post(url, {"scope": "queue", "name": "reports", "override": ""})
    malformed = client.post(url, {"scope": "queue", "name": "reports", "override": "9/fortnight"})
    bad_name = client.post(url, {"scope": "queue", "name": "has space", "override": "2/s"})

    assert "Nothing declares this rate limit" in empty.content.decode()
    assert "must be a rate such as" in str(malformed.context["adminform"].form.errors["override"])
    assert bad_name.context["adminform"].form.errors["name"]
    assert not RateLimit.objects.exists()


def test_a_declared_rate_cannot_be_deleted_in_the_admin(staff, pgqueue_settings):
    pgqueue_settings(QUEUE_RATE_LIMITS={"emails": "100/m"})
    sync_declared_rate_limits()
    limit = RateLimit.objects.get()
    client = staff("view_ratelimit", "delete_ratelimit")

    single = client.post(
        reverse("admin:django_pgqueue_ratelimit_delete", args=[limit.pk]), {"post": "yes"}
    )
    bulk = client.post(
        reverse(CHANGELIST),
        {"action": "delete_selected", "_selected_action": [limit.pk], "post": "yes"},
    )

    assert single.status_code == 403
    assert "declared by the code or settings; clear its override instead" in (bulk.content.decode())
    assert RateLimit.objects.exists()


def test_a_rate_on_a_job_type_without_a_handler_is_warned_about(pgqueue_settings):
    pgqueue_settings(JOB_TYPE_RATE_LIMITS={"tests.record": "1/s", "tests.recrod": "1/s"})

    warnings = [m for m in run_checks() if m.id == "django_pgqueue.W301"]

    assert [w.msg for w in warnings] == [
        "PGQUEUE['JOB_TYPE_RATE_LIMITS'] limits job type 'tests.recrod', which has no handler"
    ]


def test_a_malformed_rate_setting_is_reported_by_the_system_check(pgqueue_settings):
    pgqueue_settings(QUEUE_RATE_LIMITS={"emails": "10/fortnight"})

    errors = [m for m in run_checks() if m.id == "django_pgqueue.E001"]

    assert len(errors) == 1 and "QUEUE_RATE_LIMITS" in errors[0].msg


# -- Per-key rates ------------------------------------------------------------------------

TENANT_RATE = "tests.per_tenant_rate"


@pytest.fixture
def per_tenant_rate() -> Iterator[Any]:
    """``tests.per_tenant_rate`` (5 jobs a second per ``data['tenant']``) registered, its
    rate written to ``pgqueue_rate_limits`` as a worker starting would."""
    registry.register(rated_jobs.per_tenant_rate)
    sync_declared_rate_limits()
    yield rated_jobs.per_tenant_rate
    registry.unregister(TENANT_RATE)


def test_a_job_type_declares_a_rate_for_each_key(clean_registry):
    @job("tests.keyed_rate", rate_limit="2/m", rate_key="account.id")
    def keyed_rate(job: Job) -> None: ...

    @job("tests.both_keys", concurrency=1, concurrency_key="a", rate_limit="1/s", rate_key="a")
    def both_keys(job: Job) -> None: ...

    assert keyed_rate.key == "account.id" and keyed_rate.key_option == "rate_key"
    assert declared_rate_limits() == {
        ("key", "tests.both_keys"): Rate(1, 1),
        ("key", "tests.keyed_rate"): Rate(2, 60),
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rate_key": "tenant"}, "rate_key needs rate_limit"),
        ({"rate_limit": "1/s", "rate_key": "a..b"}, "rate_key 'a..b' is not a payload path"),
        ({"rate_limit": "1/s", "rate_key": 3}, "rate_key must be a payload path"),
        (
            {"rate_limit": "1/s", "rate_key": "a", "concurrency": 1, "concurrency_key": "b"},
            "a job type has one key for its per-key limits",
        ),
    ],
)
def test_a_bad_rate_key_is_refused_at_registration(clean_registry, options, message):
    with pytest.raises(JobRegistrationError, match=message):

        @job("tests.bad_rate_key", **options)
        def bad(job: Job) -> None: ...

    assert registry.find_definition("tests.bad_rate_key") is None


@pytest.mark.django_db
def test_each_job_gets_its_key_and_a_bad_payload_names_rate_key(per_tenant_rate):
    job_ = enqueue(TENANT_RATE, {"tenant": 42})

    assert Job.objects.values_list("concurrency_key", "held").get(pk=job_.pk) == ("42", False)
    with pytest.raises(InvalidJobError) as excinfo:
        enqueue_many(
            [{"job_type": TENANT_RATE, "data": {"tenant": "a"}}, {"job_type": TENANT_RATE}]
        )
    assert excinfo.value.field == "specs[1].rate_key"
    assert "takes its rate key from data field 'tenant'" in str(excinfo.value)
    assert Job.objects.count() == 1


def tenant_jobs(*tenants: str) -> list[Job]:
    return enqueue_many([{"job_type": TENANT_RATE, "data": {"tenant": t}} for t in tenants])


@pytest.mark.django_db
def test_each_key_has_its_own_window(per_tenant_rate):
    override_rate_limit("key", TENANT_RATE, "2/m")
    tenant_jobs(*"aaaabbbb")

    claimed = Job.objects.filter(pk__in=claim())

    assert sorted(j.concurrency_key for j in claimed) == ["a", "a", "b", "b"]
    assert claim() == []
    assert sorted(RateLimitStart.objects.values_list("name", "jobs")) == [
        (f"{TENANT_RATE}\na", 2),
        (f"{TENANT_RATE}\nb", 2),
    ]


@pytest.mark.django_db
def test_a_key_at_its_rate_does_not_hold_up_other_keys(per_tenant_rate):
    override_rate_limit("key", TENANT_RATE, "1/m")
    tenant_jobs(*["a"] * 30, "b")

    first = Job.objects.filter(pk__in=claim(batch_size=5))

    assert sorted(j.concurrency_key for j in first) == ["a", "b"]
    assert claim(batch_size=5) == []


@pytest.mark.django_db
def test_a_key_a_claim_filled_is_left_out_of_the_walk_until_its_window_has_room(
    per_tenant_rate,
):
    override_rate_limit("key", TENANT_RATE, "2/2s")
    tenant_jobs(*"aaaaaa", "b")

    assert len(claim(batch_size=2)) == 2  # a's first two: its window is full

    (start,) = RateLimitStart.objects.all()
    assert start.full_until == start.started_at + timedelta(seconds=2)
    # Past four more of a's, in a claim of one job: its backlog is not walked.
    (next_job,) = Job.objects.filter(pk__in=claim(batch_size=1))
    assert next_job.concurrency_key == "b"


@pytest.mark.django_db
def test_the_marks_of_full_keys_are_read_through_their_index_on_a_grown_log(per_tenant_rate):
    # The log as a busy minute leaves it, a row per key and claim, grown since it was
    # last analyzed: the planner must still not read every key's starts to find the
    # few marks ahead (with the marks indexed on full_until alone, it read them all
    # through the primary key: a millisecond a claim, and as much a wake-up query).
    with connection.cursor() as cursor:
        # The log as this test grows it, not as earlier tests left it: their calls
        # on this connection may have cached a generic plan of the wait for an empty
        # log (PostgreSQL 18 caches SQL functions' plans), which an ANALYZE that finds
        # it empty again does not invalidate; once, in CI, the wait then read the log
        # with a sequential scan. TRUNCATE gives the table a new, empty file, which
        # invalidates such plans, and drops rolled-back rows' pages; the test's
        # transaction rolls it back.
        cursor.execute("TRUNCATE pgqueue_rate_starts")
        cursor.execute("ANALYZE pgqueue_rate_starts")
        # As a worker's session may come to plan it after many calls (PostgreSQL 18
        # caches the plans of SQL functions): the reads of marks must not depend on it.
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(
            """
            INSERT INTO pgqueue_rate_starts (scope, name, started_at, jobs, full_until)
            SELECT 'key', %s || E'\\n' || (i %% 1000), now() - i * interval '1 ms', 1,
                   CASE WHEN i %% 100 = 0 THEN now() + interval '1 s' - i * interval '1 ms' END
              FROM generate_series(1, 11000) AS i
            """,
            [TENANT_RATE],
        )
    tenant_jobs("a")

    def claim_and_ask_when() -> None:
        claim()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pgqueue_rate_limit_wait(NULL, NULL)")

    plans = statement_plans(claim_and_ask_when)
    reading_marks = [plan for plan in plans if "full_until >" in plan["Query Text"]]

    assert len(reading_marks) == 2  # the claim's, before its walk, and the wait's
    for plan in reading_marks:
        read_marks = [
            index
            for index, conditions in scans_of(plan, "pgqueue_rate_starts")
            if "full_until" in conditions
        ]
        assert read_marks == ["idx_rate_starts_marks"], json.dumps(plan["Plan"], indent=1)


@pytest.mark.django_db
def test_what_a_window_holds_is_its_period_before_the_moment_asked():
    rate("job_type", "tests.record", "3/m")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_rate_starts (scope, name, started_at, jobs) VALUES "
            "('job_type', 'tests.record', '2026-01-01 10:00:00+00', 2), "
            "('job_type', 'tests.record', '2026-01-01 10:00:30+00', 1), "
            "('job_type', 'tests.other', '2026-01-01 10:00:30+00', 7)"
        )

        def window(at: str, max_jobs: int = 3) -> tuple[Any, ...]:
            cursor.execute(
                "SELECT jobs, oldest, room_at FROM pgqueue_rate_window("
                "'job_type', 'tests.record', %s, 60, %s::timestamptz)",
                [max_jobs, at],
            )
            row = cursor.fetchone()
            assert row is not None
            return row

        jobs, oldest, room_at = window("2026-01-01 10:00:59+00")
        assert (jobs, oldest.isoformat()) == (3, "2026-01-01T10:00:00+00:00")
        assert room_at.isoformat() == "2026-01-01T10:01:00+00:00"  # the oldest leaves then
        assert window("2026-01-01 10:00:59+00", max_jobs=4)[2] is None  # room now
        # A start exactly a period before the moment has left the window.
        assert window("2026-01-01 10:01:00+00")[0] == 1
        assert window("2026-01-01 10:01:31+00") == (0, None, None)


@pytest.mark.django_db
def test_every_reader_of_a_window_has_the_window_functions_inlined(per_tenant_rate):
    # Which windows count a job, what a window holds and which limit a window belongs to
    # are each defined once, as SQL functions (rate_window_v1.sql). Inlined, each
    # caller's plan reads the tables through their indexes as the same SQL written in
    # place would; called as functions, they would run once per row, unplanned with it.
    rate("job_type", "tests.record", "2/m")
    rate("queue", "default", "100/m")
    records(3)
    tenant_jobs(*"aab")

    def read_every_window() -> None:
        claim(batch_size=10, free_slots=4)
        claim(batch_size=10, free_slots=4)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pgqueue_rate_limit_wait(NULL, NULL)")
            cursor.execute(
                "UPDATE pgqueue_jobs SET worker_id = 'w' WHERE status = 'running' RETURNING id"
            )
            hand_back([row[0] for row in cursor.fetchall()])
        rate_limit_states()
        prune_rate_starts()

    plans = statement_plans(read_every_window)
    functions = ("pgqueue_rate_window(", "pgqueue_rate_limits_of(", "pgqueue_rate_limit_name(")
    readers = [plan for plan in plans if any(f in plan["Query Text"] for f in functions)]

    # The claim's statements that read windows (the rated candidates, the locks, before
    # the walk, the ranking, the marks of a claim), the wait function's, the hand-back's,
    # the states' and the prune's.
    assert len({plan["Query Text"] for plan in readers}) >= 8, [p["Query Text"] for p in plans]
    for plan in readers:
        for node in plan_nodes(plan["Plan"]):
            scanned = node.get("Function Name", "")
            called = " ".join(str(value) for value in node.values() if isinstance(value, str))
            assert not scanned.startswith("pgqueue_rate_"), (plan["Query Text"], node)
            assert not any(f in called for f in functions), (plan["Query Text"], node)


def hand_back(job_ids: list[Any], worker_id: str = "w") -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgqueue_rate_hand_back(%s::uuid[], %s)", [job_ids, worker_id])
        (taken_back,) = cursor.fetchone()
    return taken_back


@pytest.mark.django_db
def test_a_job_handed_back_unstarted_gives_its_room_back_to_its_windows(per_tenant_rate):
    override_rate_limit("key", TENANT_RATE, "2/m")
    tenant_jobs(*"aaa")
    first, _second = claim(batch_size=10, free_slots=0, start_within=0.05)
    assert RateLimitStart.objects.get().full_until is not None  # a's window is full

    assert hand_back([first], worker_id="another worker") == 0  # not its job: kept
    assert hand_back([first]) == 1

    (start,) = RateLimitStart.objects.all()
    assert (start.jobs, start.full_until) == (1, None)
    Job.objects.filter(pk=first).update(status=JobStatus.PENDING, worker_id=None)
    # The room it held is a's again: one more of a's jobs, and only one.
    assert len(claim(batch_size=10, free_slots=0, start_within=0.05)) == 1
    assert claim(batch_size=10, free_slots=0, start_within=0.05) == []


@pytest.mark.django_db
def test_a_job_without_a_rate_limit_has_nothing_to_give_back():
    records(1)
    (claimed,) = claim()

    assert hand_back([claimed]) == 0
    assert not RateLimitStart.objects.exists()


@pytest.mark.django_db
def test_a_key_keeps_a_windows_worth_of_due_jobs_visible_and_holds_the_rest(per_tenant_rate):
    override_rate_limit("key", TENANT_RATE, "3/m")
    tenant_jobs(*["big"] * 500)

    assert Job.objects.filter(held=False).count() == 3  # its places: the rate's 3 a minute
    taken = claim(batch_size=10)

    assert len(taken) == 3
    # The claim released the next three: visible, passed over while the window is full.
    assert Job.objects.filter(status=JobStatus.PENDING, held=False).count() == 3
    assert Job.objects.filter(held=True).count() == 494


@pytest.mark.django_db
def test_a_key_at_its_rate_costs_a_claim_its_places_not_its_backlog(per_tenant_rate):
    override_rate_limit("key", TENANT_RATE, "3/m")
    tenant_jobs(*["big"] * 2000)
    claim(batch_size=10)  # big's window is full
    (small,) = tenant_jobs("small")

    plans = statement_plans(
        lambda: claim(batch_size=1) == [small.pk] or pytest.fail("small's job not claimed"),
        analyze=True,
    )

    (walk,) = [plan for plan in plans if "array_agg(due.id)" in plan["Query Text"]]
    # Past big's visible places only: its 1,994 held jobs are not in the index walked.
    removed = sum(node.get("Rows Removed by Filter", 0) for node in plan_nodes(walk["Plan"]))
    assert removed <= 3, json.dumps(walk["Plan"], indent=1)


@pytest.mark.django_db
def test_the_sweep_holds_the_backlog_of_a_key_that_gained_a_rate(per_tenant_rate):
    tenant_jobs(*["a"] * 8)  # 5 a second: five visible
    assert Job.objects.filter(held=False).count() == 5
    override_rate_limit("key", TENANT_RATE, "2/m")

    release_held_jobs()

    assert Job.objects.filter(held=False).count() == 2
    override_rate_limit("key", TENANT_RATE, None)
    RateLimit.objects.filter(scope="key").delete()
    release_held_jobs()
    assert not Job.objects.filter(held=True).exists()  # no per-key limit left: all visible


@pytest.mark.django_db
def test_a_full_key_tells_workers_when_it_has_room_and_shows_in_the_state(per_tenant_rate):
    override_rate_limit("key", TENANT_RATE, "1/m")
    tenant_jobs("a", "a", "b")
    claim()

    with connection.cursor() as cursor:
        cursor.execute("SELECT pgqueue_rate_limit_wait(%s, NULL)", [[TENANT_RATE]])
        (wait,) = cursor.fetchone()
    (state,) = rate_limit_states()

    assert 55 < wait <= 60
    assert (state.scope, state.rate, state.started_in_window, state.room_in) == (
        "key",
        Rate(1, 60),
        2,
        None,
    )


@pytest.mark.django_db
def test_recovery_prunes_the_starts_of_keys_that_left_their_window(per_tenant_rate):
    now = timezone.now()
    for key, age in [("a", 0), ("b", 62)]:
        RateLimitStart.objects.create(
            scope="key",
            name=f"{TENANT_RATE}\n{key}",
            started_at=now - timedelta(seconds=age),
            jobs=1,
        )

    assert prune_rate_starts() == 1
    assert list(RateLimitStart.objects.values_list("name", flat=True)) == [f"{TENANT_RATE}\na"]


@pytest.mark.django_db(transaction=True)
def test_worker_processes_keep_each_keys_rate_in_every_window(per_tenant_rate):
    jobs = tenant_jobs(*"abc" * 12)
    workers = [
        WorkerProcess(
            "--concurrency",
            "3",
            "--worker-id",
            f"w{i}",
            env={
                "PGQUEUE_TEST_RATED_JOBS": "1",
                "PGQUEUE_TEST_SETTINGS": json.dumps({"HEARTBEAT_INTERVAL": 1, "STALE_AFTER": 60}),
            },
        )
        for i in range(2)
    ]
    try:
        wait_for(
            lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == len(jobs),
            timeout=60,
        )
    finally:
        for worker in workers:
            worker.stop()

    done = list(Job.objects.all())
    for key in "abc":
        starts = [j.started_at for j in done if j.concurrency_key == key]
        assert len(starts) == 12 and most_in_any_window(starts, 1) <= 5
    # 12 jobs of a key at 5 a second: within about 2 s of the first, keys in parallel.
    everything = [j.started_at for j in done]
    assert max(everything) - min(everything) < timedelta(seconds=4)


def test_staff_give_each_key_of_a_job_type_a_rate_in_the_admin(staff, per_tenant_rate):
    client = staff("view_ratelimit", "add_ratelimit", "change_ratelimit")
    limit = RateLimit.objects.get(scope="key")

    changed = client.post(
        reverse("admin:django_pgqueue_ratelimit_change", args=[limit.pk]), {"override": "9/m"}
    )
    page = client.get(reverse(CHANGELIST)).content.decode()

    assert changed.status_code == 302
    assert [(s.scope, s.name, s.rate) for s in rate_limit_states()] == [
        ("key", TENANT_RATE, Rate(9, 60))
    ]
    assert ">Each key of a job type</a>" in page


def test_a_worker_whose_rate_limits_are_gone_waits_its_poll_not_a_past_room_time():
    worker = Worker(concurrency=2, poll_interval=5)
    worker.pacing.room_in(0.0, time.monotonic() - 10)  # from a claim while a limit existed

    worker.pacing.limited = True
    assert worker._wait_timeout() == 0.0  # room came: claim at once
    worker.pacing.limited = False  # the heartbeat saw the last rate limit go
    assert worker._wait_timeout() == 5
