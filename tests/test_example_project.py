"""The example project (example_project/) works as its README and demo say.

The example has its own settings and apps, so it runs in subprocesses with
``config.settings``, each test on its own database copied from a migrated template
on the test run's PostgreSQL server. Assertions read that database directly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "example_project"

pytestmark = pytest.mark.timeout(60)


def _database_url(name: str) -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path=f"/{name}"))


def _admin_connection() -> psycopg.Connection[Any]:
    return psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)


def _drop(name: str) -> None:
    with _admin_connection() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


class Example:
    """The example project on one database, with a media directory of its own."""

    def __init__(self, database: str, media_root: Path) -> None:
        self.database = database
        self.media_root = media_root

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": _database_url(self.database),
            "MEDIA_ROOT": str(self.media_root),
            "PGQUEUE_LOG_LEVEL": "WARNING",
        }
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=EXAMPLE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=45,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"manage.py {' '.join(args)} exited {result.returncode}\n"
                f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
            )
        return result

    def run(self, code: str) -> Any:
        """Run ``code`` in ``manage.py shell``; return what it passed to ``report()``."""
        prelude = "import json\ndef report(value): print('REPORT ' + json.dumps(value))\n"
        result = self.manage("shell", "--no-imports", "-c", prelude + textwrap.dedent(code))
        lines = [line for line in result.stdout.splitlines() if line.startswith("REPORT ")]
        assert lines, f"the script reported nothing\n{result.stdout}\n{result.stderr}"
        return json.loads(lines[-1].removeprefix("REPORT "))

    def query(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(_database_url(self.database)) as conn:
            return conn.execute(query, params).fetchall()


@pytest.fixture(scope="module")
def template_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    name = f"{settings.DATABASES['default']['TEST']['NAME']}_example_tpl"
    _drop(name)
    with _admin_connection() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    Example(name, tmp_path_factory.mktemp("media")).manage("migrate", "--verbosity", "0")
    yield name
    _drop(name)


@pytest.fixture
def example(template_database: str, tmp_path: Path) -> Iterator[Example]:
    base = settings.DATABASES["default"]["TEST"]["NAME"]
    name = f"{base}_example_{uuid.uuid4().hex[:8]}"
    with _admin_connection() as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_database)
            )
        )
    yield Example(name, tmp_path / "media")
    _drop(name)


PHOTO_UPLOAD = """
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.test.utils import setup_test_environment

setup_test_environment()
client = Client()
upload = SimpleUploadedFile("mug.ppm", b"P6 1 1 255\\n\\x10\\x20\\x30")
response = client.post("/photos/", {"title": "Red mug", "image": upload})
"""


def test_photo_upload_view_saves_the_photo_and_enqueues_its_thumbnail(example: Example) -> None:
    page = example.run(
        PHOTO_UPLOAD
        + """
assert response.status_code == 302, response.status_code
report(client.get(response["Location"]).content.decode())
"""
    )

    [(photo_id, image, status)] = example.query(
        "SELECT id, image, thumbnail_status FROM shop_productphoto"
    )
    assert status == "pending"
    assert (example.media_root / image).is_file()
    [(job_id, job_status, data)] = example.query(
        "SELECT id, status, data FROM pgqueue_jobs WHERE job_type = 'shop.make_thumbnail'"
    )
    assert (job_status, data) == ("pending", {"photo_id": photo_id})
    # The page lists the job it just enqueued.
    assert str(job_id) in page
    assert "shop.make_thumbnail" in page


def test_photo_upload_view_enqueues_inside_the_transaction_of_its_write(
    example: Example,
) -> None:
    outcome = example.run(
        """
from unittest import mock

from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client
from django.test.utils import setup_test_environment

from django_pgqueue import Job
from shop.jobs import make_thumbnail

setup_test_environment()
real_enqueue = make_thumbnail.enqueue
seen = {}

def enqueue_then_fail(*args, **kwargs):
    job = real_enqueue(*args, **kwargs)
    seen["in_atomic_block"] = connection.in_atomic_block
    seen["job_inserted"] = Job.objects.filter(pk=job.pk).exists()
    raise RuntimeError("the request died right after enqueueing")

upload = SimpleUploadedFile("mug.ppm", b"P6 1 1 255\\n\\x10\\x20\\x30")
with mock.patch.object(make_thumbnail, "enqueue", side_effect=enqueue_then_fail):
    try:
        Client().post("/photos/", {"title": "Red mug", "image": upload})
    except RuntimeError:
        seen["raised"] = True
report(seen)
"""
    )

    assert outcome == {"in_atomic_block": True, "job_inserted": True, "raised": True}
    # The job had been inserted, and the failure after it rolled back photo and job alike.
    assert example.query("SELECT id FROM pgqueue_jobs") == []
    assert example.query("SELECT id FROM shop_productphoto") == []
    # The stored upload was removed with the rolled-back row.
    assert not list(example.media_root.rglob("*.ppm"))


def test_sign_up_view_creates_the_customer_with_a_due_and_a_delayed_email(
    example: Example,
) -> None:
    status = example.run(
        """
from django.test import Client
from django.test.utils import setup_test_environment

setup_test_environment()
response = Client().post("/signup/", {"email": "alice@example.com", "name": "Alice"})
report(response.status_code)
"""
    )

    assert status == 302
    [(customer_id,)] = example.query(
        "SELECT id FROM shop_customer WHERE email = 'alice@example.com'"
    )
    jobs = example.query(
        "SELECT job_type, data, run_at - created_at FROM pgqueue_jobs ORDER BY run_at"
    )
    assert [(job_type, data) for job_type, data, _ in jobs] == [
        ("shop.send_welcome_email", {"customer_id": customer_id}),
        ("shop.send_follow_up_email", {"customer_id": customer_id}),
    ]
    assert jobs[0][2] < timedelta(seconds=1)
    assert jobs[1][2] >= timedelta(hours=23)


def test_signup_command_enqueues_two_jobs_per_customer(example: Example) -> None:
    example.manage("signup", "bob@example.com", "--count", "3")

    emails = [row[0] for row in example.query("SELECT email FROM shop_customer ORDER BY id")]
    assert emails == [
        "bob@example.com",
        "customer1@example.com",
        "customer2@example.com",
        "customer3@example.com",
    ]
    counts = example.query("SELECT job_type, count(*) FROM pgqueue_jobs GROUP BY 1 ORDER BY 1")
    assert counts == [("shop.send_follow_up_email", 4), ("shop.send_welcome_email", 4)]


JOB_LINE = re.compile(r"\+ job ([0-9a-f-]{36})\s+(\S+)")


def test_demo_enqueues_the_jobs_it_prints_and_none_of_the_rolled_back_ones(
    example: Example,
) -> None:
    output = example.manage("demo", "--no-worker").stdout

    printed = JOB_LINE.findall(output)
    rolled_back_section = output.split("2. ")[1].split("3. ")[0]
    rolled_back = {job_id for job_id, _ in JOB_LINE.findall(rolled_back_section)}
    assert len(rolled_back) == 2
    kept = {(job_id, job_type) for job_id, job_type in printed if job_id not in rolled_back}
    rows = example.query("SELECT id::text, job_type, status, run_at > now() FROM pgqueue_jobs")
    assert {(job_id, job_type) for job_id, job_type, _, _ in rows} == kept
    assert sorted(job_type for _, job_type in kept) == [
        "shop.build_album_cover",
        "shop.checkout",
        *["shop.make_thumbnail"] * 5,
        "shop.send_follow_up_email",
        "shop.send_welcome_email",
        "shop.sync_to_crm",
        "shop.sync_to_crm",
    ]
    # The album's cover waits for its thumbnails; every other job is pending.
    statuses = {job_type: status for _, job_type, status, _ in rows}
    assert statuses.pop("shop.build_album_cover") == "waiting"
    assert set(statuses.values()) == {"pending"}
    delayed = {job_type for _, job_type, _, later in rows if later}
    assert delayed == {"shop.send_follow_up_email"}
    customers = {row[0] for row in example.query("SELECT email FROM shop_customer")}
    assert customers == {"alice@example.com", "bob@example.com", "carol@example.com"}


def test_demo_runs_the_worker_and_every_job_ends_as_the_story_says(example: Example) -> None:
    output = example.manage("demo").stdout

    assert "All 11 jobs ended as expected" in output
    outcomes = example.query(
        "SELECT job_type, status, attempts FROM pgqueue_jobs ORDER BY job_type, attempts, status"
    )
    assert outcomes == [
        ("shop.build_album_cover", "completed", 1),
        ("shop.checkout", "completed", 2),
        *[("shop.make_thumbnail", "completed", 1)] * 4,
        ("shop.make_thumbnail", "failed", 1),
        ("shop.send_follow_up_email", "pending", 0),
        ("shop.send_welcome_email", "completed", 1),
        ("shop.sync_to_crm", "completed", 2),
        ("shop.sync_to_crm", "failed", 3),
    ]
    [(status, thumbnail)] = example.query(
        "SELECT thumbnail_status, thumbnail FROM shop_productphoto WHERE title = 'Red mug'"
    )
    assert status == "ready"
    assert (example.media_root / thumbnail).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    # The cover was built after the album's three thumbnails, from their results.
    [(cover,)] = example.query("SELECT cover FROM shop_album WHERE title = 'Summer'")
    assert (example.media_root / cover).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    [(result, last_thumbnail_done, cover_started)] = example.query(
        "SELECT cover.result, max(photo.completed_at), cover.started_at FROM pgqueue_jobs cover"
        " JOIN pgqueue_jobs photo ON photo.workflow_id = cover.workflow_id"
        " AND photo.id <> cover.id WHERE cover.job_type = 'shop.build_album_cover'"
        " GROUP BY cover.id"
    )
    assert result == {"cover": cover, "thumbnails": 3}
    assert cover_started >= last_thumbnail_done
    # The checkout's second attempt (the CRM was down) charged and emailed nothing again.
    [(charges, charge_id, receipt_sent, crm_recorded)] = example.query(
        "SELECT charges, charge_id, receipt_sent_at IS NOT NULL, crm_recorded_at IS NOT NULL"
        " FROM shop_order"
    )
    assert (charges, receipt_sent, crm_recorded) == (1, True, True)
    assert output.count("Your receipt for order") == 1
    assert f"charged 1 time(s) ({charge_id}), receipt sent, sale in the CRM" in output
    steps = example.query(
        "SELECT s.name, s.kind, s.attempt FROM pgqueue_job_steps s"
        " JOIN pgqueue_jobs j ON j.id = s.job_id WHERE j.job_type = 'shop.checkout' ORDER BY s.id"
    )
    assert steps == [
        ("charge", "step", 1),
        ("record-charge", "step", 1),
        ("receipt", "step", 1),
        ("settlement", "sleep", 1),
        ("crm", "step", 2),
    ]
