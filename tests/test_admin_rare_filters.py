"""The indexes the admin how-to offers for filters on rare queues and job types: its
migration runs as written, forwards and back, and the list uses them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connection
from django.urls import reverse

from django_pgqueue.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

HOW_TO = Path(__file__).resolve().parent.parent / "docs/how-to/admin.md"
INDEXES = {"shop_jobs_by_queue", "shop_jobs_by_job_type"}


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


def test_the_documented_indexes_are_created_used_and_dropped(admin_client, make_job):
    operations = documented_migration().operations
    for _ in range(3):
        make_job(queue="rare")
    try:
        with connection.cursor() as cursor:
            for operation in operations:
                cursor.execute(operation.sql)
        assert existing(INDEXES) == INDEXES

        with connection.cursor() as cursor:
            cursor.execute("SET enable_seqscan = off")
            plan = Job.objects.filter(queue="rare").order_by("-created_at", "-id")[:51].explain()
            cursor.execute("RESET enable_seqscan")
        assert "shop_jobs_by_queue" in plan, plan
        page = admin_client.get(reverse("admin:django_pgqueue_job_changelist"), {"queue": "rare"})
        assert page.context["cl"].result_count == 3
    finally:
        with connection.cursor() as cursor:
            for operation in reversed(operations):
                cursor.execute(operation.reverse_sql)

    assert existing(INDEXES) == set()
