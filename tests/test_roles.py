"""Least privilege: with the grants of the production how-to (docs/how-to/production.md,
its ``grants.sql`` block, run as written), a worker runs jobs as ``pgqueue_worker`` and
``pgqueue_status`` reads the queues as ``pgqueue_reader``; neither can change the
schema."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.db import connection

from django_pgqueue import enqueue
from django_pgqueue.models import Job, JobStatus
from tests.workers import ROOT, database_url_for_tests

pytestmark = pytest.mark.django_db(transaction=True)

DOCS = ROOT / "docs" / "how-to" / "production.md"
ROLES = ("pgqueue_worker", "pgqueue_reader")


def grants_sql() -> str:
    text = DOCS.read_text()
    match = re.search(r'```sql title="grants.sql"\n(.*?)```', text, re.S)
    assert match, "the production how-to has no grants.sql block"
    return match.group(1)


def as_role(role: str) -> str:
    parts = urlsplit(database_url_for_tests())
    host = parts.hostname or ""
    netloc = f"{role}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
def roles(other_connection):
    for role in ROLES:
        other_connection.execute(f"DROP ROLE IF EXISTS {role}")
    other_connection.execute(grants_sql())
    yield
    for role in ROLES:
        other_connection.execute(f"DROP OWNED BY {role}")
        other_connection.execute(f"DROP ROLE {role}")


def manage(role: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": as_role(role),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_worker_runs_jobs_as_the_worker_role(roles):
    jobs = [enqueue("tests.noop") for _ in range(5)]
    who = manage(
        "pgqueue_worker",
        "shell",
        "-c",
        "from django.db import connection\n"
        "with connection.cursor() as c:\n"
        "    c.execute('SELECT current_user')\n"
        "    print(c.fetchone()[0])",
    )
    assert who.stdout.strip().splitlines()[-1] == "pgqueue_worker", who.stderr

    run = manage("pgqueue_worker", "pgqueue_worker", "--burst", "--worker-id", "least-privilege")

    assert run.returncode == 0, run.stderr[-3000:]
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)
    ) == {JobStatus.COMPLETED}


def test_the_reader_role_reads_the_queues_and_writes_nothing(roles, other_connection):
    enqueue("tests.noop", queue="mail")

    run = manage("pgqueue_reader", "pgqueue_status", "--json")

    assert run.returncode == 0, run.stderr[-3000:]
    queues = {queue["name"]: queue for queue in json.loads(run.stdout)["queues"]}
    assert queues["mail"]["pending"] == 1
    with (
        psycopg.connect(as_role("pgqueue_reader")) as reader,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        reader.execute("UPDATE pgqueue_jobs SET priority = 1")


def test_the_worker_role_cannot_change_the_schema(roles):
    with psycopg.connect(as_role("pgqueue_worker")) as worker:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute("ALTER TABLE pgqueue_jobs ADD COLUMN x int")
        worker.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute("DROP TABLE pgqueue_job_events")
    assert connection.introspection.table_names()  # the schema is as it was
