"""Per-key concurrency limits: ``@job(concurrency=N, concurrency_key=...)``.

What users see: the key each job gets (or a clear error at enqueue), at most N jobs of a
key claimed or running at once, keys at their limit never in the way of other keys (a
key's backlog beyond its limit is ``held``, out of the claim's sight), and held jobs
released as their key gets room, also after a missed release and under several
claimers and worker processes.
"""

from __future__ import annotations

import io
import json
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import enqueue, enqueue_many, job, registry, stats
from django_pgqueue.exceptions import InvalidJobError, JobRegistrationError
from django_pgqueue.limits import declared_limits, override_limit, sync_declared_limits
from django_pgqueue.models import ConcurrencyLimit, Job, JobStatus
from django_pgqueue.recovery import release_held_jobs
from tests.test_limits import (
    claim,
    claim_all,
    claim_concurrently,
    drain_then_runs,
    most_at_once,
)
from tests.testapp import keyed_jobs
from tests.testapp.models import Execution
from tests.workers import WorkerProcess, wait_for

TENANT_JOB = "tests.per_tenant"


@pytest.fixture
def per_tenant() -> Iterator[Any]:
    """``tests.per_tenant`` (one job per ``data['tenant']`` at once) registered, its
    limit written to ``pgqueue_limits`` as a worker starting would."""
    registry.register(keyed_jobs.per_tenant)
    sync_declared_limits()
    yield keyed_jobs.per_tenant
    registry.unregister(TENANT_JOB)


def tenant_jobs(*tenants: str, sleep: float = 0) -> list[Job]:
    """A job of ``tests.per_tenant`` for each tenant, in one ``enqueue_many``; each
    sleeps ``sleep`` seconds when it runs."""
    return enqueue_many(
        [{"job_type": TENANT_JOB, "data": {"tenant": t, "sleep": sleep}} for t in tenants]
    )


def held_ids() -> set[Any]:
    return set(Job.objects.filter(status=JobStatus.PENDING, held=True).values_list("id", flat=True))


# -- Declaring a per-key limit ------------------------------------------------------------


@pytest.mark.django_db
def test_the_limit_is_declared_per_key_not_for_the_job_type(per_tenant):
    assert declared_limits()[("key", TENANT_JOB)] == 1
    assert ("job_type", TENANT_JOB) not in declared_limits()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency_key": "tenant"}, "concurrency_key needs concurrency"),
        ({"concurrency": 2, "concurrency_key": 42}, "must be a payload path"),
        ({"concurrency": 2, "concurrency_key": ""}, "'' is not a payload path"),
        ({"concurrency": 2, "concurrency_key": "customer..id"}, "is not a payload path"),
        ({"concurrency": 0, "concurrency_key": "tenant"}, "must be an integer from 1"),
    ],
)
def test_malformed_per_key_limits_are_refused_at_registration(clean_registry, options, message):
    with pytest.raises(JobRegistrationError, match=message):

        @job("tests.keyed_bad", **options)
        def handler(job: Job) -> None: ...

    assert "tests.keyed_bad" not in registry.registered_job_types()


# -- The key of each job ------------------------------------------------------------------


@pytest.mark.django_db
def test_each_job_gets_its_key_from_the_payload_path_or_the_function(clean_registry):
    @job("tests.keyed_path", concurrency=2, concurrency_key="customer.id")
    def by_path(job: Job) -> None: ...

    @job("tests.keyed_func", concurrency=2, concurrency_key=lambda data: f"shop-{data['shop']}")
    def by_function(job: Job) -> None: ...

    nested = by_path.enqueue({"customer": {"id": 42}})
    computed = enqueue_many([{"job_type": "tests.keyed_func", "data": {"shop": "a\tb\\c\nd"}}])[0]
    plain = enqueue("tests.noop")

    stored = dict(Job.objects.values_list("id", "concurrency_key"))
    assert nested.concurrency_key == stored[nested.id] == "42"
    assert computed.concurrency_key == stored[computed.id] == "shop-a\tb\\c\nd"
    assert plain.concurrency_key is None and stored[plain.id] is None


@pytest.mark.django_db
def test_a_unique_job_gets_its_key_too(per_tenant):
    first = enqueue(TENANT_JOB, {"tenant": "a"}, unique_key="report-1")
    again = enqueue_many([{"job_type": TENANT_JOB, "data": {"tenant": "a"}, "unique_key": "r2"}])

    assert Job.objects.get(pk=first.pk).concurrency_key == "a"
    assert Job.objects.get(pk=again[0].pk).concurrency_key == "a"
    assert again[0].held  # the key already has its one visible job


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("key", "data", "message"),
    [
        ("tenant", {"other": 1}, "takes its concurrency key from data field 'tenant'"),
        ("tenant", None, "takes its concurrency key from data field 'tenant'"),
        ("customer.id", {"customer": 7}, "from data field 'customer.id'"),
        ("tenant", {"tenant": ["a"]}, "must be a string or an integer, got list"),
        ("tenant", {"tenant": True}, "must be a string or an integer, got bool"),
        ("tenant", {"tenant": None}, "must be a string or an integer, got NoneType"),
        ("tenant", {"tenant": ""}, "must not be empty"),
        ("tenant", {"tenant": "x" * 256}, "must be at most 255 characters, got 256"),
        (lambda data: data["tenant"], {}, "function of job type 'tests.keyed' raised KeyError"),
        (lambda data: 42, {}, "function of job type 'tests.keyed' returned int"),
        (lambda data: None, {}, "returned NoneType; it must return a string"),
    ],
)
def test_a_bad_key_is_refused_at_enqueue_and_nothing_is_written(clean_registry, key, data, message):
    @job("tests.keyed", concurrency=1, concurrency_key=key)
    def keyed(job: Job) -> None: ...

    with pytest.raises(InvalidJobError, match=message) as single:
        enqueue("tests.keyed", data)
    with pytest.raises(InvalidJobError, match=message) as batch:
        enqueue_many(
            [{"job_type": "tests.noop"}] * 1500 + [{"job_type": "tests.keyed", "data": data}]
        )

    assert single.value.field == "concurrency_key"
    assert batch.value.field == "specs[1500].concurrency_key"
    assert not Job.objects.exists()


# -- Held jobs and the claim --------------------------------------------------------------


@pytest.mark.django_db
def test_a_key_shows_the_claim_as_many_due_jobs_as_its_limit_and_holds_the_rest(per_tenant):
    jobs = tenant_jobs("a", "a", "a", "b", "a")

    assert [job.held for job in jobs] == [False, True, True, False, True]
    assert held_ids() == {jobs[1].id, jobs[2].id, jobs[4].id}
    single = enqueue(TENANT_JOB, {"tenant": "b"})
    assert single.held and Job.objects.get(pk=single.pk).held


@pytest.mark.django_db
def test_the_claim_takes_one_job_per_key_and_the_next_when_the_first_finished(per_tenant):
    a1, a2, a3, b1 = tenant_jobs("a", "a", "a", "b")

    assert set(claim_all()) == {a1.id, b1.id}
    # Claiming a1 released a2, but the key is full until a1 finishes.
    assert held_ids() == {a3.id}
    assert claim() == []

    Job.objects.filter(pk=a1.pk).update(status=JobStatus.COMPLETED)

    assert claim() == [a2.id]
    assert held_ids() == set()


@pytest.mark.django_db
def test_a_key_at_its_limit_never_delays_another_key(per_tenant):
    backlog = enqueue_many(
        [{"job_type": TENANT_JOB, "data": {"tenant": "big"}, "priority": 900}] * 2000
    )
    assert claim(batch_size=1) == [backlog[0].id]
    small = enqueue(TENANT_JOB, {"tenant": "small"}, priority=0)

    # The big tenant's backlog is held: the claim sees one of its jobs, not 1,999.
    assert Job.objects.filter(concurrency_key="big", status="pending", held=False).count() == 1
    assert claim(batch_size=1) == [small.id]


@pytest.mark.django_db
def test_held_jobs_count_as_pending_in_the_queue_statistics(per_tenant):
    tenant_jobs("a", "a", "a", "b")

    snapshot = stats.snapshot()
    (default,) = [queue for queue in snapshot.queues if queue.name == "default"]

    assert (default.pending, default.held) == (4, 2)
    assert snapshot.all_queues().held == 2
    assert snapshot.as_dict()["queues"][0]["held"] == 2


@pytest.mark.django_db
def test_the_overview_and_the_status_command_show_held_jobs_and_link_to_them(per_tenant, staff):
    tenant_jobs("a", "a", "a", "b")
    client = staff("view_job")

    response = client.get(reverse("admin:django_pgqueue_job_overview"))
    table = io.StringIO()
    call_command("pgqueue_status", stdout=table)

    (default,) = [row for row in response.context["queues"] if row["queue"] == "default"]
    assert (default["pending"], default["held"]) == (4, 2)
    assert response.context["totals"]["held"] == 2
    link = "?queue=default&amp;status__exact=pending&amp;held__exact=1"
    assert f'<a href="/admin/django_pgqueue/job/{link}">2</a>' in response.content.decode()
    lines = table.getvalue().splitlines()
    header = [cell.strip() for cell in next(x for x in lines if " queue " in x).split("┃")[1:-1]]
    row = [cell.strip() for cell in next(x for x in lines if " default " in x).split("│")[1:-1]]
    assert dict(zip(header, row, strict=True))["held"] == "2"


@pytest.mark.django_db
def test_the_status_command_has_no_held_column_while_nothing_is_held(per_tenant):
    tenant_jobs("a", "b")
    table = io.StringIO()

    call_command("pgqueue_status", stdout=table)

    assert " held " not in table.getvalue()


@pytest.mark.django_db
def test_a_job_scheduled_for_later_is_never_held_and_never_blocks_a_due_one(per_tenant):
    later = enqueue(TENANT_JOB, {"tenant": "a"}, delay=3600)
    due = enqueue(TENANT_JOB, {"tenant": "a"})

    assert not later.held and not due.held
    assert claim() == [due.id]


@pytest.mark.django_db
def test_cancelling_a_visible_job_releases_the_next(per_tenant):
    first, second, third = tenant_jobs("a", "a", "a")

    Job.objects.filter(pk=first.pk).cancel()

    assert held_ids() == {third.id}
    assert claim() == [second.id]


@pytest.mark.django_db
def test_a_visible_job_deleted_leaves_room_that_the_sweep_fills(per_tenant):
    first, second, third = tenant_jobs("a", "a", "a")

    Job.objects.filter(pk=first.pk).delete()
    assert claim() == []  # nothing visible until the sweep

    assert release_held_jobs() == 1
    assert held_ids() == {third.id}
    assert claim() == [second.id]


@pytest.mark.django_db
def test_a_cancelled_held_job_retried_is_admitted_again(per_tenant):
    first, second = tenant_jobs("a", "a")
    Job.objects.filter(pk=second.pk).cancel()
    assert not Job.objects.get(pk=second.pk).held  # cancelled: held no more

    Job.objects.filter(pk=second.pk).retry()

    assert held_ids() == {second.id}  # first is still the key's visible job
    assert claim() == [first.id]


@pytest.mark.django_db
def test_a_failed_attempt_back_to_pending_waits_its_turn_visible(per_tenant):
    first, _second, third = tenant_jobs("a", "a", "a")
    assert claim() == [first.id]
    assert held_ids() == {third.id}  # the claim released second

    # As a worker retrying it, or recovery, puts it back: visible, not held.
    Job.objects.filter(pk=first.pk).update(status=JobStatus.PENDING)

    assert held_ids() == {third.id}
    assert claim() == [first.id]  # one at a time, in claim order
    assert claim() == []


# -- Releasing held jobs ------------------------------------------------------------------


@pytest.mark.django_db
def test_raising_the_limit_releases_held_jobs_at_once(per_tenant):
    jobs = tenant_jobs("a", "a", "a", "a")

    override_limit("key", TENANT_JOB, 3)

    assert held_ids() == {jobs[3].id}
    assert set(claim_all()) == {job.id for job in jobs[:3]}


@pytest.mark.django_db
def test_staff_raise_a_per_key_limit_in_the_admin_and_held_jobs_are_released(
    per_tenant, admin_client
):
    jobs = tenant_jobs("a", "a", "a")
    limit = ConcurrencyLimit.objects.get(scope="key", name=TENANT_JOB)

    page = admin_client.get(reverse("admin:django_pgqueue_concurrencylimit_changelist"))
    response = admin_client.post(
        reverse("admin:django_pgqueue_concurrencylimit_change", args=[limit.pk]),
        {"override": "2"},
    )

    assert "Each key of a job type" in page.content.decode()
    assert response.status_code == 302
    assert held_ids() == {jobs[2].id}


@pytest.mark.django_db
def test_staff_list_the_held_jobs_in_the_admin(per_tenant, admin_client):
    jobs = tenant_jobs("a", "a", "b")

    page = admin_client.get(reverse("admin:django_pgqueue_job_changelist"), {"held__exact": "1"})

    assert page.status_code == 200
    assert list(page.context["cl"].result_list) == [jobs[1]]


@pytest.mark.django_db
def test_removing_the_limit_releases_every_held_job(per_tenant):
    jobs = tenant_jobs("a", "a", "a")
    registry.unregister(TENANT_JOB)

    sync_declared_limits()

    assert held_ids() == set()
    assert set(claim_all()) == {job.id for job in jobs}


@pytest.mark.django_db
def test_the_sweep_holds_the_excess_of_delayed_jobs_that_came_due_together(per_tenant):
    soon = timezone.now() + timedelta(seconds=0.3)
    jobs = enqueue_many([{"job_type": TENANT_JOB, "data": {"tenant": "a"}, "run_at": soon}] * 4)
    assert held_ids() == set()  # scheduled for later: never held at enqueue
    time.sleep(0.4)

    assert release_held_jobs() == 0

    assert held_ids() == {job.id for job in jobs[1:]}


@pytest.mark.django_db
def test_the_sweep_releases_a_job_whose_release_was_missed(per_tenant):
    # An enqueue racing the claim of its key's last visible job can be held with no
    # visible job left to release it; here, made by hand.
    (lost,) = tenant_jobs("a")
    Job.objects.filter(pk=lost.pk).update(held=True)
    assert claim() == []

    assert release_held_jobs() == 1
    assert claim() == [lost.id]
    assert release_held_jobs() == 0


@pytest.mark.django_db
def test_the_recover_command_releases_missed_jobs_too(per_tenant):
    (lost,) = tenant_jobs("a")
    Job.objects.filter(pk=lost.pk).update(held=True)
    out = io.StringIO()

    call_command("pgqueue_recover", stdout=out)

    assert "released 1 held job(s) whose key has room" in out.getvalue()
    assert held_ids() == set()


# -- Several claimers, several worker processes -------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_take_two_jobs_of_one_key(per_tenant):
    tenant_jobs(*["a", "b", "c"] * 6)
    override_limit("key", TENANT_JOB, 2)

    claim_concurrently(claimers=8, batch_size=3)

    in_flight = Job.objects.filter(status=JobStatus.CLAIMED)
    keys = list(in_flight.values_list("concurrency_key", flat=True))
    assert keys and all(keys.count(key) <= 2 for key in "abc")
    # Claiming on until nothing comes fills each key to its limit, never past it.
    claim_all()
    keys = list(in_flight.values_list("concurrency_key", flat=True))
    assert sorted(keys) == ["a", "a", "b", "b", "c", "c"]


@pytest.mark.django_db(transaction=True)
def test_a_claimer_never_waits_for_a_claimer_of_another_key(per_tenant):
    tenant_jobs("a", "b")
    blocker = connection.get_new_connection(connection.get_connection_params())
    blocker.autocommit = True
    other = connection.get_new_connection(connection.get_connection_params())
    other.autocommit = True
    try:
        with blocker.transaction():
            # A claim of key "a" left uncommitted holds that key's lock ...
            (taken,) = claim(batch_size=1, conn=blocker)
            assert Job.objects.get(pk=taken).concurrency_key == "a"
            # ... and a claimer of key "b" goes on without waiting for it.
            other.execute("SET lock_timeout = '2s'")
            with other.transaction():
                claimed = claim(batch_size=5, conn=other)
    finally:
        blocker.close()
        other.close()

    assert [Job.objects.get(pk=pk).concurrency_key for pk in claimed] == ["b"]


@pytest.mark.django_db(transaction=True)
def test_the_sweep_never_waits_for_a_job_another_transaction_holds(per_tenant):
    soon = timezone.now() + timedelta(seconds=0.3)
    _first, second, third = enqueue_many(
        [{"job_type": TENANT_JOB, "data": {"tenant": "a"}, "run_at": soon}] * 3
    )
    time.sleep(0.4)  # all three due and visible: two too many
    locker = connection.get_new_connection(connection.get_connection_params())
    try:
        with locker.transaction():
            locker.execute("SELECT 1 FROM pgqueue_jobs WHERE id = %s FOR UPDATE", [second.id])
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '2s'")
            try:
                release_held_jobs()
            finally:
                with connection.cursor() as cursor:
                    cursor.execute("RESET lock_timeout")
    finally:
        locker.close()

    assert held_ids() == {third.id}  # the locked one was left for the next sweep


def runs_by_key() -> dict[str, list[tuple[Any, Any]]]:
    keys = dict(Job.objects.values_list("id", "concurrency_key"))
    runs: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    for job_id, started, finished in Execution.objects.values_list(
        "job_id", "started_at", "finished_at"
    ):
        runs[keys[job_id]].append((started, finished))
    return runs


def keyed_worker(worker_id: str) -> WorkerProcess:
    return WorkerProcess(
        "--concurrency",
        "4",
        "--poll-interval",
        "0.2",
        "--worker-id",
        worker_id,
        env={
            "PGQUEUE_TEST_KEYED_JOBS": "1",
            # Recovery of a killed worker's job within seconds; a slow but live worker
            # keeps beating well inside STALE_AFTER.
            "PGQUEUE_TEST_SETTINGS": json.dumps(
                {"HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 8, "RECOVER_INTERVAL": 1}
            ),
        },
    )


@pytest.mark.django_db(transaction=True)
def test_worker_processes_run_one_job_per_key_at_once_and_keys_in_parallel(per_tenant):
    jobs = tenant_jobs(*["a", "b", "c", "d"] * 6, sleep=0.05)

    drain_then_runs(jobs, [keyed_worker(f"w{i}") for i in range(3)])

    runs = runs_by_key()
    assert sorted(runs) == ["a", "b", "c", "d"]
    assert all(len(intervals) == 6 for intervals in runs.values())  # each job ran once
    assert all(most_at_once(intervals) == 1 for intervals in runs.values())
    assert most_at_once([run for intervals in runs.values() for run in intervals]) > 1


@pytest.mark.django_db(transaction=True)
def test_a_killed_workers_key_is_freed_by_recovery_and_never_runs_twice_at_once(per_tenant):
    # A long job of key "a" is claimed by the worker that is then killed; the key stays
    # full (its job is still "running") until recovery gives the job back.
    slow = enqueue(TENANT_JOB, {"tenant": "a", "sleep": 30})
    rest = tenant_jobs(*["a", "b"] * 4, sleep=0.05)
    victim = keyed_worker("victim")
    try:
        wait_for(lambda: Job.objects.filter(pk=slow.pk, status=JobStatus.RUNNING).exists())
        victim.signal(signal.SIGKILL)
        victim.wait()
    finally:
        victim.stop()
    # Its next run is short (its key stays "a": keys are computed at enqueue).
    Job.objects.filter(pk=slow.pk).update(data={"tenant": "a", "sleep": 0.05})
    survivor = keyed_worker("survivor")
    try:
        wait_for(
            lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == 1 + len(rest),
            timeout=90,
        )
    finally:
        survivor.stop()

    runs = runs_by_key()
    assert len(runs["a"]) == 5 and len(runs["b"]) == 4
    assert all(most_at_once(intervals) == 1 for intervals in runs.values())
    assert Job.objects.get(pk=slow.pk).worker_ids == ["victim", "survivor"]
    # Recovery, not a release by hand, freed the key: nothing is left held.
    assert held_ids() == set()
    assert timezone.now() - Job.objects.get(pk=slow.pk).completed_at < timedelta(minutes=2)
