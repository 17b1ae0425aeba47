"""enqueue() and enqueue_many(): transactional inserts, defaults, and input validation."""

from __future__ import annotations

import gc
import importlib
import time
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.db import connection, transaction

from django_pgqueue import InvalidJobError, PgQueueError, enqueue, enqueue_many, job
from django_pgqueue.inserts import COPY_PART_ROWS
from django_pgqueue.models import Job
from django_pgqueue.schema import MAX_DELAY_SECONDS
from django_pgqueue.validation import EARLIEST_TIME, LATEST_TIME, MAX_NESTING
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db

SQL_INJECTION = "x'; DROP TABLE pgqueue_jobs; --"


def db_now() -> datetime:
    """The current transaction's ``now()``, which ``enqueue`` uses for ``run_at``."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def committed_rows(conn: psycopg.Connection[Any], sql: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql).fetchall()


# -- Transactional enqueue --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_job_enqueued_in_a_rolled_back_transaction_does_not_exist(other_connection):
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(reference="A-1")
        enqueue("tests.record", {"order": "A-1"})
        raise RuntimeError("payment declined")

    assert committed_rows(other_connection, "SELECT id FROM pgqueue_jobs") == []
    assert committed_rows(other_connection, "SELECT id FROM testapp_order") == []


@pytest.mark.django_db(transaction=True)
def test_job_enqueued_in_a_committed_transaction_exists_with_the_business_row(other_connection):
    with transaction.atomic():
        order = Order.objects.create(reference="A-2")
        queued = enqueue("tests.record", {"order_id": order.pk})

    assert committed_rows(other_connection, "SELECT id, data->>'order_id' FROM pgqueue_jobs") == [
        (queued.id, str(order.pk))
    ]
    assert committed_rows(other_connection, "SELECT reference FROM testapp_order") == [("A-2",)]


@pytest.mark.django_db(transaction=True)
def test_job_is_invisible_to_other_sessions_until_the_transaction_commits(other_connection):
    with transaction.atomic():
        enqueue("tests.record")
        assert committed_rows(other_connection, "SELECT id FROM pgqueue_jobs") == []

    assert len(committed_rows(other_connection, "SELECT id FROM pgqueue_jobs")) == 1


# -- Waking workers (NOTIFY) ------------------------------------------------------------


@pytest.fixture
def listener(other_connection):
    """Collect the queue names notified on ``pgqueue_jobs`` until a given sentinel."""
    other_connection.execute("LISTEN pgqueue_jobs")

    def received_until(sentinel: str) -> list[str]:
        payloads = []
        for notify in other_connection.notifies(timeout=5):
            payloads.append(notify.payload)
            if notify.payload == sentinel:
                break
        return payloads

    return received_until


@pytest.mark.django_db(transaction=True)
def test_commit_notifies_each_queue_with_due_jobs_once(listener):
    enqueue_many(
        [
            {"job_type": "tests.noop", "queue": "emails"},
            {"job_type": "tests.noop", "queue": "emails"},
            {"job_type": "tests.noop", "queue": "reports"},
        ]
    )
    enqueue("tests.noop", queue="sentinel")

    received = listener("sentinel")

    assert sorted(received[:-1]) == ["emails", "reports"]


@pytest.mark.django_db(transaction=True)
def test_rolled_back_and_delayed_jobs_do_not_wake_workers(listener):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("tests.noop", queue="rolled-back")
        raise RuntimeError
    enqueue("tests.noop", queue="delayed", delay=60)
    enqueue("tests.noop", queue="sentinel")

    assert listener("sentinel") == ["sentinel"]


@pytest.mark.django_db(transaction=True)
def test_notify_false_enqueues_without_notifying(listener, pgqueue_settings):
    pgqueue_settings(NOTIFY=False)
    enqueue("tests.noop", queue="silent")
    enqueue_many([{"job_type": "tests.noop", "queue": "silent"}])
    pgqueue_settings(NOTIFY=True)
    enqueue("tests.noop", queue="sentinel")

    assert listener("sentinel") == ["sentinel"]
    assert Job.objects.filter(queue="silent").count() == 2


# -- What enqueue stores ----------------------------------------------------------------


def test_enqueue_returns_the_job_exactly_as_stored():
    queued = enqueue("tests.record", {"user": 7, "tags": ["a", "é"], "nested": {"ok": True}})

    stored = Job.objects.get(pk=queued.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(queued, field.attname) == getattr(stored, field.attname), field.name
    assert queued.status == "pending"
    assert queued.attempts == 0
    assert queued.data == {"user": 7, "tags": ["a", "é"], "nested": {"ok": True}}


def test_enqueue_without_data_stores_an_empty_object():
    assert enqueue("tests.record").data == {}
    assert Job.objects.get().data == {}


def test_data_is_stored_verbatim_including_sql_and_escaped_text():
    data = {"sql": SQL_INJECTION, "text": "literal \\u0000 backslash", "emoji": "🎉"}

    queued = enqueue("tests.record", data)

    assert Job.objects.get(pk=queued.pk).data == data


def test_enqueue_runs_exactly_one_query(django_assert_num_queries):
    with django_assert_num_queries(1):
        enqueue("tests.record", {"n": 1})


def test_enqueue_without_notify_runs_exactly_one_query(django_assert_num_queries, pgqueue_settings):
    pgqueue_settings(NOTIFY=False)
    with django_assert_num_queries(1):
        enqueue("tests.record", {"n": 1})


# -- Defaults ---------------------------------------------------------------------------


def test_defaults_come_from_the_job_registration():
    queued = enqueue("tests.record")  # registered with priority=150

    assert (queued.queue, queued.priority, queued.max_attempts) == ("default", 150, 3)


def test_unregistered_options_fall_back_to_pgqueue_settings(pgqueue_settings):
    pgqueue_settings(DEFAULT_QUEUE="bulk", DEFAULT_PRIORITY=30, DEFAULT_MAX_ATTEMPTS=7)

    queued = enqueue("tests.noop")  # registered without options

    assert (queued.queue, queued.priority, queued.max_attempts) == ("bulk", 30, 7)


def test_registration_options_win_over_pgqueue_settings(pgqueue_settings, clean_registry):
    pgqueue_settings(DEFAULT_QUEUE="bulk", DEFAULT_PRIORITY=30, DEFAULT_MAX_ATTEMPTS=7)
    job("tests.enqueue.emails", queue="emails", priority=5, max_attempts=2)(lambda job: None)

    queued = enqueue("tests.enqueue.emails")

    assert (queued.queue, queued.priority, queued.max_attempts) == ("emails", 5, 2)


def test_explicit_arguments_win_over_the_registration_even_when_falsy():
    queued = enqueue("tests.record", queue="urgent", priority=0, max_attempts=1)

    assert (queued.queue, queued.priority, queued.max_attempts) == ("urgent", 0, 1)


def test_unregistered_job_type_is_accepted_when_validation_is_off(pgqueue_settings):
    pgqueue_settings(VALIDATE_JOB_TYPES=False)

    queued = enqueue("billing:v2/charge-card")

    assert Job.objects.get(pk=queued.pk).job_type == "billing:v2/charge-card"
    assert (queued.queue, queued.priority, queued.max_attempts) == ("default", 100, 3)


# -- run_at and delay -------------------------------------------------------------------


def test_job_without_run_at_or_delay_is_due_at_once():
    assert enqueue("tests.record").run_at == db_now()


def test_run_at_schedules_the_job_at_that_instant():
    when = datetime(2031, 5, 17, 9, 30, tzinfo=ZoneInfo("Europe/Paris"))

    queued = enqueue("tests.record", run_at=when)

    assert Job.objects.get(pk=queued.pk).run_at == when
    assert queued.run_at == datetime(2031, 5, 17, 7, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [(30, 30), (0.25, 0.25), (timedelta(minutes=5), 300), (0, 0)],
    ids=["int", "float", "timedelta", "zero"],
)
def test_delay_schedules_the_job_that_long_after_now(delay, seconds):
    queued = enqueue("tests.record", delay=delay)

    assert queued.run_at == db_now() + timedelta(seconds=seconds)


# -- enqueue_many -----------------------------------------------------------------------


def test_enqueue_many_runs_the_same_statements_whatever_the_batch_size(django_assert_num_queries):
    small = [{"job_type": "tests.record", "data": {"i": i}} for i in range(50)]
    large = [{"job_type": "tests.record", "data": {"i": i}} for i in range(2 * COPY_PART_ROWS + 1)]

    # The clock, one COPY of every row, the NOTIFY (always due inside a transaction).
    with django_assert_num_queries(3):
        jobs = enqueue_many(small)
    # A batch streamed while it is validated: the same, inside a savepoint.
    with django_assert_num_queries(5):
        jobs += enqueue_many(large)

    assert Job.objects.count() == len(small) + len(large)
    assert {job.pk for job in jobs} == set(Job.objects.values_list("pk", flat=True))


def test_a_streamed_batch_keeps_input_order_and_stores_each_job_as_returned():
    specs = [
        {"job_type": "tests.record", "data": {"i": i}, "priority": i % 3}
        for i in range(3 * COPY_PART_ROWS + 7)
    ]

    jobs = enqueue_many(specs)

    assert [job.data["i"] for job in jobs] == list(range(len(specs)))
    stored = {row.pk: row for row in Job.objects.all()}
    assert len(stored) == len(specs)
    for returned in jobs:
        row = stored[returned.pk]
        assert (row.data, row.priority, row.created_at, row.run_at) == (
            returned.data,
            returned.priority,
            returned.created_at,
            returned.run_at,
        )
    created = [job.created_at for job in jobs]
    assert created == sorted(created)
    assert len(set(created)) == len(created)


@pytest.mark.django_db(transaction=True)
def test_a_bad_spec_late_in_a_streamed_batch_inserts_nothing(other_connection):
    specs: list[dict[str, Any]] = [{"job_type": "tests.noop"} for _ in range(2 * COPY_PART_ROWS)]
    specs.append({"job_type": "tests.noop", "priority": -1})

    with pytest.raises(InvalidJobError) as excinfo:
        enqueue_many(specs)

    assert excinfo.value.field == f"specs[{2 * COPY_PART_ROWS}].priority"
    assert committed_rows(other_connection, "SELECT count(*) FROM pgqueue_jobs") == [(0,)]


@pytest.mark.django_db(transaction=True)
def test_a_bad_spec_late_in_a_streamed_batch_leaves_the_callers_transaction_usable(
    other_connection,
):
    specs: list[Any] = [{"job_type": "tests.noop"} for _ in range(COPY_PART_ROWS + 5)]
    specs.append("not a mapping")

    with transaction.atomic():
        Order.objects.create(reference="B-1")
        with pytest.raises(InvalidJobError):
            enqueue_many(specs)
        kept = enqueue("tests.record", {"order": "B-1"})

    assert committed_rows(other_connection, "SELECT id FROM pgqueue_jobs") == [(kept.id,)]
    assert committed_rows(other_connection, "SELECT reference FROM testapp_order") == [("B-1",)]


def test_a_streamed_batch_leaves_the_garbage_collector_as_it_found_it():
    specs: list[Any] = [{"job_type": "tests.noop"} for _ in range(COPY_PART_ROWS + 1)]
    assert gc.isenabled()

    enqueue_many(specs)
    assert gc.isenabled()

    with pytest.raises(InvalidJobError):
        enqueue_many([*specs, {"job_type": "tests.noop", "priority": -1}])
    assert gc.isenabled()

    gc.disable()
    try:
        enqueue_many(specs)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_unique_key_late_in_a_streamed_batch_is_still_honoured():
    held = enqueue("tests.noop", unique_key="report:7")
    specs: list[dict[str, Any]] = [
        {"job_type": "tests.noop", "data": {"i": i}} for i in range(COPY_PART_ROWS + 10)
    ]
    specs.append({"job_type": "tests.noop", "unique_key": "report:7"})
    specs.append({"job_type": "tests.noop", "unique_key": "report:8"})

    jobs = enqueue_many(specs)

    assert jobs[-2].id == held.id
    assert Job.objects.filter(unique_key="report:8").get().id == jobs[-1].id
    assert Job.objects.count() == COPY_PART_ROWS + 10 + 2


@pytest.mark.parametrize(
    ("valid", "invalid"), [(1, True), (5, 5.0)], ids=["int-then-bool", "int-then-float"]
)
def test_enqueue_many_checks_each_spec_even_after_an_equal_valid_one(valid, invalid):
    specs = [{"job_type": "tests.noop", "priority": valid}] * 3
    specs.append({"job_type": "tests.noop", "priority": invalid})

    with pytest.raises(InvalidJobError) as excinfo:
        enqueue_many(specs)

    assert excinfo.value.field == "specs[3].priority"
    assert not Job.objects.exists()


def test_a_delay_of_a_thousand_years_is_accepted():
    (queued,) = enqueue_many([{"job_type": "tests.noop", "delay": MAX_DELAY_SECONDS}])

    assert queued.run_at == db_now() + timedelta(seconds=MAX_DELAY_SECONDS)
    assert Job.objects.get().run_at == queued.run_at


def test_enqueue_many_stores_text_that_needs_escaping_verbatim():
    data = {
        "backslashes": "C:\\temp\\new \\N \\. \\\\",
        "controls": "tab\tnewline\nreturn\rbell\x07",
        "quotes": "'\"",
        "unicode": "é 🎉 \u2028",
        "sql": SQL_INJECTION,
    }

    (queued,) = enqueue_many([{"job_type": "tests.record", "data": data}])

    assert queued.data == data
    assert Job.objects.get(pk=queued.pk).data == data


def test_enqueue_many_returns_jobs_in_input_order():
    specs = [
        {"job_type": "tests.record", "data": {"i": i}, "priority": (i * 37) % 1000}
        for i in range(40)
    ]

    jobs = enqueue_many(specs)

    assert [job.data["i"] for job in jobs] == list(range(40))
    assert [job.priority for job in jobs] == [spec["priority"] for spec in specs]


def test_enqueue_many_keeps_input_order_as_claim_order_among_equal_priorities():
    jobs = enqueue_many([{"job_type": "tests.record", "data": {"i": i}} for i in range(30)])

    created = [job.created_at for job in jobs]
    assert created == sorted(created)
    assert len(set(created)) == len(created)


def test_enqueue_many_applies_defaults_and_schedule_per_spec():
    when = datetime(2031, 1, 1, tzinfo=UTC)

    noop, record, delayed, scheduled = enqueue_many(
        [
            {"job_type": "tests.noop"},
            {"job_type": "tests.record", "queue": "emails"},
            {"job_type": "tests.noop", "delay": timedelta(seconds=90), "max_attempts": 9},
            {"job_type": "tests.noop", "run_at": when, "priority": 1000},
        ]
    )

    now = db_now()
    assert (noop.queue, noop.priority, noop.run_at) == ("default", 100, now)
    assert (record.queue, record.priority) == ("emails", 150)
    assert (delayed.run_at, delayed.max_attempts) == (now + timedelta(seconds=90), 9)
    assert (scheduled.run_at, scheduled.priority) == (when, 1000)


def test_enqueue_many_accepts_any_iterable():
    jobs = enqueue_many({"job_type": "tests.noop", "data": {"i": i}} for i in range(3))

    assert [job.data for job in jobs] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_enqueue_many_of_nothing_runs_no_query(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert enqueue_many([]) == []


# -- Rejected input ---------------------------------------------------------------------


def nested(levels: int) -> dict[str, Any]:
    """A dict with ``levels`` levels of dicts and lists, built without recursion."""
    value: Any = 1
    for level in range(levels - 1):
        value = [value] if level % 2 else {"k": value}
    return {"top": value}


# (keyword arguments of enqueue, the field the error names)
INVALID_ARGUMENTS = [
    pytest.param({"data": [1, 2]}, "data", id="data-list"),
    pytest.param({"data": "text"}, "data", id="data-str"),
    pytest.param({"data": {"when": datetime(2030, 1, 1, tzinfo=UTC)}}, "data", id="data-datetime"),
    pytest.param({"data": {"ids": {1, 2}}}, "data", id="data-set"),
    pytest.param({"data": {"obj": object()}}, "data", id="data-object"),
    pytest.param({"data": {(1, 2): "tuple key"}}, "data", id="data-tuple-key"),
    pytest.param({"data": {"x": float("nan")}}, "data", id="data-nan"),
    pytest.param({"data": {"x": [1, float("-inf")]}}, "data", id="data-infinity"),
    pytest.param({"data": {"s": "a\x00b"}}, "data", id="data-nul-in-value"),
    pytest.param({"data": {"k\x00": 1}}, "data", id="data-nul-in-key"),
    pytest.param({"data": {"s": "\\\x00"}}, "data", id="data-nul-after-backslash"),
    pytest.param({"data": {"s": "\ud800"}}, "data", id="data-lone-surrogate"),
    pytest.param({"data": {"x": 1e16}}, "data", id="data-float-returned-as-int"),
    pytest.param({"data": {"x": -2.5e300}}, "data", id="data-negative-huge-float"),
    pytest.param({"data": {"x": 10**5000}}, "data", id="data-int-of-5000-digits"),
    pytest.param({"data": {1: "int key"}}, "data", id="data-int-key"),
    pytest.param({"data": {"a": {None: 1}}}, "data", id="data-none-key-nested"),
    pytest.param({"data": nested(MAX_NESTING + 1)}, "data", id="data-nested-too-deep"),
    pytest.param({"data": nested(100_000)}, "data", id="data-nested-100000-levels"),
    pytest.param(
        {"run_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))},
        "run_at",
        id="run_at-before-year-1-in-utc",
    ),
    pytest.param(
        {"run_at": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14)))},
        "run_at",
        id="run_at-after-year-9999-in-utc",
    ),
    pytest.param({"run_at": datetime(1, 1, 1, tzinfo=UTC)}, "run_at", id="run_at-year-1"),
    pytest.param({"run_at": datetime.max.replace(tzinfo=UTC)}, "run_at", id="run_at-max"),
    pytest.param({"priority": -1}, "priority", id="priority-negative"),
    pytest.param({"priority": 1001}, "priority", id="priority-too-high"),
    pytest.param({"priority": "5"}, "priority", id="priority-str"),
    pytest.param({"priority": 5.0}, "priority", id="priority-float"),
    pytest.param({"priority": True}, "priority", id="priority-bool"),
    pytest.param({"job_type": ""}, "job_type", id="job_type-empty"),
    pytest.param({"job_type": "x" * 201}, "job_type", id="job_type-too-long"),
    pytest.param({"job_type": None}, "job_type", id="job_type-none"),
    pytest.param({"job_type": 42}, "job_type", id="job_type-int"),
    pytest.param({"job_type": "tests.nope"}, "job_type", id="job_type-unregistered"),
    pytest.param({"queue": ""}, "queue", id="queue-empty"),
    pytest.param({"queue": "q" * 101}, "queue", id="queue-too-long"),
    pytest.param({"queue": 7}, "queue", id="queue-int"),
    pytest.param({"queue": "a/b"}, "queue", id="queue-slash"),
    pytest.param({"run_at": datetime(2031, 1, 1), "delay": None}, "run_at", id="run_at-naive"),
    pytest.param({"run_at": date(2031, 1, 1)}, "run_at", id="run_at-date"),
    pytest.param({"run_at": "2031-01-01T00:00:00Z"}, "run_at", id="run_at-str"),
    pytest.param(
        {"run_at": datetime(2031, 1, 1, tzinfo=UTC), "delay": 5}, "run_at", id="run_at-and-delay"
    ),
    pytest.param({"delay": -1}, "delay", id="delay-negative"),
    pytest.param({"delay": timedelta(seconds=-1)}, "delay", id="delay-negative-timedelta"),
    pytest.param({"delay": float("nan")}, "delay", id="delay-nan"),
    pytest.param({"delay": float("inf")}, "delay", id="delay-infinite"),
    pytest.param({"delay": "10"}, "delay", id="delay-str"),
    pytest.param({"delay": True}, "delay", id="delay-bool"),
    pytest.param({"delay": 1e12}, "delay", id="delay-past-year-9999"),
    pytest.param({"delay": timedelta(days=999_999_999)}, "delay", id="delay-max-timedelta"),
    pytest.param({"max_attempts": 0}, "max_attempts", id="max_attempts-zero"),
    pytest.param({"max_attempts": -3}, "max_attempts", id="max_attempts-negative"),
    pytest.param({"max_attempts": 1001}, "max_attempts", id="max_attempts-too-high"),
    pytest.param({"max_attempts": "3"}, "max_attempts", id="max_attempts-str"),
    pytest.param({"max_attempts": 2.0}, "max_attempts", id="max_attempts-float"),
    pytest.param({"max_attempts": True}, "max_attempts", id="max_attempts-bool"),
]

# Names that are never valid, whether or not job types are validated against the registry.
INVALID_NAMES = [
    pytest.param("has space", id="space"),
    pytest.param("quote'd", id="single-quote"),
    pytest.param('double"quote', id="double-quote"),
    pytest.param("semi;colon", id="semicolon"),
    pytest.param("nul\x00byte", id="nul"),
    pytest.param("trailing-newline\n", id="trailing-newline"),
    pytest.param("tab\there", id="tab"),
    pytest.param("tâche", id="non-ascii"),
    pytest.param("-leading-dash", id="leading-dash"),
    pytest.param(SQL_INJECTION, id="sql-injection"),
]


@pytest.fixture
def assert_rejected(django_assert_num_queries):
    """Assert a call raises InvalidJobError naming ``field`` and touches no table."""

    def check(call, field: str) -> InvalidJobError:
        with django_assert_num_queries(0), pytest.raises(InvalidJobError) as excinfo:
            call()
        assert excinfo.value.field == field
        assert str(excinfo.value).startswith(f"{field}: ")
        assert not Job.objects.exists()
        return excinfo.value

    return check


def test_invalid_job_error_is_a_pgqueue_error_and_a_value_error():
    assert issubclass(InvalidJobError, PgQueueError)
    assert issubclass(InvalidJobError, ValueError)


@pytest.mark.parametrize(("arguments", "field"), INVALID_ARGUMENTS)
def test_enqueue_rejects_invalid_argument_naming_it(arguments, field, assert_rejected):
    arguments = {"job_type": "tests.record", **arguments}

    assert_rejected(lambda: enqueue(**arguments), field)


@pytest.mark.parametrize(("arguments", "field"), INVALID_ARGUMENTS)
def test_enqueue_many_rejects_a_batch_with_one_invalid_spec_naming_it(
    arguments, field, assert_rejected
):
    specs = [{"job_type": "tests.record", "data": {"i": i}} for i in range(4)]
    specs[2] = {"job_type": "tests.record", **arguments}

    assert_rejected(lambda: enqueue_many(specs), f"specs[2].{field}")


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_invalid_job_type_is_rejected_even_when_validation_is_off(
    name, assert_rejected, pgqueue_settings
):
    pgqueue_settings(VALIDATE_JOB_TYPES=False)

    error = assert_rejected(lambda: enqueue(name), "job_type")
    assert "is not a valid job type" in str(error)


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_invalid_queue_is_rejected(name, assert_rejected):
    assert_rejected(lambda: enqueue("tests.record", queue=name), "queue")


def test_unregistered_job_type_error_lists_the_registered_ones(assert_rejected):
    error = assert_rejected(lambda: enqueue("tests.nope"), "job_type")

    assert "tests.record" in str(error)
    assert "VALIDATE_JOB_TYPES" in str(error)


def test_longest_valid_names_and_extreme_values_are_accepted(pgqueue_settings):
    pgqueue_settings(VALIDATE_JOB_TYPES=False)
    job_type = "t" * 200
    queue = "q" * 100

    low = enqueue(job_type, queue=queue, priority=0, max_attempts=1)
    high = enqueue(job_type, queue=queue, priority=1000, max_attempts=1000)

    stored = Job.objects.get(pk=low.pk)
    assert (stored.job_type, stored.queue, stored.priority) == (job_type, queue, 0)
    assert (high.priority, high.max_attempts) == (1000, 1000)


def test_payload_over_max_payload_bytes_is_rejected(assert_rejected, pgqueue_settings):
    pgqueue_settings(MAX_PAYLOAD_BYTES=100)

    error = assert_rejected(lambda: enqueue("tests.record", {"s": "x" * 93}), "data")  # 101 B
    assert "101 bytes" in str(error)
    assert "MAX_PAYLOAD_BYTES" in str(error)


def test_payload_of_exactly_max_payload_bytes_is_accepted(pgqueue_settings):
    pgqueue_settings(MAX_PAYLOAD_BYTES=100)

    enqueue("tests.record", {"s": "x" * 92})  # {"s":"..."} is 8 bytes + 92

    assert Job.objects.count() == 1


def test_payload_limit_counts_utf8_bytes_not_characters(assert_rejected, pgqueue_settings):
    pgqueue_settings(MAX_PAYLOAD_BYTES=100)

    enqueue("tests.record", {"s": "é" * 46})  # 8 + 92 bytes
    Job.objects.all().delete()
    assert_rejected(lambda: enqueue("tests.record", {"s": "é" * 47}), "data")  # 8 + 94 bytes


def test_default_payload_limit_is_64_kib(assert_rejected):
    enqueue("tests.record", {"s": "x" * (65536 - 8)})
    Job.objects.all().delete()

    assert_rejected(lambda: enqueue("tests.record", {"s": "x" * (65536 - 7)}), "data")


@pytest.mark.parametrize(
    ("specs", "field", "message"),
    [
        pytest.param([{"job_type": "tests.noop"}, "tests.noop"], "specs[1]", "mapping", id="str"),
        pytest.param([{"job_type": "tests.noop", "prio": 1}], "specs[0]", "prio", id="typo"),
        pytest.param([{"data": {}}], "specs[0].job_type", "required", id="no-job-type"),
    ],
)
def test_enqueue_many_rejects_malformed_specs(specs, field, message, assert_rejected):
    error = assert_rejected(lambda: enqueue_many(specs), field)

    assert message in str(error)


@pytest.mark.django_db(transaction=True)
def test_autocommit_enqueues_in_quick_succession_share_one_notification(
    other_connection, monkeypatch
):
    inserts_module = importlib.import_module("django_pgqueue.inserts")

    # A window far longer than the test, so that timing on a busy machine cannot matter.
    monkeypatch.setattr(inserts_module, "NOTIFY_COALESCE_SECONDS", 3600)
    monkeypatch.setattr(inserts_module, "_last_notified", {})
    other_connection.execute("LISTEN pgqueue_jobs")
    for _ in range(5):
        enqueue("tests.record")
    enqueue("tests.record", queue="other")  # another queue is notified on its own
    inserts_module._last_notified.clear()  # as if the window had passed
    enqueue("tests.record")

    payloads = [n.payload for n in other_connection.notifies(timeout=1, stop_after=10)]

    assert payloads == ["default", "other", "default"]


@pytest.mark.django_db(transaction=True)
def test_enqueues_inside_transactions_always_notify_on_commit(other_connection, monkeypatch):
    inserts_module = importlib.import_module("django_pgqueue.inserts")

    monkeypatch.setattr(inserts_module, "NOTIFY_COALESCE_SECONDS", 3600)
    other_connection.execute("LISTEN pgqueue_jobs")
    enqueue("tests.record")
    with transaction.atomic():
        enqueue("tests.record", queue="in_tx")

    payloads = {n.payload for n in other_connection.notifies(timeout=1, stop_after=2)}

    assert "in_tx" in payloads


@pytest.mark.django_db
@pytest.mark.parametrize(
    "options",
    [{}, {"delay": 30}, {"run_at": datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)}],
)
def test_the_returned_job_is_the_row_in_the_database(options):
    job = enqueue("tests.noop", {"n": [1, 2], "s": "é\\n"}, priority=7, **options)
    (many,) = enqueue_many([{"job_type": "tests.noop", "data": {"k": None}, **options}])

    for returned in (job, many):
        stored = Job.objects.get(pk=returned.pk)
        for field in Job._meta.concrete_fields:
            assert getattr(returned, field.attname) == getattr(stored, field.attname), field.name
        assert returned._state.adding is False
        assert returned._state.db == "default"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("options", [{}, {"delay": 30}])
def test_the_returned_job_is_the_row_also_when_no_notify_is_sent(options, monkeypatch):
    # Autocommit enqueues within the NOTIFY window send none: their own, shorter statements.
    inserts_module = importlib.import_module("django_pgqueue.inserts")
    monkeypatch.setattr(inserts_module, "NOTIFY_COALESCE_SECONDS", 3600)
    enqueue("tests.noop")  # notifies, and opens the window
    job = enqueue("tests.noop", {"n": [1, 2]}, priority=7, max_attempts=2, **options)

    stored = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(job, field.attname) == getattr(stored, field.attname), field.name
    # run_at is the transaction's now() plus the delay; created_at is read a moment
    # later in the same statement (over a millisecond on a loaded machine).
    gap = (stored.run_at - stored.created_at).total_seconds()
    assert options.get("delay", 0) - 0.1 < gap <= options.get("delay", 0)


@pytest.mark.django_db
def test_job_ids_are_version_7_uuids_that_grow_with_time():
    first = enqueue("tests.noop")
    time.sleep(0.002)
    later = enqueue_many([{"job_type": "tests.noop"}])[0]

    assert first.id.version == 7
    assert later.id.version == 7
    assert later.id > first.id


@pytest.mark.django_db(transaction=True)
def test_values_at_the_edges_of_what_is_stored_reach_the_handler_unchanged():
    from django_pgqueue.worker import Worker
    from tests.testapp.jobs import ECHOED

    data = {
        "deep": nested(MAX_NESTING - 1)["top"],  # with data itself: MAX_NESTING levels
        "largest float kept": 9999999999999998.0,
        "tiny": 5e-324,
        "negative zero": -0.0,
        "big int": 10**4299,
        "text": "é\U0001f600 \\u0000 as text",
    }
    times = [EARLIEST_TIME, datetime(2000, 1, 1, tzinfo=timezone(timedelta(hours=-23)))]
    jobs = [enqueue("tests.echo", data, run_at=times[0])]
    jobs += enqueue_many([{"job_type": "tests.echo", "data": data, "run_at": times[1]}])
    late = enqueue("tests.echo", data, run_at=LATEST_TIME)

    Worker(burst=True, concurrency=1).run()

    for echoed, run_at in zip(jobs, times, strict=True):
        assert ECHOED[str(echoed.id)] == {"data": data, "run_at": run_at, "queue": "default"}
    assert Job.objects.get(pk=late.pk).run_at == LATEST_TIME


def test_a_run_at_with_an_offset_postgresql_refuses_is_stored_in_utc():
    odd_offsets = [
        timedelta(hours=20),
        timedelta(hours=-15, seconds=-30),
        timedelta(microseconds=1),
    ]
    for offset in odd_offsets:
        run_at = datetime(2030, 6, 1, 12, tzinfo=timezone(offset))
        job = enqueue("tests.noop", run_at=run_at)
        (many,) = enqueue_many([{"job_type": "tests.noop", "run_at": run_at}])

        assert Job.objects.get(pk=job.pk).run_at == run_at
        assert Job.objects.get(pk=many.pk).run_at == run_at


def test_a_payload_nested_too_deep_names_the_limit(assert_rejected):
    error = assert_rejected(lambda: enqueue("tests.noop", nested(100_000)), "data")

    assert f"nests more than {MAX_NESTING} levels" in str(error)


def test_a_time_out_of_range_in_utc_is_rejected_before_writing_in_autocommit(
    transactional_db, assert_rejected
):
    late = datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14)))

    error = assert_rejected(lambda: enqueue("tests.noop", run_at=late, unique_key="k"), "run_at")

    assert "outside the supported range once converted to UTC" in str(error)


def test_an_unknown_option_is_a_type_error_naming_it(django_assert_num_queries, clean_registry):
    definition = job("tests.enqueue.options")(lambda job: None)

    with django_assert_num_queries(0):
        with pytest.raises(TypeError, match=r"enqueue\(\) got unexpected keyword arguments"):
            enqueue("tests.noop", prio=5)
        with pytest.raises(TypeError, match=r"\['prio'\]"):
            definition.enqueue({}, prio=5)
    assert not Job.objects.exists()
