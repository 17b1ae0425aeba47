"""Fixtures shared by the whole test suite.

Every test runs against the real PostgreSQL named by ``DATABASE_URL`` (tests/settings.py);
nothing is mocked. Fixtures here are small and used by several modules; a helper only
one module needs lives in that module.

- ``make_job``: insert a job row in any state, as a worker would have left it.
- ``pgqueue_settings``: override some ``PGQUEUE`` keys for one test.
- ``clean_registry``: unregister the job types a test registers.
- ``staff``: the test client, logged in as staff with some of the app's permissions.
- ``other_connection``: a second, independent connection to the test database, to see
  what other sessions see (only committed data).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.utils import timezone

from django_pgqueue import registry
from django_pgqueue.models import Job
from django_pgqueue.sideconn import close_side_connections


@pytest.fixture(autouse=True)
def _close_side_connections() -> Iterator[None]:
    # Job.set_progress writes through a per-thread side connection; one left open would
    # outlive its test and keep the test database from being dropped at the end.
    yield
    close_side_connections()


@pytest.fixture
def make_job() -> Callable[..., Job]:
    """Insert a job with the given column values, bypassing ``enqueue``'s validation.

    ``make_job(status="running", attempts=3, heartbeat_at=...)``; ``job_type`` defaults
    to ``"tests.noop"``. The job is re-read, so database defaults are filled in; a
    ``last_error`` is written by an update, as failures are, so ``error_class`` follows.

    ``run_at`` defaults to a minute ago, so the job is due even for a claim made in the
    same transaction: a ``db`` test is one transaction, its ``now()`` fixed at its start,
    while the column default is the time of the INSERT statement.
    """

    def make(**fields: Any) -> Job:
        fields.setdefault("job_type", "tests.noop")
        fields.setdefault("run_at", timezone.now() - timedelta(minutes=1))
        last_error = fields.pop("last_error", "")
        job = Job.objects.create(**fields)
        if last_error:
            # As a worker's failure writes it: by an update, which sets error_class.
            Job.objects.filter(pk=job.pk).update(last_error=last_error)
        job.refresh_from_db()
        return job

    return make


@pytest.fixture
def pgqueue_settings(settings: Any) -> Callable[..., None]:
    """Override ``PGQUEUE`` keys for the test: ``pgqueue_settings(MAX_PAYLOAD_BYTES=100)``.

    Keys not given keep the suite's values; everything is restored after the test.
    """

    def override(**values: Any) -> None:
        settings.PGQUEUE = {**settings.PGQUEUE, **values}

    return override


@pytest.fixture
def staff(client: Any, django_user_model: Any, db: None) -> Callable[..., Any]:
    """Log the test client in as a staff user with the given permissions of the app:
    ``client = staff("view_ratelimit", "change_ratelimit")``."""

    def log_in(*codenames: str) -> Any:
        user = django_user_model.objects.create_user(username="ops", password="pw", is_staff=True)
        user.user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label="django_pgqueue", codename__in=codenames
            )
        )
        client.force_login(user)
        return client

    return log_in


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """Unregister, after the test, every job type registered during it."""
    before = set(registry.registered_job_types())
    yield
    for job_type in set(registry.registered_job_types()) - before:
        registry.unregister(job_type)


@pytest.fixture
def other_connection(transactional_db: None) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit psycopg connection to the test database, separate from Django's.

    It sees only committed rows, so it tells what other sessions (workers, the admin)
    see. Needs ``transactional_db``: rows written in a ``db`` test are never committed.
    """
    conn = connection.get_new_connection(connection.get_connection_params())
    conn.autocommit = True
    try:
        yield conn
    finally:
        conn.close()
