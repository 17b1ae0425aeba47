"""``django_pgqueue.stats``: what the queues and workers are doing, read from the jobs."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_pgqueue import conf, stats
from django_pgqueue.models import ConcurrencyLimit, QueueState, WorkerRecord
from django_pgqueue.worker import queries

pytestmark = pytest.mark.django_db


def by_name(snapshot):
    return {queue.name: queue for queue in snapshot.queues}


def test_counts_jobs_of_each_queue_by_state(make_job):
    now = timezone.now()
    for _ in range(3):
        make_job(queue="emails")
    make_job(queue="emails", run_at=now + timedelta(hours=1))
    make_job(queue="emails", status="claimed", worker_id="w-1")
    make_job(queue="emails", status="running", worker_id="w-1", started_at=now)
    make_job(queue="emails", status="running", worker_id="w-2", started_at=now)
    make_job(queue="reports", status="completed", started_at=now, completed_at=now)
    make_job(queue="reports", status="failed", started_at=now, completed_at=now)
    make_job(queue="reports", status="cancelled", completed_at=now)

    queues = by_name(stats.snapshot())

    emails = queues["emails"]
    assert (emails.pending, emails.scheduled, emails.claimed, emails.running) == (3, 1, 1, 2)
    assert emails.completed_last_minute == emails.failed_last_minute == 0
    reports = queues["reports"]
    assert (reports.pending, reports.claimed, reports.running) == (0, 0, 0)
    assert reports.completed_last_minute == 1
    assert reports.failed_last_minute == 1
    assert reports.cancelled_last_minute == 1


def test_jobs_finished_more_than_a_minute_ago_are_not_counted(make_job):
    long_ago = timezone.now() - timedelta(hours=2)
    make_job(queue="old", status="completed", started_at=long_ago, completed_at=long_ago)
    make_job(queue="mixed", status="completed", started_at=long_ago, completed_at=long_ago)
    make_job(queue="mixed", status="completed", completed_at=timezone.now())

    queues = by_name(stats.snapshot())

    assert "old" not in queues  # nothing pending, in flight or recent: no row at all
    assert queues["mixed"].completed_last_minute == 1


def test_failed_total_counts_every_failed_job_only_when_asked(make_job):
    long_ago = timezone.now() - timedelta(days=3)
    make_job(queue="emails", status="failed", completed_at=long_ago)
    make_job(queue="emails", status="failed", completed_at=timezone.now())
    make_job(queue="reports")

    assert by_name(stats.snapshot())["emails"].failed is None
    queues = by_name(stats.snapshot(totals=True))
    assert queues["emails"].failed == 2
    assert queues["emails"].failed_last_minute == 1
    assert queues["reports"].failed == 0


def test_oldest_pending_age_is_the_wait_of_the_oldest_due_job(make_job):
    now = timezone.now()
    make_job(queue="emails", run_at=now - timedelta(minutes=5))
    make_job(queue="emails", run_at=now - timedelta(minutes=1))
    make_job(queue="emails", run_at=now + timedelta(days=1))
    make_job(queue="later", run_at=now + timedelta(days=1))

    queues = by_name(stats.snapshot())

    assert 300 <= queues["emails"].oldest_pending_age_seconds < 330
    assert queues["later"].oldest_pending_age_seconds is None
    assert queues["later"].scheduled == 1


def test_wait_quantiles_cover_jobs_started_in_the_last_minute(make_job):
    now = timezone.now()
    started = now - timedelta(seconds=10)
    for wait in (1, 2, 3, 4):
        make_job(
            queue="emails",
            status="completed",
            run_at=started - timedelta(seconds=wait),
            started_at=started,
            completed_at=now,
        )
    make_job(
        queue="emails",
        status="running",
        worker_id="w-1",
        run_at=started - timedelta(seconds=10),
        started_at=started,
    )
    # Started two minutes ago (finished just now): outside the window.
    make_job(
        queue="emails",
        status="completed",
        run_at=now - timedelta(minutes=10),
        started_at=now - timedelta(minutes=2),
        completed_at=now,
    )

    emails = by_name(stats.snapshot())["emails"]

    assert emails.started_last_minute == 5
    assert emails.wait_p50_seconds == pytest.approx(3.0)
    assert emails.wait_p95_seconds == pytest.approx(8.8)  # between 4 and 10


def test_queue_without_recent_starts_has_no_wait(make_job):
    make_job(queue="emails")
    emails = by_name(stats.snapshot())["emails"]
    assert emails.started_last_minute == 0
    assert emails.wait_p50_seconds is None
    assert emails.wait_p95_seconds is None


def test_paused_queues_and_queue_limits_are_shown_even_without_jobs(make_job):
    QueueState.objects.create(name="emails", paused_at=timezone.now())
    QueueState.objects.create(name="resumed", paused_at=None)
    ConcurrencyLimit.objects.create(scope="queue", name="reports", declared=2)
    ConcurrencyLimit.objects.create(scope="job_type", name="tests.noop", declared=1)
    make_job(queue="default")

    queues = by_name(stats.snapshot())

    assert queues["emails"].paused is True
    assert queues["emails"].max_running is None
    assert queues["reports"].paused is False
    assert queues["reports"].max_running == 2
    assert queues["default"].max_running is None  # a job type's limit is not a queue's
    assert "resumed" not in queues
    assert "tests.noop" not in queues


def test_workers_with_their_state_and_the_jobs_they_hold(make_job):
    now = timezone.now()
    common = {"hostname": "host-a", "pid": 10, "concurrency": 4}
    WorkerRecord.objects.create(worker_id="alive", queues=["emails", "reports"], **common)
    WorkerRecord.objects.create(
        worker_id="silent", heartbeat_at=now - timedelta(minutes=10), **common
    )
    WorkerRecord.objects.create(
        worker_id="gone", queues=["archive"], stopped_at=now, heartbeat_at=now, **common
    )
    make_job(status="running", worker_id="alive", started_at=now)
    make_job(status="claimed", worker_id="alive")
    make_job(status="running", worker_id="silent", started_at=now)

    snapshot = stats.snapshot()

    workers = {worker.worker_id: worker for worker in snapshot.workers}
    assert [worker.worker_id for worker in snapshot.workers] == ["alive", "silent", "gone"]
    assert workers["alive"].state == "alive" and workers["alive"].alive
    assert workers["alive"].running == 2
    assert workers["alive"].queues == ["emails", "reports"]
    assert workers["silent"].state == "not responding" and not workers["silent"].alive
    assert workers["silent"].running == 1
    assert workers["gone"].state == "stopped"
    # Queues a live worker serves by name appear; a stopped worker's do not.
    queues = by_name(snapshot)
    assert queues["reports"].pending == 0
    assert "archive" not in queues


def beat_says_it_leads(worker_id: str) -> bool:
    """What the worker's own heartbeat statement answers: whether it leads."""
    with connection.cursor() as cursor:
        cursor.execute(
            queries.WORKER_BEAT,
            {"worker": worker_id, "stale_after": conf.get_settings().STALE_AFTER},
        )
        return bool(cursor.fetchone()[0])


def test_the_snapshot_names_the_worker_that_its_heartbeat_says_leads():
    # The live worker with the lowest id leads; the snapshot and the beat read one rule
    # (liveness.py). "a-stopped" and "b-silent" have lower ids but are not live.
    now = timezone.now()
    common = {"hostname": "h", "pid": 1, "concurrency": 1}
    WorkerRecord.objects.create(worker_id="a-stopped", stopped_at=now, **common)
    stale = now - timedelta(seconds=conf.get_settings().STALE_AFTER + 5)
    WorkerRecord.objects.create(worker_id="b-silent", heartbeat_at=stale, **common)
    WorkerRecord.objects.create(worker_id="c-live", **common)
    WorkerRecord.objects.create(worker_id="d-live", **common)

    workers = {worker.worker_id: worker for worker in stats.snapshot().workers}

    assert {name: (w.state, w.leads) for name, w in workers.items()} == {
        "a-stopped": ("stopped", False),
        "b-silent": ("not responding", False),
        "c-live": ("alive", True),
        "d-live": ("alive", False),
    }
    assert stats.worker("c-live")[0].leads and not stats.worker("d-live")[0].leads
    assert beat_says_it_leads("d-live") is False
    assert beat_says_it_leads("c-live") is True
    # Once "c-live" stops, "d-live" leads, in both readings.
    WorkerRecord.objects.filter(worker_id="c-live").update(stopped_at=now)
    assert [w.worker_id for w in stats.snapshot().workers if w.leads] == ["d-live"]
    assert beat_says_it_leads("d-live") is True


def test_snapshot_as_dict_is_plain_json_data(make_job):
    import json

    make_job(queue="emails")
    WorkerRecord.objects.create(worker_id="w", hostname="h", pid=1, concurrency=1)

    data = json.loads(json.dumps(stats.snapshot().as_dict()))

    assert data["window_seconds"] == 60
    assert data["queues"][0]["name"] == "emails"
    assert data["queues"][0]["pending"] == 1
    assert data["workers"][0]["worker_id"] == "w"
    assert data["workers"][0]["alive"] is True
    assert isinstance(data["workers"][0]["heartbeat_at"], str)


@pytest.mark.parametrize(
    ("query", "indexes"),
    [
        ("_PENDING", ["idx_jobs_claimable", "idx_jobs_keyed"]),
        ("_IN_FLIGHT", ["idx_jobs_worker"]),
        ("_FINISHED_RECENTLY", ["idx_jobs_finished"]),
        ("_WAITS", ["idx_jobs_finished", "idx_jobs_worker"]),
    ],
)
def test_every_query_can_be_served_by_a_partial_index(query, indexes):
    # With sequential scans priced out, a plan still without the index would mean the
    # query's WHERE does not match the partial index: a full scan on a big table.
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        sql = getattr(stats, query) % {"window": stats.WINDOW_SECONDS}
        cursor.execute("EXPLAIN " + sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    for index in indexes:
        assert index in plan, plan
    assert "Seq Scan" not in plan, plan


def test_claimable_jobs_are_counted_from_their_index_alone():
    # Read from the rows, a backlog of 100,000 pending jobs among 2,000,000 cost more
    # than reading the whole table, which the planner then chose (the overview took
    # 0.6 s, bench/admin_speed.py).
    with connection.cursor() as cursor:
        # Only index paths left: an index-only scan whenever the query allows one.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("EXPLAIN " + stats._PENDING)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Only Scan using idx_jobs_claimable" in plan, plan


def test_ages_are_measured_at_the_snapshot_not_at_the_start_of_the_transaction(make_job):
    # A test is one transaction, like an admin request with ATOMIC_REQUESTS: its now()
    # stays at its start, which would make every age look younger than it is.
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (started,) = cursor.fetchone()
    time.sleep(0.5)
    now = timezone.now()
    make_job(queue="emails", run_at=now - timedelta(minutes=5))
    WorkerRecord.objects.create(worker_id="w", hostname="h", pid=1, concurrency=1, heartbeat_at=now)

    snapshot = stats.snapshot()

    assert snapshot.taken_at >= now > started + timedelta(seconds=0.4)
    assert by_name(snapshot)["emails"].oldest_pending_age_seconds >= 300
    assert snapshot.workers[0].heartbeat_at <= snapshot.taken_at
