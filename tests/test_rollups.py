"""Per-minute rollups: written once a minute by one worker, counted from the finished
jobs, read back as the charts' series, pruned after ``ROLLUP_RETENTION``."""

from __future__ import annotations

import json
import multiprocessing
from datetime import datetime, timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_pgqueue import enqueue
from django_pgqueue.exceptions import InvalidArgumentError
from django_pgqueue.rollups import (
    BUCKETS,
    _roll_hours,
    bucket_bounds,
    percentile,
    recount,
    rolled_up_names,
    series,
    write_rollups,
)
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db


def database_minute():
    with connection.cursor() as cursor:
        cursor.execute("SELECT date_trunc('minute', statement_timestamp())")
        return cursor.fetchone()[0]


def finished(status, *, completed_ago, waited, ran, queue="default", job_type="tests.noop"):
    """A job that finished ``completed_ago`` before this minute began, after waiting
    ``waited`` and running ``ran`` (timedeltas)."""
    job = enqueue(job_type, queue=queue)
    completed = database_minute() - completed_ago
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_jobs SET status = %s, completed_at = %s, started_at = %s,"
            " run_at = %s WHERE id = %s",
            [status, completed, completed - ran, completed - ran - waited, job.id],
        )
    return job


def rolled():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT minute, queue, job_type, completed, failed, cancelled, wait_ms, run_ms"
            " FROM pgqueue_minute_jobs ORDER BY minute, queue, job_type"
        )
        return cursor.fetchall()


# Histograms ----------------------------------------------------------------------------


def test_buckets_cover_every_duration_in_steps_of_the_square_root_of_two():
    assert bucket_bounds(0) == (0.0, 0.001)
    low, high = bucket_bounds(21)
    assert high / low == pytest.approx(2**0.5)
    assert bucket_bounds(BUCKETS - 1)[1] == float("inf")
    for k in range(1, BUCKETS - 1):
        assert bucket_bounds(k)[0] == pytest.approx(bucket_bounds(k - 1)[1])


def test_a_percentile_is_its_buckets_geometric_middle_within_a_fifth():
    histogram = [0] * 20 + [90, 0, 0, 0, 10]  # 90 jobs near 1 s, 10 near 4 s

    assert percentile(histogram, 0.5) == pytest.approx(1.0, rel=0.2)
    assert percentile(histogram, 0.95) == pytest.approx(4.0, rel=0.2)
    assert percentile([], 0.5) is None
    assert percentile([0, 0], 0.5) is None


# Writing -------------------------------------------------------------------------------


def test_a_pass_counts_the_jobs_finished_in_the_minutes_that_ended():
    minute = database_minute()
    finished(
        "completed",
        completed_ago=timedelta(seconds=30),
        waited=timedelta(0),
        ran=timedelta(seconds=1),
    )
    finished(
        "completed",
        completed_ago=timedelta(seconds=20),
        waited=timedelta(seconds=4),
        ran=timedelta(seconds=1),
    )
    finished("failed", completed_ago=timedelta(seconds=90), waited=timedelta(0), ran=timedelta(0))
    finished(
        "cancelled",
        completed_ago=timedelta(seconds=10),
        waited=timedelta(0),
        ran=timedelta(0),
        queue="other",
    )
    finished("completed", completed_ago=timedelta(minutes=5), waited=timedelta(0), ran=timedelta(0))
    enqueue("tests.noop")  # pending: in the depth, not the counts

    assert write_rollups() is True

    rows = {(row[0], row[1], row[2]): row[3:] for row in rolled()}
    last, before = minute - timedelta(minutes=1), minute - timedelta(minutes=2)
    assert set(rows) == {
        (last, "default", "tests.noop"),
        (before, "default", "tests.noop"),
        (last, "other", "tests.noop"),
    }
    completed, failed, cancelled, wait, run = rows[(last, "default", "tests.noop")]
    assert (completed, failed, cancelled) == (2, 0, 0)
    assert sum(wait) == 2 and percentile(wait, 0.99) == pytest.approx(4.0, rel=0.2)
    assert run[20] == 2 and len(run) == 21  # 1 s is bucket 20; trailing zeros trimmed
    assert rows[(before, "default", "tests.noop")][:3] == (0, 1, 0)
    assert rows[(last, "other", "tests.noop")][:3] == (0, 0, 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT minute, depths FROM pgqueue_minutes")
        ((sampled, depths),) = cursor.fetchall()
    assert sampled == minute
    assert json.loads(depths)["default"]["pending"] == 1


def test_a_minute_is_written_once_however_many_passes():
    assert write_rollups() is True
    assert write_rollups() is False


def test_the_minute_before_is_counted_again_with_jobs_that_committed_late():
    finished(
        "completed", completed_ago=timedelta(seconds=70), waited=timedelta(0), ran=timedelta(0)
    )
    write_rollups()
    # A job whose finishing transaction committed after that pass, and the next pass.
    finished(
        "completed", completed_ago=timedelta(seconds=80), waited=timedelta(0), ran=timedelta(0)
    )
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgqueue_minutes")

    write_rollups()

    assert [row[3] for row in rolled()] == [2]


def test_rollups_older_than_their_retention_are_pruned(pgqueue_settings):
    pgqueue_settings(ROLLUP_RETENTION=3600)
    old = database_minute() - timedelta(hours=2)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO pgqueue_minutes (minute, depths) VALUES (%s, '{}')", [old])
        cursor.execute(
            "INSERT INTO pgqueue_minute_jobs (minute, queue, job_type, completed, failed,"
            " cancelled, wait_ms, run_ms) VALUES (%s, 'q', 't', 1, 0, 0, '{}', '{}')",
            [old],
        )

    write_rollups()

    assert rolled() == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgqueue_minutes WHERE minute = %s", [old])
        assert cursor.fetchone()[0] == 0


def _write(barrier, results):
    try:
        barrier.wait(timeout=30)
        results.put(write_rollups())
    finally:
        connections.close_all()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.django_db(transaction=True)
def test_of_four_racing_processes_one_writes_the_minute():
    finished(
        "completed", completed_ago=timedelta(seconds=30), waited=timedelta(0), ran=timedelta(0)
    )
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(4), context.Queue()
    connections.close_all()
    processes = [context.Process(target=_write, args=(barrier, results)) for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)

    assert [process.exitcode for process in processes] == [0, 0, 0, 0]
    assert sorted(results.get(timeout=5) for _ in range(4)) == [False, False, False, True]
    assert [row[3] for row in rolled()] == [1]


@pytest.mark.django_db(transaction=True)
def test_a_running_worker_writes_the_rollups():
    with worker_thread(concurrency=1, poll_interval=0.2):
        enqueue("tests.noop")
        wait_for(lambda: series("hour").pending[-1] is not None, timeout=20)


# Reading -------------------------------------------------------------------------------


def insert_minute(at, depths, jobs=()):
    """The rollups of the minute ``at``: the depths sampled as it ended, its jobs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_minutes (minute, depths) VALUES (%s, %s)",
            [at + timedelta(minutes=1), json.dumps(depths)],
        )
        for queue, job_type, completed, failed, wait, run in jobs:
            cursor.execute(
                "INSERT INTO pgqueue_minute_jobs (minute, queue, job_type, completed, failed,"
                " cancelled, wait_ms, run_ms) VALUES (%s, %s, %s, %s, %s, 0, %s, %s)",
                [at, queue, job_type, completed, failed, wait, run],
            )


def test_series_bins_the_rollups_and_leaves_gaps_where_no_worker_ran():
    minute = database_minute()
    one_second = [0] * 20 + [3]
    insert_minute(
        minute - timedelta(minutes=3),
        {"default": {"pending": 5, "scheduled": 1, "running": 2, "waiting": 0}},
        [("default", "tests.noop", 3, 1, one_second, one_second)],
    )
    insert_minute(minute - timedelta(minutes=2), {})
    insert_minute(
        minute - timedelta(minutes=1),
        {"default": {"pending": 7, "scheduled": 0, "running": 1, "waiting": 0}},
        [("other", "tests.record", 4, 0, [4], [4])],
    )

    figures = series("hour")

    assert len(figures.times) == 60 and figures.times[-1] == minute - timedelta(minutes=1)
    assert figures.completed[-3:] == [3, 0, 4]
    assert figures.failed[-3:] == [1, 0, 0]
    assert figures.completed[-4] is None  # no worker then
    assert figures.pending[-3:] == [5, 0, 7]
    assert figures.wait[0.5][-3] == pytest.approx(1.0, rel=0.2)
    assert figures.wait[0.5][-2] is None
    assert figures.run[0.99][-1] == 0.0005  # bucket 0: up to 1 ms

    by_queue = series("hour", queue="other")
    assert by_queue.completed[-3:] == [0, 0, 4]
    assert by_queue.pending[-3:] == [0, 0, 0]
    by_type = series("hour", job_type="tests.noop")
    assert by_type.completed[-3:] == [3, 0, 0]
    assert set(by_type.pending) == {None}


def test_the_day_adds_up_minutes_and_the_week_adds_up_hours():
    minute = database_minute()
    for k in range(1, 5):
        insert_minute(
            minute - timedelta(minutes=k),
            {"default": {"pending": k, "scheduled": 0, "running": 0, "waiting": 0}},
            [("default", "tests.noop", 10, 0, [], [])],
        )
    hour = minute.replace(minute=0)
    with connection.cursor() as cursor:
        for ago in (0, 1, 30):
            cursor.execute(
                "INSERT INTO pgqueue_hour_jobs (hour, queue, job_type, completed, failed,"
                " cancelled, wait_ms, run_ms) VALUES (%s, 'default', 'tests.noop', 100, 2, 0,"
                " '{}', '{0,0,5}')",
                [hour - timedelta(hours=ago)],
            )

    day = series("day")
    week = series("week")

    assert (len(day.times), len(week.times)) == (96, 84)
    assert sum(v for v in day.completed if v) == 40
    assert max(v for v in day.pending if v) == 4
    assert week.times[-1] == hour - timedelta(hours=1)  # the last point ends with this hour
    assert week.completed[-1] == 200 and week.failed[-1] == 4
    assert week.completed[-16] == 100
    assert week.run[0.5][-1] == pytest.approx(0.001 * 2**0.75, rel=0.01)


def test_hours_are_the_sums_of_their_minutes():
    hour = database_minute().replace(minute=0) - timedelta(hours=3)
    insert_minute(hour + timedelta(minutes=5), {}, [("q", "t", 3, 1, [1, 2], [0, 0, 4])])
    insert_minute(hour + timedelta(minutes=59), {}, [("q", "t", 2, 0, [0, 1], [])])
    insert_minute(hour + timedelta(minutes=60), {}, [("q", "t", 7, 0, [], [])])

    with connection.cursor() as cursor:
        _roll_hours(cursor, hour + timedelta(minutes=10), hour + timedelta(minutes=90))
        cursor.execute(
            "SELECT hour, completed, failed, wait_ms, run_ms FROM pgqueue_hour_jobs ORDER BY 1"
        )
        rows = cursor.fetchall()

    assert rows == [
        (hour, 5, 1, [1, 3], [0, 0, 4]),
        (hour + timedelta(hours=1), 7, 0, [], []),
    ]
    assert rolled_up_names() == (["q"], ["t"])


def test_recount_fills_the_past_from_the_jobs_in_the_table():
    for hours in (3, 5):
        finished(
            "completed",
            completed_ago=timedelta(hours=hours),
            waited=timedelta(0),
            ran=timedelta(seconds=1),
        )

    assert recount(timezone.now() - timedelta(hours=6)) == 2

    assert sum(v for v in series("day").completed if v) == 2
    assert sum(v for v in series("week").completed if v) == 2
    with pytest.raises(InvalidArgumentError, match="since"):
        recount(datetime(2030, 1, 1))  # naive
