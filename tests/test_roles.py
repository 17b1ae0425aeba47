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
from django_pgqueue.models import ConcurrencyLimit, Job, JobStatus, QueueState
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


def manage(
    role: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": as_role(role),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        **(env or {}),
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


# Run in a process whose Django reads the jobs through the "jobs" alias as the reader
# role, while its own tables (users, sessions, the admin log) stay the owner's: the
# admin of a dashboard that may only read the queue. Prints each page's status.
ADMIN_AS_READER = """
import json
from django.contrib.auth import get_user_model
from django.db import connections
from django.test import Client
from django.urls import reverse

user, _ = get_user_model().objects.get_or_create(
    username="dashboard", defaults={"is_staff": True, "is_superuser": True}
)
client = Client(raise_request_exception=False)
client.force_login(user)
job_id, failed_id = IDS
jobs = reverse("admin:django_pgqueue_job_changelist")
pages = {
    "index": reverse("admin:index"),
    "job list": jobs,
    "job list, failed": jobs + "?status__exact=failed",
    "job list, a queue": jobs + "?queue=mail",
    "job list, search": jobs + "?q=order_id%3D7",
    "job list, error class": jobs + "?status__exact=failed&error=RuntimeError",
    "a job's page": reverse("admin:django_pgqueue_job_change", args=[job_id]),
    "a failed job's page": reverse("admin:django_pgqueue_job_change", args=[failed_id]),
    "live endpoint": reverse("admin:django_pgqueue_job_live") + "?id=" + job_id,
    "overview": reverse("admin:django_pgqueue_job_overview"),
    "errors": reverse("admin:django_pgqueue_job_errors"),
    "charts": reverse("admin:django_pgqueue_job_charts"),
    "periodic jobs": reverse("admin:django_pgqueue_job_periodic"),
    "stored schedules": reverse("admin:django_pgqueue_storedschedule_changelist"),
    "concurrency limits": reverse("admin:django_pgqueue_concurrencylimit_changelist"),
    "rate limits": reverse("admin:django_pgqueue_ratelimit_changelist"),
}
statuses = {name: client.get(url).status_code for name, url in pages.items()}
with connections["jobs"].cursor() as cursor:
    cursor.execute("SELECT current_user")
    statuses["jobs read as"] = cursor.fetchone()[0]
failed_page = pages["a failed job's page"]
changes = {
    "retry a job": (reverse("admin:django_pgqueue_job_action", args=[failed_id, "retry"]), {}),
    "retry from the list": (jobs, {"action": "retry_jobs", "_selected_action": [failed_id]}),
    "pause a queue": (reverse("admin:django_pgqueue_job_queue_action", args=["mail", "pause"]), {}),
    "add a limit": (
        reverse("admin:django_pgqueue_concurrencylimit_add"),
        {"scope": "queue", "name": "mail", "override": "2"},
    ),
}
for name, (url, data) in changes.items():
    response = client.post(url, data, HTTP_REFERER="http://testserver" + failed_page)
    shown = client.get(response.get("Location") or failed_page).content.decode()
    statuses[name] = [response.status_code, "The jobs database refused the change" in shown]
print(json.dumps(statuses))
"""


CHANGES = ("retry a job", "retry from the list", "pause a queue", "add a limit")


def test_the_admin_reads_every_page_as_the_reader_role_and_says_changes_are_refused(roles):
    pending = enqueue("tests.noop", {"order_id": 7}, queue="mail")
    failed = enqueue("tests.fail", max_attempts=1)
    run = manage("pgqueue_worker", "pgqueue_worker", "--burst", "--queues", "default")
    assert run.returncode == 0, run.stderr[-3000:]

    admin = manage(
        "postgres",
        "shell",
        "-c",
        ADMIN_AS_READER.replace("IDS", repr((str(pending.pk), str(failed.pk)))),
        env={
            "DATABASE_URL": database_url_for_tests(),
            "PGQUEUE_TEST_JOBS_URL": as_role("pgqueue_reader"),
            "PGQUEUE_TEST_SETTINGS": json.dumps({"DATABASE": "jobs"}),
        },
    )

    assert admin.returncode == 0, admin.stderr[-3000:]
    statuses = json.loads(admin.stdout.strip().splitlines()[-1])
    assert statuses.pop("jobs read as") == "pgqueue_reader"
    changes = {name: statuses.pop(name) for name in CHANGES}
    assert statuses == dict.fromkeys(statuses, 200), admin.stderr[-3000:]
    # A change is refused by the database: a message on the page it came from, not a 500.
    assert changes == {name: [302, True] for name in CHANGES}, admin.stderr[-3000:]
    assert Job.objects.get(pk=failed.pk).status == JobStatus.FAILED
    assert not ConcurrencyLimit.objects.filter(name="mail").exists()
    assert not QueueState.objects.filter(paused_at__isnull=False).exists()
