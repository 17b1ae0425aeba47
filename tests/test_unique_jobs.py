"""Unique jobs: at most one pending, claimed or running job per ``unique_key``.

``enqueue``/``enqueue_many``/``@job`` with keys, the duplicate policy, validation,
transactions, ``retry()`` and the admin; races between real processes at the end.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import transaction
from django.urls import reverse

from django_pgqueue import (
    DuplicateJobError,
    InvalidJobError,
    PgQueueError,
    enqueue,
    enqueue_many,
    job,
    schema,
)
from django_pgqueue.exceptions import JobRegistrationError
from django_pgqueue.models import Job
from tests.workers import ROOT, database_url_for_tests, wait_for, worker_thread

pytestmark = pytest.mark.django_db


def active_jobs(key: str) -> list[Job]:
    return list(Job.objects.filter(unique_key=key, status__in=["pending", "claimed", "running"]))


# -- enqueue ----------------------------------------------------------------------------


def test_enqueue_with_a_key_stores_it():
    queued = enqueue("tests.noop", unique_key="report:2026-12")

    assert Job.objects.get(pk=queued.pk).unique_key == "report:2026-12"


def test_enqueue_with_a_held_key_returns_the_active_job_and_inserts_nothing():
    first = enqueue("tests.noop", {"n": 1}, unique_key="sync:user:7")
    again = enqueue("tests.noop", {"n": 2}, unique_key="sync:user:7", priority=900)

    assert again.pk == first.pk
    assert (again.data, again.priority) == ({"n": 1}, first.priority)
    assert Job.objects.count() == 1


def test_enqueue_without_a_key_never_deduplicates():
    enqueue("tests.noop")
    enqueue("tests.noop")

    assert Job.objects.count() == 2


def test_different_keys_do_not_collide_but_one_key_spans_job_types():
    a = enqueue("tests.noop", unique_key="a")
    b = enqueue("tests.noop", unique_key="b")
    other_type = enqueue("tests.record", unique_key="a")

    assert a.pk != b.pk
    assert other_type.pk == a.pk  # keys are global: put the job type in the key if needed


def test_new_and_duplicate_unique_enqueues_each_run_one_query(django_assert_num_queries):
    with django_assert_num_queries(1):
        enqueue("tests.noop", unique_key="k")
    with django_assert_num_queries(1):
        enqueue("tests.noop", unique_key="k")


def test_on_duplicate_raise_names_the_active_job_and_inserts_nothing():
    first = enqueue("tests.noop", unique_key="import:42")

    with pytest.raises(DuplicateJobError) as excinfo:
        enqueue("tests.noop", unique_key="import:42", on_duplicate="raise")

    error = excinfo.value
    assert isinstance(error, PgQueueError)
    assert (error.job_id, error.unique_key, error.job.pk) == (first.pk, "import:42", first.pk)
    assert str(first.pk) in str(error)
    assert "on_duplicate='return'" in str(error)
    assert Job.objects.count() == 1
    copy = pickle.loads(pickle.dumps(error))  # e.g. across a process pool
    assert (copy.job_id, str(copy)) == (error.job_id, str(error))


def test_on_duplicate_raise_inserts_when_the_key_is_free():
    queued = enqueue("tests.noop", unique_key="free", on_duplicate="raise")

    assert active_jobs("free") == [queued]


@pytest.mark.parametrize("status", ["claimed", "running"])
def test_claimed_and_running_jobs_hold_their_key(make_job, status):
    held = make_job(status=status, worker_id="w", unique_key="k")

    assert enqueue("tests.noop", unique_key="k").pk == held.pk


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_key_is_free_again_once_the_job_finished(make_job, status):
    finished = make_job(status=status, unique_key="k")

    queued = enqueue("tests.noop", unique_key="k")

    assert queued.pk != finished.pk
    assert active_jobs("k") == [queued]


@pytest.mark.django_db(transaction=True)
def test_key_is_free_again_after_the_job_ran_to_completion():
    first = enqueue("tests.noop", unique_key="nightly")
    with worker_thread(burst=True):
        wait_for(lambda: Job.objects.get(pk=first.pk).status == "completed")

    second = enqueue("tests.noop", unique_key="nightly")

    assert second.pk != first.pk


# -- enqueue_many -----------------------------------------------------------------------


def test_enqueue_many_mixes_new_held_repeated_and_unkeyed_specs(django_assert_num_queries):
    held = enqueue("tests.noop", {"old": True}, unique_key="held")

    with django_assert_num_queries(1):
        jobs = enqueue_many(
            [
                {"job_type": "tests.noop", "data": {"i": 0}},
                {"job_type": "tests.noop", "data": {"i": 1}, "unique_key": "new"},
                {"job_type": "tests.noop", "data": {"i": 2}, "unique_key": "held"},
                {"job_type": "tests.noop", "data": {"i": 3}, "unique_key": "new"},
                {"job_type": "tests.noop", "data": {"i": 4}},
            ]
        )

    assert [job.data for job in jobs] == [{"i": 0}, {"i": 1}, {"old": True}, {"i": 1}, {"i": 4}]
    assert jobs[2].pk == held.pk
    assert jobs[1].pk == jobs[3].pk  # the first spec with a key wins
    assert Job.objects.count() == 4
    assert active_jobs("new") == [jobs[1]]


def test_enqueue_many_with_keys_keeps_input_order_as_claim_order():
    jobs = enqueue_many(
        [{"job_type": "tests.noop", "unique_key": key} for key in ("c", "a", "d", "b")]
    )

    stored = list(Job.objects.order_by("created_at").values_list("unique_key", flat=True))
    assert stored == ["c", "a", "d", "b"]
    assert [job.unique_key for job in jobs] == ["c", "a", "d", "b"]


def test_enqueue_many_raise_rejects_the_whole_batch_when_a_key_is_held():
    held = enqueue("tests.noop", unique_key="held")

    with pytest.raises(DuplicateJobError) as excinfo:
        enqueue_many(
            [
                {"job_type": "tests.noop", "unique_key": "fresh"},
                {"job_type": "tests.noop"},
                {"job_type": "tests.noop", "unique_key": "held"},
            ],
            on_duplicate="raise",
        )

    assert excinfo.value.job_id == held.pk
    assert list(Job.objects.all()) == [held]


def test_enqueue_many_raise_rejects_a_key_repeated_in_the_batch_before_writing(
    django_assert_num_queries,
):
    specs = [
        {"job_type": "tests.noop", "unique_key": "x"},
        {"job_type": "tests.noop", "unique_key": "y"},
        {"job_type": "tests.noop", "unique_key": "x"},
    ]
    with django_assert_num_queries(0), pytest.raises(InvalidJobError) as excinfo:
        enqueue_many(specs, on_duplicate="raise")

    assert excinfo.value.field == "specs[2].unique_key"
    assert "specs[0]" in str(excinfo.value)


def test_enqueue_many_raise_inserts_everything_when_no_key_is_held():
    jobs = enqueue_many(
        [{"job_type": "tests.noop", "unique_key": "a"}, {"job_type": "tests.noop"}],
        on_duplicate="raise",
    )

    assert Job.objects.count() == 2
    assert jobs[0].unique_key == "a"


# -- @job(unique_key=...) ---------------------------------------------------------------


def test_job_type_default_key_allows_one_active_job_of_the_type(clean_registry):
    @job("tests.unique_rebuild", unique_key="rebuild-search-index")
    def rebuild(job):
        return None

    first = rebuild.enqueue()
    again = enqueue("tests.unique_rebuild")

    assert again.pk == first.pk
    assert first.unique_key == "rebuild-search-index"


def test_explicit_key_wins_over_the_job_type_default(clean_registry):
    @job("tests.unique_default", unique_key="default-key")
    def handler(job):
        return None

    queued = handler.enqueue(unique_key="mine")

    assert queued.unique_key == "mine"


def test_job_type_key_function_computes_the_key_from_the_payload(clean_registry):
    @job("tests.unique_sync", unique_key=lambda data: f"sync:{data['user_id']}")
    def sync(job):
        return None

    a = sync.enqueue({"user_id": 1})
    b = sync.enqueue({"user_id": 2})
    a_again = enqueue_many([{"job_type": "tests.unique_sync", "data": {"user_id": 1}}])[0]

    assert (a.unique_key, b.unique_key) == ("sync:1", "sync:2")
    assert a_again.pk == a.pk


def test_job_type_key_function_returning_none_means_no_key(clean_registry):
    @job("tests.unique_maybe", unique_key=lambda data: data.get("key"))
    def maybe(job):
        return None

    maybe.enqueue()
    maybe.enqueue()

    assert Job.objects.filter(unique_key__isnull=True).count() == 2


def test_definition_enqueue_passes_on_duplicate(clean_registry):
    @job("tests.unique_strict", unique_key="strict")
    def strict(job):
        return None

    strict.enqueue()
    with pytest.raises(DuplicateJobError):
        strict.enqueue(on_duplicate="raise")


def test_key_function_errors_are_reported_as_invalid_jobs(
    clean_registry, django_assert_num_queries
):
    @job("tests.unique_broken", unique_key=lambda data: f"k:{data['missing']}")
    def broken(job):
        return None

    @job("tests.unique_wrong_type", unique_key=lambda data: 42)
    def wrong_type(job):
        return None

    with django_assert_num_queries(0):
        with pytest.raises(InvalidJobError, match="raised KeyError") as raised:
            broken.enqueue({})
        with pytest.raises(InvalidJobError, match="returned int") as returned:
            wrong_type.enqueue()

    assert raised.value.field == returned.value.field == "unique_key"


def test_job_decorator_rejects_an_invalid_default_key(clean_registry):
    with pytest.raises(InvalidJobError) as excinfo:
        job("tests.unique_empty", unique_key="")
    assert excinfo.value.field == "unique_key"

    with pytest.raises(JobRegistrationError, match="unique_key must be a string, a callable"):
        job("tests.unique_number", unique_key=42)  # type: ignore[arg-type]


# -- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "must not be empty"),
        ("x" * (schema.UNIQUE_KEY_MAX_LENGTH + 1), "at most 255 characters"),
        ("a\x00b", "NUL"),
        ("\ud800", "lone surrogate"),
        (42, "must be a string, got int"),
        (b"bytes", "must be a string, got bytes"),
    ],
)
def test_invalid_key_is_rejected_before_anything_is_written(
    key, message, django_assert_num_queries
):
    with django_assert_num_queries(0):
        with pytest.raises(InvalidJobError, match=message) as single:
            enqueue("tests.noop", unique_key=key)
        with pytest.raises(InvalidJobError, match=message) as batch:
            enqueue_many(
                [{"job_type": "tests.noop"}, {"job_type": "tests.noop", "unique_key": key}]
            )

    assert single.value.field == "unique_key"
    assert batch.value.field == "specs[1].unique_key"
    assert Job.objects.count() == 0


def test_longest_key_and_any_text_are_accepted():
    longest = "k" * schema.UNIQUE_KEY_MAX_LENGTH
    odd = "x'; DROP TABLE pgqueue_jobs; -- 🗝 ключ"

    assert enqueue("tests.noop", unique_key=longest).unique_key == longest
    assert enqueue("tests.noop", unique_key=odd).unique_key == odd
    assert enqueue("tests.noop", unique_key=odd).pk == Job.objects.get(unique_key=odd).pk


@pytest.mark.parametrize("value", ["ignore", None, True])
def test_invalid_on_duplicate_is_rejected(value, django_assert_num_queries):
    with django_assert_num_queries(0):
        with pytest.raises(
            InvalidJobError, match="must be one of 'return', 'raise', 'replace', got"
        ) as single:
            enqueue("tests.noop", unique_key="k", on_duplicate=value)
        with pytest.raises(InvalidJobError) as batch:
            enqueue_many([{"job_type": "tests.noop"}], on_duplicate=value)

    assert single.value.field == batch.value.field == "on_duplicate"


# -- transactions -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_rolling_back_the_enqueuing_transaction_frees_the_key(other_connection):
    with pytest.raises(RuntimeError), transaction.atomic():
        doomed = enqueue("tests.noop", unique_key="order:9")
        raise RuntimeError("payment declined")

    queued = enqueue("tests.noop", unique_key="order:9")

    assert queued.pk != doomed.pk
    rows = other_connection.execute("SELECT id FROM pgqueue_jobs WHERE unique_key = 'order:9'")
    assert rows.fetchall() == [(queued.pk,)]


def test_rolling_back_a_savepoint_frees_the_key():
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue("tests.noop", unique_key="k")
            raise RuntimeError
        queued = enqueue("tests.noop", unique_key="k")

    assert active_jobs("k") == [queued]


def test_a_duplicate_in_the_same_transaction_returns_the_uncommitted_job():
    with transaction.atomic():
        first = enqueue("tests.noop", unique_key="k")
        assert enqueue("tests.noop", unique_key="k").pk == first.pk


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_wakes_no_worker_and_does_not_delay_the_next_notification(
    other_connection, make_job, monkeypatch
):
    inserts_module = importlib.import_module("django_pgqueue.inserts")
    # A coalescing window far longer than the test: timing cannot matter.
    monkeypatch.setattr(inserts_module, "NOTIFY_COALESCE_SECONDS", 3600)
    monkeypatch.setattr(inserts_module, "_last_notified", {})
    make_job(unique_key="held", queue="dup")
    other_connection.execute("LISTEN pgqueue_jobs")

    enqueue("tests.noop", queue="dup", unique_key="held")  # inserts nothing: no NOTIFY
    enqueue_many([{"job_type": "tests.noop", "queue": "dup", "unique_key": "held"}])
    enqueue("tests.noop", queue="dup", unique_key="fresh")  # must notify

    payloads = [n.payload for n in other_connection.notifies(timeout=1, stop_after=5)]
    assert payloads == ["dup"]


# -- retry() ----------------------------------------------------------------------------


def test_retry_skips_a_job_whose_key_is_held_by_an_active_job(make_job, caplog):
    failed = make_job(status="failed", unique_key="k")
    plain = make_job(status="failed")
    holder = enqueue("tests.noop", unique_key="k")

    with caplog.at_level(logging.WARNING, logger="django_pgqueue.models"):
        assert Job.objects.all().retry() == 1

    assert Job.objects.get(pk=failed.pk).status == "failed"
    assert Job.objects.get(pk=plain.pk).status == "pending"
    assert active_jobs("k") == [holder]
    assert "retry skipped 1 job(s) whose unique_key is held" in caplog.text
    assert failed.retry() is False


def test_retry_of_a_job_whose_key_is_free_puts_it_back(make_job):
    failed = make_job(status="failed", unique_key="k")
    make_job(status="completed", unique_key="k")

    assert failed.retry() is True
    assert active_jobs("k") == [Job.objects.get(pk=failed.pk)]


def test_retry_of_several_jobs_sharing_a_key_retries_only_the_newest(make_job):
    older = make_job(status="failed", unique_key="k")
    newer = make_job(status="cancelled", unique_key="k")

    assert Job.objects.all().retry() == 1

    assert active_jobs("k") == [Job.objects.get(pk=newer.pk)]
    assert Job.objects.get(pk=older.pk).status == "failed"


def test_retry_inside_a_transaction_leaves_the_transaction_usable(make_job):
    make_job(status="failed", unique_key="k")
    enqueue("tests.noop", unique_key="k")

    with transaction.atomic():
        assert Job.objects.all().retry() == 0
        assert Job.objects.count() == 2  # no aborted transaction


# -- admin ------------------------------------------------------------------------------


@pytest.fixture
def operator_client(client: Any, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user(username="op", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_pgqueue", codename__in=["view_job", "retry_job"]
        )
    )
    client.force_login(user)
    return client


def test_admin_job_page_shows_the_unique_key(operator_client):
    queued = enqueue("tests.noop", unique_key="invoice:2026-0042")

    page = operator_client.get(reverse("admin:django_pgqueue_job_change", args=[queued.pk]))

    assert page.status_code == 200
    assert "invoice:2026-0042" in page.content.decode()


def test_admin_search_finds_a_job_by_its_exact_unique_key(operator_client):
    wanted = enqueue("tests.noop", unique_key="invoice:2026-0042")
    enqueue("tests.noop", unique_key="invoice:2026-0043")

    page = operator_client.get(
        reverse("admin:django_pgqueue_job_changelist"), {"q": "invoice:2026-0042"}
    )

    assert [job.pk for job in page.context["cl"].result_list] == [wanted.pk]


def test_admin_retry_reports_jobs_skipped_because_their_key_is_held(operator_client, make_job):
    blocked = make_job(status="failed", unique_key="k")
    free = make_job(status="failed")
    running = make_job(status="running", worker_id="w")
    enqueue("tests.noop", unique_key="k")

    page = operator_client.post(
        reverse("admin:django_pgqueue_job_changelist"),
        {
            "action": "retry_jobs",
            "_selected_action": [str(j.pk) for j in (blocked, free, running)],
            "index": "0",
        },
        follow=True,
    )

    messages = [message.message for message in page.context["messages"]]
    assert messages == [
        "Retry: 1 changed, 1 skipped (not failed or cancelled). "
        "1 skipped (unique key held by an active job)."
    ]


# -- races between processes ------------------------------------------------------------

# Each process waits for a start time on stdin, then in round r, at start + r * STEP,
# enqueues ``keys`` for round r and prints what it got; MODE is "one" (enqueue), "many"
# (enqueue_many of the keys, shuffled) or "rollback" (enqueue, then roll back). HOLD
# seconds inside the transaction make the others wait on the uncommitted insert.
RACER = r"""
import json, random, sys, time
import django
django.setup()
from django.db import transaction
from django_pgqueue import enqueue, enqueue_many

mode, rounds, step, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
keys = sys.argv[5].split(",")
print("ready", flush=True)
start = float(sys.stdin.readline())

class Rollback(Exception):
    pass

for r in range(rounds):
    time.sleep(max(0.0, start + r * step - time.time()))
    round_keys = [f"{key}-{r}" for key in keys]
    random.shuffle(round_keys)
    try:
        with transaction.atomic():
            if mode == "many":
                jobs = enqueue_many(
                    [{"job_type": "tests.noop", "unique_key": key} for key in round_keys]
                )
            else:
                jobs = [enqueue("tests.noop", unique_key=round_keys[0])]
            time.sleep(hold * random.random())
            if mode == "rollback":
                raise Rollback
    except Rollback:
        continue
    print(json.dumps({job.unique_key: str(job.id) for job in jobs}), flush=True)
"""


@pytest.fixture
def racers() -> Iterator[Any]:
    started: list[subprocess.Popen[str]] = []

    def run(modes: list[str], *, rounds: int, keys: str, hold: float = 0.02) -> list[list[dict]]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": database_url_for_tests(),
            "PYTHONPATH": str(ROOT),
        }
        step = 0.1
        for mode in modes:
            started.append(
                subprocess.Popen(
                    [sys.executable, "-c", RACER, mode, str(rounds), str(step), str(hold), keys],
                    cwd=ROOT,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for process in started:
            assert process.stdout is not None and process.stdout.readline() == "ready\n"
        start = time.time() + 0.2
        for process in started:
            assert process.stdin is not None
            process.stdin.write(f"{start}\n")
            process.stdin.flush()  # communicate() closes it
        results = []
        for process in started:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err
            results.append([json.loads(line) for line in out.splitlines()])
        return results

    yield run
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def assert_one_job_per_key_that_every_caller_got(results: list[list[dict]]) -> None:
    got: dict[str, set[str]] = {}
    for lines in results:
        for line in lines:
            for key, job_id in line.items():
                got.setdefault(key, set()).add(job_id)
    assert got, "no process enqueued anything"
    for key, ids in got.items():
        stored = [str(job.pk) for job in Job.objects.filter(unique_key=key)]
        assert stored == list(ids), f"{key}: callers got {ids}, the table has {stored}"


@pytest.mark.django_db(transaction=True)
def test_processes_enqueueing_one_key_at_once_all_get_the_one_job(racers):
    results = racers(["one", "one", "one", "one"], rounds=20, keys="race")

    assert all(len(lines) == 20 for lines in results)
    assert_one_job_per_key_that_every_caller_got(results)
    assert Job.objects.count() == 20


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_lets_the_waiting_processes_insert_one_job(racers):
    results = racers(["rollback", "one", "one", "one"], rounds=20, keys="race", hold=0.05)

    assert results[0] == []
    assert_one_job_per_key_that_every_caller_got(results[1:])
    assert Job.objects.count() == 20


@pytest.mark.django_db(transaction=True)
def test_processes_enqueueing_overlapping_batches_at_once_agree_without_deadlock(racers):
    results = racers(["many", "many", "many", "one"], rounds=15, keys="a,b,c")

    assert_one_job_per_key_that_every_caller_got(results)
    assert Job.objects.count() == 15 * 3
