"""Property-based tests of flow control in the claim.

Over random limits, jobs and interleavings of several claimers, each a database session
of its own as each worker is:

- no concurrency limit (per queue, per job type, per key) is exceeded in any state a
  claimer commits, and a key with room and due jobs is never left unclaimed;
- no rate limit (per job type, per key) is exceeded in any window of the start times
  the claim recorded, whether claims fill free slots or prefetch (``p_start_within``),
  and the room a window has is used.

And the same of real worker processes (``manage.py pgqueue_worker``): the handlers of a
key never run more at once than its limit, over random limits, keys, job lengths and
numbers of workers. A worker SIGKILLed and recovered is the subject of
``test_key_limits.py``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_pgqueue import enqueue_many, registry
from django_pgqueue.limits import override_limit
from django_pgqueue.models import ConcurrencyLimit, Job, JobStatus, RateLimit
from tests.test_key_limits import keyed_worker, runs_by_key
from tests.test_limits import drain_then_runs, most_at_once
from tests.test_rate_limits import most_in_any_window
from tests.testapp import keyed_jobs, rated_jobs
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

KEYED = "tests.per_tenant"
RATED = "tests.per_tenant_rate"
PLAIN = "tests.record"
QUEUE = "q"

# The most jobs in flight, committed, of any key of KEYED, of QUEUE and of PLAIN.
IN_FLIGHT = """
SELECT COALESCE(max(per_key), 0),
       (SELECT count(*) FROM pgqueue_jobs
         WHERE status IN ('claimed', 'running') AND queue = %(queue)s),
       (SELECT count(*) FROM pgqueue_jobs
         WHERE status IN ('claimed', 'running') AND job_type = %(plain)s)
  FROM (SELECT count(*) AS per_key FROM pgqueue_jobs
         WHERE status IN ('claimed', 'running') AND job_type = %(keyed)s
         GROUP BY concurrency_key) AS keys
"""


@pytest.fixture
def flow_job_types() -> Iterator[None]:
    """The job types with a per-key limit and a per-key rate, registered for the test."""
    registry.register(keyed_jobs.per_tenant)
    registry.register(rated_jobs.per_tenant_rate)
    yield
    registry.unregister(KEYED)
    registry.unregister(RATED)


def reset() -> None:
    """An empty queue and no limit: each example starts from nothing."""
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE pgqueue_jobs, pgqueue_limits, pgqueue_rate_limits, pgqueue_rate_starts "
            "CASCADE"
        )


def session() -> psycopg.Connection[Any]:
    conn = connection.get_new_connection(connection.get_connection_params())
    conn.autocommit = True
    return conn


def claim(
    conn: psycopg.Connection[Any],
    batch_size: int,
    free_slots: int | None = None,
    start_within: float | None = None,
) -> list[Any]:
    """One claim as a worker makes it (``p_start``), committed; the ids claimed."""
    with conn.transaction():
        rows = conn.execute(
            "SELECT id FROM claim_job_batch('w', NULL, %s, NULL, true, %s, %s)",
            [batch_size, free_slots, start_within],
        ).fetchall()
    return [row[0] for row in rows]


def run_together(bodies: list[Callable[[psycopg.Connection[Any]], None]]) -> None:
    """Run each body in a thread with a session of its own, all released at once; fail
    if any fails."""
    barrier = threading.Barrier(len(bodies))
    errors: list[BaseException] = []

    def run(body: Callable[[psycopg.Connection[Any]], None]) -> None:
        conn = session()
        try:
            barrier.wait(timeout=10)
            body(conn)
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=run, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors


# A claimer's turns: claim a batch of this size, then maybe finish one of its jobs.
turns = st.lists(st.tuples(st.integers(1, 5), st.booleans()), min_size=1, max_size=8)


@EXAMPLES
@given(
    key_limit=st.integers(1, 3),
    queue_limit=st.none() | st.integers(1, 5),
    type_limit=st.none() | st.integers(1, 4),
    tenants=st.lists(st.sampled_from("abcd"), min_size=1, max_size=24),
    plain_jobs=st.integers(0, 12),
    claimers=st.lists(turns, min_size=2, max_size=4),
)
def test_no_concurrency_limit_is_exceeded_by_claimers_in_any_order(
    flow_job_types: None,
    key_limit: int,
    queue_limit: int | None,
    type_limit: int | None,
    tenants: list[str],
    plain_jobs: int,
    claimers: list[list[tuple[int, bool]]],
) -> None:
    reset()
    ConcurrencyLimit.objects.create(scope="key", name=KEYED, declared=key_limit)
    if queue_limit is not None:
        ConcurrencyLimit.objects.create(scope="queue", name=QUEUE, declared=queue_limit)
    if type_limit is not None:
        ConcurrencyLimit.objects.create(scope="job_type", name=PLAIN, declared=type_limit)
    enqueue_many(
        [{"job_type": KEYED, "queue": QUEUE, "data": {"tenant": t}} for t in tenants]
        + [{"job_type": PLAIN, "queue": QUEUE} for _ in range(plain_jobs)]
    )
    limits = (key_limit, queue_limit, type_limit)

    def claimer(plan: list[tuple[int, bool]]) -> Callable[[psycopg.Connection[Any]], None]:
        def body(conn: psycopg.Connection[Any]) -> None:
            held: list[Any] = []
            for batch_size, finish_one in plan:
                held += claim(conn, batch_size)
                # Every state a claimer commits keeps every limit.
                seen = conn.execute(
                    IN_FLIGHT, {"queue": QUEUE, "plain": PLAIN, "keyed": KEYED}
                ).fetchone()
                assert seen is not None
                for count, most in zip(seen, limits, strict=True):
                    assert most is None or count <= most, (seen, limits)
                if finish_one and held:
                    conn.execute(
                        "UPDATE pgqueue_jobs SET status = 'completed', completed_at = now() "
                        "WHERE id = %s",
                        [held.pop(0)],
                    )

        return body

    run_together([claimer(plan) for plan in claimers])

    # Claiming on until nothing comes: each key gets all the room it has (no key is left
    # behind by another's backlog), and still no limit is exceeded.
    with session() as conn:
        while claim(conn, 5):
            pass
        seen = conn.execute(IN_FLIGHT, {"queue": QUEUE, "plain": PLAIN, "keyed": KEYED}).fetchone()
    assert seen is not None
    for count, most in zip(seen, limits, strict=True):
        assert most is None or count <= most, (seen, limits)
    if queue_limit is None:
        keyed = Job.objects.filter(job_type=KEYED)
        unfinished = Counter(
            keyed.exclude(status=JobStatus.COMPLETED).values_list("concurrency_key", flat=True)
        )
        in_flight = Counter(
            keyed.filter(status=JobStatus.RUNNING).values_list("concurrency_key", flat=True)
        )
        assert in_flight == {key: min(n, key_limit) for key, n in unfinished.items()}


# Rates are per second, so that an example takes about that long.
CLAIMING_SECONDS = 1.3


@EXAMPLES
@given(
    type_rate=st.integers(2, 6),
    key_rate=st.integers(1, 4),
    tenants=st.lists(st.sampled_from("abc"), min_size=1, max_size=20),
    plain_jobs=st.integers(1, 20),
    claimers=st.integers(2, 4),
    batch_size=st.integers(1, 6),
    prefetch=st.booleans(),
)
def test_no_rate_limit_is_exceeded_in_any_window_by_claimers(
    flow_job_types: None,
    type_rate: int,
    key_rate: int,
    tenants: list[str],
    plain_jobs: int,
    claimers: int,
    batch_size: int,
    prefetch: bool,
) -> None:
    reset()
    RateLimit.objects.create(
        scope="job_type", name=PLAIN, declared_jobs=type_rate, declared_seconds=1
    )
    RateLimit.objects.create(scope="key", name=RATED, declared_jobs=key_rate, declared_seconds=1)
    enqueue_many(
        [{"job_type": RATED, "data": {"tenant": t}} for t in tenants]
        + [{"job_type": PLAIN} for _ in range(plain_jobs)]
    )
    # Prefetching: more jobs asked for than there are free slots, each counted as
    # started by when a slot would start it.
    free_slots, start_within = (1, 0.05) if prefetch else (None, None)

    def body(conn: psycopg.Connection[Any]) -> None:
        until = time.monotonic() + CLAIMING_SECONDS
        while time.monotonic() < until:
            claim(conn, batch_size, free_slots, start_within)
            time.sleep(0.01)

    run_together([body] * claimers)

    started = Job.objects.exclude(status=JobStatus.PENDING)
    plain = [job.started_at for job in started.filter(job_type=PLAIN)]
    assert most_in_any_window(plain, 1) <= type_rate
    for tenant in set(tenants):
        keyed = [job.started_at for job in started.filter(job_type=RATED, concurrency_key=tenant)]
        assert most_in_any_window(keyed, 1) <= key_rate, tenant
        # The room of the first window is used: a limit is no excuse to idle.
        assert len(keyed) >= min(key_rate, tenants.count(tenant))
    assert len(plain) >= min(type_rate, plain_jobs)


@settings(EXAMPLES, max_examples=4)
@given(
    key_limit=st.integers(1, 2),
    jobs=st.lists(
        st.tuples(st.sampled_from("abc"), st.sampled_from([0.0, 0.02, 0.1])),
        min_size=2,
        max_size=12,
    ),
    workers=st.integers(2, 3),
)
def test_worker_processes_never_run_more_of_a_key_at_once_than_its_limit(
    flow_job_types: None, key_limit: int, jobs: list[tuple[str, float]], workers: int
) -> None:
    reset()
    Execution.objects.all().delete()
    # An override: the workers write the declared limit (1) when they start, never it.
    override_limit("key", KEYED, key_limit)
    enqueued = enqueue_many(
        [{"job_type": KEYED, "data": {"tenant": t, "sleep": sleep}} for t, sleep in jobs]
    )

    drain_then_runs(enqueued, [keyed_worker(f"w{i}") for i in range(workers)])

    runs = runs_by_key()
    assert sorted(len(intervals) for intervals in runs.values()) == sorted(
        Counter(tenant for tenant, _ in jobs).values()
    )  # each job ran once
    assert all(most_at_once(intervals) <= key_limit for intervals in runs.values()), runs
