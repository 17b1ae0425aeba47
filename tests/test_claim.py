"""The SQL functions workers rely on: claim_job_batch() and recover_stale_jobs().

They are called here exactly as a worker calls them, through a database cursor.
"""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import DataError, connection, connections, transaction

from django_pgqueue.models import ConcurrencyLimit, Job
from tests.plans import plan_nodes, statement_plans

pytestmark = pytest.mark.django_db


def claim(
    worker_id: str | None = "worker-1",
    *,
    job_types: list[str] | None = None,
    batch_size: int | None = 10,
    queues: list[str] | None = None,
) -> list[Job]:
    """Call ``claim_job_batch`` on this thread's connection and return the claimed jobs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT * FROM claim_job_batch(%s, %s, %s, %s)",
            [worker_id, job_types, batch_size, queues],
        )
        columns = [column.name for column in cursor.description]
        return [Job.from_row(columns, row, connection.alias) for row in cursor.fetchall()]


def recover(stale_after: timedelta) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM recover_stale_jobs(%s)", [stale_after])
        return cursor.fetchall()


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def ids(jobs: list[Job]) -> set[Any]:
    return {job.id for job in jobs}


# -- What is claimed, and in which order ------------------------------------------------


def test_claims_highest_priority_first_then_oldest_first_among_jobs_due_together(make_job):
    start = db_now() - timedelta(hours=1)
    due = start + timedelta(minutes=5)
    backfill = make_job(priority=30, created_at=start, run_at=due)
    user_newer = make_job(priority=150, created_at=start + timedelta(minutes=2), run_at=due)
    system = make_job(priority=100, created_at=start, run_at=due)
    user_older = make_job(priority=150, created_at=start + timedelta(minutes=1), run_at=due)

    order = [claim(batch_size=1)[0].id for _ in range(4)]

    assert order == [user_older.id, user_newer.id, system.id, backfill.id]


def test_among_equal_priorities_the_job_due_earliest_is_claimed_first(make_job):
    nine = db_now() - timedelta(hours=2)
    delayed_to_ten = make_job(created_at=nine, run_at=nine + timedelta(hours=1))
    enqueued_at_half_past_nine = make_job(
        created_at=nine + timedelta(minutes=30), run_at=nine + timedelta(minutes=30)
    )

    order = [claim(batch_size=1)[0].id for _ in range(2)]

    assert order == [enqueued_at_half_past_nine.id, delayed_to_ten.id]


def test_a_higher_priority_goes_first_however_late_it_was_due(make_job):
    start = db_now() - timedelta(hours=2)
    early = make_job(priority=100, run_at=start)
    urgent_late = make_job(priority=150, run_at=start + timedelta(hours=1))

    order = [claim(batch_size=1)[0].id for _ in range(2)]

    assert order == [urgent_late.id, early.id]


def test_batch_takes_the_first_jobs_in_claim_order(make_job):
    start = db_now() - timedelta(hours=1)
    jobs = [make_job(priority=100, created_at=start + timedelta(seconds=i)) for i in range(5)]
    urgent = make_job(priority=900, created_at=start + timedelta(seconds=10))

    assert ids(claim(batch_size=3)) == {urgent.id, jobs[0].id, jobs[1].id}
    assert ids(claim(batch_size=10)) == {job.id for job in jobs[2:]}
    assert claim() == []


def test_job_is_not_claimed_before_its_run_at(make_job):
    later = make_job(run_at=db_now() + timedelta(seconds=30))
    due = make_job(run_at=db_now() - timedelta(seconds=1), priority=1)

    assert ids(claim()) == {due.id}
    assert Job.objects.get(pk=later.pk).status == "pending"


def test_job_due_exactly_now_is_claimed(make_job):
    due = make_job(run_at=db_now())

    assert ids(claim()) == {due.id}


@pytest.mark.parametrize("status", ["claimed", "running", "completed", "failed", "cancelled"])
def test_only_pending_jobs_are_claimed(make_job, status):
    make_job(status=status, worker_id="worker-0" if status in ("claimed", "running") else None)

    assert claim() == []


@pytest.fixture
def mixed_jobs(make_job):
    """One due job per (queue, job_type) pair, keyed by that pair."""
    return {
        (queue, job_type): make_job(queue=queue, job_type=job_type).id
        for queue in ("default", "emails", "reports")
        for job_type in ("tests.noop", "tests.record", "tests.fail")
    }


@pytest.mark.parametrize(
    ("queues", "job_types"),
    [
        (None, None),
        (["emails"], None),
        (["emails", "reports"], None),
        (None, ["tests.record"]),
        (None, ["tests.noop", "tests.fail"]),
        (["reports"], ["tests.fail"]),
    ],
)
def test_claim_filters_on_queues_and_job_types_with_null_meaning_any(mixed_jobs, queues, job_types):
    expected = {
        job_id
        for (queue, job_type), job_id in mixed_jobs.items()
        if (queues is None or queue in queues) and (job_types is None or job_type in job_types)
    }

    assert ids(claim(queues=queues, job_types=job_types, batch_size=100)) == expected


def claim_skipping(job_types, skip_job_types):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM claim_job_batch('w', %s, 100, NULL, true, NULL, NULL, %s)",
            [job_types, skip_job_types],
        )
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.parametrize("limited", [False, True], ids=["no-limit", "with-a-limit"])
@pytest.mark.parametrize(
    ("job_types", "skip_job_types"),
    [
        (None, ["tests.record"]),
        (None, ["tests.record", "tests.fail"]),
        (["tests.noop", "tests.record"], ["tests.record"]),
        (None, []),
    ],
)
def test_claim_leaves_the_job_types_it_is_told_to_skip(
    mixed_jobs, limited, job_types, skip_job_types
):
    if limited:  # the claim's other path, taken while any limit exists
        ConcurrencyLimit.objects.create(scope="queue", name="elsewhere", declared=1)
    expected = {
        job_id
        for (_, job_type), job_id in mixed_jobs.items()
        if (job_types is None or job_type in job_types) and job_type not in skip_job_types
    }

    assert claim_skipping(job_types, skip_job_types) == expected


def test_empty_filter_lists_match_nothing(mixed_jobs):
    assert claim(queues=[]) == []
    assert claim(job_types=[]) == []


def test_claim_marks_jobs_claimed_by_the_worker_and_counts_the_attempt(make_job):
    fresh = make_job()
    retried = make_job(attempts=2, last_error="boom")

    claimed = {job.id: job for job in claim("host-1:123:abc")}

    now = db_now()
    for job, attempts in ((fresh, 1), (retried, 3)):
        for row in (claimed[job.id], Job.objects.get(pk=job.pk)):
            assert row.status == "claimed"
            assert row.worker_id == "host-1:123:abc"
            assert row.claimed_at == now
            assert row.heartbeat_at == now
            assert row.attempts == attempts


def test_claimed_rows_carry_the_whole_job(make_job):
    made = make_job(data={"user": 7}, queue="emails", priority=321, max_attempts=9)

    (claimed,) = claim()

    assert (claimed.data, claimed.queue, claimed.priority, claimed.max_attempts) == (
        {"user": 7},
        "emails",
        321,
        9,
    )
    assert claimed.created_at == made.created_at


@pytest.mark.parametrize("batch_size", [0, -1, 10001, None])
def test_invalid_batch_size_is_a_clear_database_error(make_job, batch_size):
    make_job()

    with (
        pytest.raises(DataError, match="p_batch_size must be between 1 and 10000"),
        transaction.atomic(),
    ):
        claim(batch_size=batch_size)
    assert Job.objects.get().status == "pending"


@pytest.mark.parametrize("worker_id", ["", None])
def test_missing_worker_id_is_a_clear_database_error(make_job, worker_id):
    make_job()

    with (
        pytest.raises(DataError, match="p_worker_id must be a non-empty string"),
        transaction.atomic(),
    ):
        claim(worker_id)
    assert Job.objects.get().status == "pending"


# -- Concurrency ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_share_a_job_and_together_claim_all():
    total, claimers = 4000, 6
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_jobs (job_type, queue, priority) "
            "SELECT 'tests.noop', (ARRAY['default', 'emails'])[1 + i %% 2], "
            "       (ARRAY[30, 100, 150])[1 + i %% 3] "
            "  FROM generate_series(1, %s) AS i",
            [total],
        )
    start = threading.Barrier(claimers)

    def run_claimer(number: int) -> list[Any]:
        worker_id = f"claimer-{number}"
        rng = random.Random(number)
        claimed: list[Any] = []
        try:
            start.wait(timeout=10)
            while True:
                # A separate transaction per round, sometimes held open a little so that
                # other claimers meet locked rows and must skip them.
                with transaction.atomic():
                    batch = claim(worker_id, batch_size=rng.randint(1, 25))
                    if rng.random() < 0.3:
                        time.sleep(0.002)
                if not batch:
                    return claimed
                claimed.extend(job.id for job in batch)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(claimers) as pool:
        per_claimer = list(pool.map(run_claimer, range(claimers)))

    everything = [job_id for claimed in per_claimer for job_id in claimed]
    assert len(everything) == len(set(everything)) == total
    assert set(everything) == set(Job.objects.values_list("id", flat=True))
    assert all(per_claimer), "every claimer should have claimed some jobs"
    owners = dict(Job.objects.values_list("id", "worker_id"))
    for number, claimed in enumerate(per_claimer):
        assert {owners[job_id] for job_id in claimed} == {f"claimer-{number}"}
    assert set(Job.objects.values_list("status", "attempts").distinct()) == {("claimed", 1)}


# -- The claim uses its index -----------------------------------------------------------


def claim_plans(**claim_arguments: Any) -> list[dict[str, Any]]:
    """Run a real claim and return the plan of its walk (tests/plans.py)."""
    plans = statement_plans(
        lambda: claim(**claim_arguments) or pytest.fail("the claim should have found due jobs")
    )
    return [plan for plan in plans if "SKIP LOCKED" in plan["Query Text"]]


def test_claim_uses_the_claimable_index_and_never_scans_the_table():
    with connection.cursor() as cursor:
        # A table that has run for a while: mostly finished rows, some pending work.
        cursor.execute(
            """
            INSERT INTO pgqueue_jobs (job_type, status, created_at, completed_at, attempts)
            SELECT 'tests.noop', (ARRAY['completed', 'failed', 'cancelled'])[1 + i % 3],
                   now() - i * interval '1 second', now(), 1
              FROM generate_series(1, 200000) AS i
            """
        )
        cursor.execute(
            """
            INSERT INTO pgqueue_jobs (job_type, queue, priority, created_at, run_at)
            SELECT (ARRAY['tests.noop', 'tests.record', 'tests.fail'])[1 + i % 3],
                   (ARRAY['default', 'emails', 'reports', 'bulk'])[1 + i % 4],
                   (ARRAY[30, 100, 150])[1 + i % 3],
                   now() - i * interval '1 second',
                   now() + CASE WHEN i % 10 = 0 THEN interval '1 hour'
                                ELSE -interval '1 second' END
              FROM generate_series(1, 20000) AS i
            """
        )
        cursor.execute("ANALYZE pgqueue_jobs")

    for arguments in [
        {},
        {"queues": ["emails"]},
        {"job_types": ["tests.record"]},
        {"queues": ["reports", "bulk"], "job_types": ["tests.fail", "tests.noop"]},
    ]:
        (plan,) = claim_plans(batch_size=50, **arguments)
        nodes = plan_nodes(plan["Plan"])
        node_types = [node["Node Type"] for node in nodes]
        assert "Seq Scan" not in node_types, (arguments, node_types)
        assert any(node.get("Index Name") == "idx_jobs_claimable" for node in nodes), (
            arguments,
            json.dumps(plan["Plan"], indent=1),
        )


def test_a_claim_planned_on_an_empty_table_still_reads_only_the_rows_it_claims():
    # A worker's first claims often find the queue empty, and the unfiltered claim's
    # plan is cached for the session (claim version 11). Planned on an empty table, the
    # update read the whole table for the rows the walk had found (Seq Scan, ctid =
    # ANY): every later claim of that worker did, 3 to 4x slower (bench/steady.py).
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_jobs")  # an empty queue, analysed
    assert claim() == []
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_jobs (job_type, run_at) "
            "SELECT 'tests.noop', now() FROM generate_series(1, 5000)"
        )

    (plan,) = claim_plans(batch_size=50)

    reads = [
        (node["Node Type"], node.get("Relation Name"))
        for node in plan_nodes(plan["Plan"])
        if node.get("Relation Name") == "pgqueue_jobs"
    ]
    assert ("Seq Scan", "pgqueue_jobs") not in reads, json.dumps(plan["Plan"], indent=1)
    assert ("Tid Scan", "pgqueue_jobs") in reads, reads


# -- recover_stale_jobs -----------------------------------------------------------------


@pytest.fixture
def long_ago():
    return db_now() - timedelta(minutes=10)


def test_stale_claimed_job_returns_to_pending_with_its_attempt_given_back(make_job, long_ago):
    stale = make_job(
        status="claimed", worker_id="w-dead", attempts=2, claimed_at=long_ago, heartbeat_at=long_ago
    )

    rows = recover(timedelta(minutes=1))

    assert rows == [(stale.id, "tests.noop", "w-dead", "pending", 1)]
    stale.refresh_from_db()
    assert (stale.status, stale.attempts, stale.worker_id) == ("pending", 1, None)
    assert stale.run_at == db_now()
    assert "w-dead" in stale.last_error
    assert ids(claim()) == {stale.id}


def test_stale_running_job_returns_to_pending_keeping_its_attempt(make_job, long_ago):
    stale = make_job(
        status="running",
        worker_id="w-dead",
        attempts=1,
        max_attempts=3,
        claimed_at=long_ago,
        started_at=long_ago,
        heartbeat_at=long_ago,
    )

    assert recover(timedelta(minutes=1)) == [(stale.id, "tests.noop", "w-dead", "pending", 1)]
    stale.refresh_from_db()
    assert (stale.status, stale.attempts, stale.worker_id) == ("pending", 1, None)
    assert stale.completed_at is None


def test_recovered_running_jobs_are_due_after_a_spread_delay_of_up_to_2_to_the_attempts(
    make_job, long_ago
):
    # The jobs of a dead worker, recovered together and due together, were claimed
    # together again: a job that kills its worker took the same batch-mates with it on
    # every attempt (tests/faults/test_poison_job.py). A claimed job ran no code: due at
    # once (the first test above).
    def lost(attempts):
        return make_job(
            status="running",
            worker_id="w-dead",
            attempts=attempts,
            max_attempts=20,
            claimed_at=long_ago,
            heartbeat_at=long_ago,
        )

    second_attempts = [lost(2) for _ in range(20)]
    twelfth_attempt = lost(12)

    recover(timedelta(minutes=1))

    now = db_now()
    delays = [(Job.objects.get(pk=j.pk).run_at - now).total_seconds() for j in second_attempts]
    assert all(0 <= delay <= 4 for delay in delays), delays  # 2^2 seconds
    assert len({round(delay, 3) for delay in delays}) > 10  # spread, not one moment
    assert 0 <= (Job.objects.get(pk=twelfth_attempt.pk).run_at - now).total_seconds() <= 60


def test_stale_running_job_with_no_attempts_left_fails_naming_the_worker(make_job, long_ago):
    stale = make_job(
        status="running",
        worker_id="host-9:42:dead",
        attempts=3,
        max_attempts=3,
        claimed_at=long_ago,
        started_at=long_ago,
        heartbeat_at=long_ago,
    )

    assert recover(timedelta(minutes=1)) == [
        (stale.id, "tests.noop", "host-9:42:dead", "failed", 3)
    ]
    stale.refresh_from_db()
    assert (stale.status, stale.attempts) == ("failed", 3)
    assert stale.completed_at == db_now()
    assert "host-9:42:dead" in stale.last_error
    assert "stopped heartbeating" in stale.last_error
    assert claim() == []


def test_stale_claimed_job_with_no_attempts_left_is_given_its_attempt_back(make_job, long_ago):
    # It was claimed but never started, so the attempt was not really made.
    stale = make_job(
        status="claimed",
        worker_id="w",
        attempts=3,
        max_attempts=3,
        claimed_at=long_ago,
        heartbeat_at=long_ago,
    )

    recover(timedelta(minutes=1))

    stale.refresh_from_db()
    assert (stale.status, stale.attempts) == ("pending", 2)


def test_job_never_heartbeated_is_judged_by_its_claim_time(make_job, long_ago):
    stale = make_job(status="claimed", worker_id="w", attempts=1, claimed_at=long_ago)

    assert [row[0] for row in recover(timedelta(minutes=1))] == [stale.id]


def test_jobs_with_a_fresh_heartbeat_are_left_alone(make_job, long_ago):
    now = db_now()
    claimed = make_job(
        status="claimed",
        worker_id="w",
        attempts=1,
        claimed_at=long_ago,
        heartbeat_at=now - timedelta(seconds=5),
    )
    running = make_job(
        status="running",
        worker_id="w",
        attempts=3,
        max_attempts=3,
        claimed_at=long_ago,
        heartbeat_at=now,
    )
    before = {job.id: job for job in (claimed, running)}

    assert recover(timedelta(minutes=1)) == []
    for job in Job.objects.all():
        assert (job.status, job.attempts, job.worker_id) == (
            before[job.id].status,
            before[job.id].attempts,
            "w",
        )


@pytest.mark.parametrize("status", ["pending", "completed", "failed", "cancelled"])
def test_jobs_not_held_by_a_worker_are_never_recovered(make_job, long_ago, status):
    make_job(status=status, created_at=long_ago, heartbeat_at=long_ago, claimed_at=long_ago)

    assert recover(timedelta(minutes=1)) == []


# -- Jobs lost with their worker: at most one per worker --------------------------------


def test_recovery_marks_the_running_jobs_it_takes_back_as_lost_with_their_worker(
    make_job, long_ago
):
    def stale(status):
        return make_job(
            status=status, worker_id="w-dead", attempts=1, claimed_at=long_ago,
            heartbeat_at=long_ago,
        )  # fmt: skip

    running, claimed = stale("running"), stale("claimed")

    recover(timedelta(minutes=1))

    running.refresh_from_db()
    claimed.refresh_from_db()
    assert running.lost_with_worker is True
    assert claimed.lost_with_worker is False  # it ran no code
    assert make_job().lost_with_worker is False


# The claim's three paths: a worker that filters nothing (its plan cached for the
# session), one that names its queues (planned for them), and any claim while a limit
# exists.
CLAIM_PATHS = pytest.mark.parametrize(
    ("limited", "queues"),
    [(False, None), (False, ["default"]), (True, None)],
    ids=["no-filter", "a-queue-filter", "with-a-limit"],
)


@CLAIM_PATHS
def test_a_worker_holds_at_most_one_job_lost_with_its_worker(make_job, limited, queues):
    # A job that kills its worker kills those beside it: two lost jobs in one worker
    # could be a poison job and one that died with it before (test_poison_job.py).
    if limited:
        ConcurrencyLimit.objects.create(scope="queue", name="elsewhere", declared=1)
    earlier = db_now() - timedelta(minutes=1)
    lost = {make_job(lost_with_worker=True, run_at=earlier).id for _ in range(3)}
    fresh = {make_job().id for _ in range(3)}

    first = ids(claim("w-1", queues=queues))
    assert first >= fresh
    assert len(first & lost) == 1  # one of them, though they come first in claim order
    assert first <= fresh | lost

    assert ids(claim("w-1", queues=queues)) == set()  # it holds one: the others are left
    second = ids(claim("w-2", queues=queues))
    assert len(second) == 1 and second < lost - first

    # Once its lost job finishes, the worker may take another.
    Job.objects.filter(pk__in=first & lost).update(status="completed")
    assert ids(claim("w-1", queues=queues)) == lost - first - second


@CLAIM_PATHS
def test_jobs_lost_with_their_worker_do_not_stop_a_claim_from_filling_its_batch(
    make_job, limited, queues
):
    # The walk's first rows are lost jobs the worker may not take: the rest is claimed.
    if limited:
        ConcurrencyLimit.objects.create(scope="queue", name="elsewhere", declared=1)
    make_job(status="running", worker_id="w-1", lost_with_worker=True)
    earlier = db_now() - timedelta(minutes=1)
    for _ in range(3):
        make_job(lost_with_worker=True, run_at=earlier)
    fresh = {make_job().id for _ in range(3)}

    assert ids(claim("w-1", queues=queues)) == fresh
