"""The job list's filters on a queue or a job type: they find a job in every state, and a
value that few jobs have is found through indexes, not by reading the jobs table."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgqueue import JobStatus
from django_pgqueue.models import Job
from django_pgqueue.models.jobs import EVERY_JOB_BY_STATE

CHANGELIST = "admin:django_pgqueue_job_changelist"


def one_job_in_each_state(make_job: Any, **fields: Any) -> set[str]:
    """A job of ``fields`` in every state, a held one among the pending; their ids."""
    jobs = [make_job(status=status, **fields) for status in JobStatus.values]
    jobs.append(make_job(status=JobStatus.PENDING, held=True, concurrency_key="k", **fields))
    return {str(job.pk) for job in jobs}


@pytest.mark.django_db
def test_every_job_by_state_matches_a_job_in_every_state(make_job):
    ids = one_job_in_each_state(make_job)

    assert {
        str(pk) for pk in Job.objects.filter(EVERY_JOB_BY_STATE).values_list("pk", flat=True)
    } == ids


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("parameter", "fields"),
    [("queue", {"queue": "rare"}), ("job_type", {"job_type": "tests.rare"})],
)
def test_a_filter_lists_the_jobs_of_its_value_in_every_state(
    admin_client, make_job, parameter, fields
):
    ids = one_job_in_each_state(make_job, **fields)
    make_job(queue="other", job_type="tests.other")

    page = admin_client.get(reverse(CHANGELIST), {parameter: next(iter(fields.values()))})

    assert page.status_code == 200
    assert page.context["cl"].result_count == len(ids)
    assert {str(job.pk) for job in page.context["cl"].result_list} == ids


def plans_of_job_queries(queries: list[dict[str, str]]) -> list[str]:
    """The plans of the captured queries that read ``pgqueue_jobs``."""
    plans = []
    with connection.cursor() as cursor:
        for query in queries:
            if "pgqueue_jobs" in query["sql"] and query["sql"].lstrip().startswith("SELECT"):
                cursor.execute("EXPLAIN " + query["sql"])
                plans.append("\n".join(row[0] for row in cursor.fetchall()))
    return plans


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("parameter", "value", "index"),
    [
        ("queue", "rare", "idx_jobs_finished_queue"),
        ("job_type", "tests.rare", "idx_jobs_finished_job_type"),
    ],
)
def test_a_value_few_jobs_have_is_found_without_reading_the_table(
    admin_client, make_job, parameter, value, index
):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_jobs (job_type, queue, status, completed_at)"
            " SELECT 'tests.common' || (i % 4), 'common' || (i % 4),"
            " (ARRAY['completed', 'completed', 'failed', 'pending'])[1 + i % 4],"
            " CASE WHEN i % 4 < 3 THEN now() END"
            " FROM generate_series(1, 20000) AS i"
        )
    for status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.PENDING):
        make_job(status=status, queue="rare", job_type="tests.rare")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_jobs")

    with CaptureQueriesContext(connection) as captured:
        page = admin_client.get(reverse(CHANGELIST), {parameter: value})

    assert page.context["cl"].result_count == 3
    plans = plans_of_job_queries(captured.captured_queries)
    listing = [plan for plan in plans if index in plan]
    assert listing, plans
    assert not [plan for plan in plans if "Seq Scan on pgqueue_jobs" in plan], plans


HOW_TO = Path(__file__).resolve().parent.parent / "docs/how-to/admin.md"
OLD_INDEXES = {"shop_jobs_by_queue", "shop_jobs_by_job_type"}


def documented_migration() -> type:
    section = HOW_TO.read_text().split("{ #rare-filters }", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)[:1]
    namespace: dict[str, object] = {}
    exec(code, namespace)  # the docs' own example
    migration = namespace["Migration"]
    assert isinstance(migration, type)
    return migration


def existing(names: set[str]) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE indexname = ANY(%s)", [list(names)])
        return {name for (name,) in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_the_documented_migration_drops_the_indexes_an_earlier_version_suggested():
    with connection.cursor() as cursor:
        cursor.execute("CREATE INDEX shop_jobs_by_queue ON pgqueue_jobs (queue, created_at, id)")
        cursor.execute(
            "CREATE INDEX shop_jobs_by_job_type ON pgqueue_jobs (job_type, created_at, id)"
        )
    assert existing(OLD_INDEXES) == OLD_INDEXES

    migration = documented_migration()
    assert migration.atomic is False  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        for operation in migration.operations:  # type: ignore[attr-defined]
            cursor.execute(operation.sql)

    assert existing(OLD_INDEXES) == set()
