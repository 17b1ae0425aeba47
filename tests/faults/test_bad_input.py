"""Bad input at the entry points not covered elsewhere: each is a clear error, nothing is
written, and no SQL is built from the input.

Covered elsewhere (not repeated here):

- ``enqueue``/``enqueue_many``: non-JSON data, oversized payloads, priorities out of
  range, naive datetimes, negative delays, unknown job types, NUL bytes and SQL
  fragments in job_type/queue/data: tests/test_enqueue.py.
- ``Worker(...)`` options, concurrency 0: tests/test_worker.py,
  tests/test_worker_processes.py; ``pgqueue_recover --stale-after``: the latter.
- ``claim_job_batch`` batch sizes (0, negative, > 10000, NULL) and a missing worker id:
  tests/test_claim.py.
- The Django Tasks backend (priorities, queues, arguments that are not JSON):
  tests/test_tasks_backend.py and tests/test_tasks_conformance.py.
- Admin actions and the live view's parameters: tests/test_admin.py.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, DataError, connection, transaction
from django.urls import reverse

from django_pgqueue.models import Job

pytestmark = pytest.mark.django_db

INJECTION = "x'; DROP TABLE pgqueue_jobs; --"


def _table_intact(count: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgqueue_jobs")
        assert cursor.fetchone()[0] == count
        cursor.execute("SELECT count(*) FROM pgqueue_workers")
        assert cursor.fetchone()[0] == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--concurrency", "0"], "concurrency: must be an integer from 1 to 1000, got 0"),
        (["--concurrency", "-3"], "concurrency"),
        (["--concurrency", "many"], "invalid int value"),
        (["--batch-size", "0"], "batch_size"),
        (["--batch-size", "1000000000"], "batch_size"),
        (["--poll-interval", "-1"], "poll_interval"),
        (["--poll-interval", "nan"], "poll_interval"),
        (["--shutdown-grace", "inf"], "shutdown_grace"),
        (["--queues", INJECTION], "queues"),
        (["--queues", "a\x00b"], "queues"),
        (["--job-types", INJECTION], "job_types"),
        (["--job-types", "no spaces allowed"], "job_types"),
        (["--worker-id", "x" * 256], "worker_id"),
    ],
    ids=lambda value: value[0] if isinstance(value, list) else None,
)
def test_worker_command_rejects_bad_options_before_touching_the_database(
    make_job, options, message
):
    make_job()
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call_command("pgqueue_worker", *options)
    _table_intact(1)


@pytest.mark.parametrize(
    "names",
    [[INJECTION], ["' OR 1=1 --"], ["tests.noop'); DELETE FROM pgqueue_jobs; --"], ["%", "_"]],
)
def test_claim_function_treats_injection_looking_filters_as_plain_names(make_job, names):
    job = make_job()
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM claim_job_batch(%s, %s, 10, NULL)", ["w", names])
        assert cursor.fetchall() == []
        cursor.execute("SELECT id FROM claim_job_batch(%s, NULL, 10, %s)", ["w", names])
        assert cursor.fetchall() == []
    job.refresh_from_db()
    assert job.status == "pending"


def test_claim_function_stores_an_injection_looking_worker_id_as_data(make_job):
    job = make_job()
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, worker_id FROM claim_job_batch(%s, NULL, 1)", [INJECTION])
        assert cursor.fetchall() == [(job.id, INJECTION)]
    assert Job.objects.count() == 1


def test_nul_bytes_never_reach_the_sql_functions(make_job):
    make_job()
    with pytest.raises(DataError, match="NUL"), connection.cursor() as cursor:
        cursor.execute("SELECT * FROM claim_job_batch(%s, NULL, 1)", ["w\x00"])
    _table_intact(1)


@pytest.mark.parametrize("interval", ["NULL", "interval '0'", "interval '-1 hour'"])
def test_recover_function_rejects_an_interval_that_is_not_positive(make_job, interval):
    job = make_job(status="running", worker_id="alive", attempts=1)
    with (
        pytest.raises(DatabaseError, match="p_stale_after must be a positive interval"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(f"SELECT * FROM recover_stale_jobs({interval})")
    job.refresh_from_db()
    assert (job.status, job.worker_id) == ("running", "alive")


@pytest.mark.parametrize(
    "term",
    [INJECTION, "' OR 1=1 --", '"}]}', "%", "_", "\\", 'data__contains={"a":1}'],
)
def test_admin_search_with_sql_fragments_finds_nothing_and_changes_nothing(
    admin_client, make_job, term
):
    make_job(data={"order": 7})
    response = admin_client.get(reverse("admin:django_pgqueue_job_changelist"), {"q": term})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []
    assert Job.objects.count() == 1


def test_admin_search_with_a_nul_byte_is_ignored_and_changes_nothing(admin_client, make_job):
    """Django's admin search form rejects NUL (ProhibitNullCharactersValidator) and lists
    every job, unfiltered: no query is built from the term."""
    make_job(data={"order": 7})
    response = admin_client.get(reverse("admin:django_pgqueue_job_changelist"), {"q": "a\x00b"})
    assert response.status_code == 200
    assert Job.objects.count() == 1
