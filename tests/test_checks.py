"""System checks: ``manage.py check`` explains a misconfigured PGQUEUE or database."""

from __future__ import annotations

import contextlib

import pytest
from django.conf import settings
from django.core.checks import ERROR, WARNING, run_checks
from django.db import connections


def pgqueue_messages(**kwargs):
    # Without `databases`, Django 6.1+ runs model checks against every alias, which
    # would connect to the sqlite alias below; no alias reproduces the older default.
    kwargs.setdefault("databases", [])
    return [message for message in run_checks(**kwargs) if message.id.startswith("django_pgqueue.")]


@pytest.fixture
def sqlite_alias():
    """A second database alias that is not PostgreSQL; never connected to."""
    alias = "legacy"
    # DATABASES is shared with the connection handler; overriding it with
    # override_settings is unsupported, so the alias is added and removed in place.
    settings.DATABASES[alias] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    connections.configure_settings(settings.DATABASES)
    try:
        yield alias
    finally:
        with contextlib.suppress(AttributeError):
            del connections[alias]
        del settings.DATABASES[alias]


@pytest.mark.django_db
def test_suite_configuration_passes_every_check():
    assert pgqueue_messages(databases=["default"]) == []


@pytest.mark.django_db
def test_the_apps_models_need_no_other_app_than_the_suites(settings):
    # Django 6 refuses ArrayField without django.contrib.postgres in INSTALLED_APPS; the
    # rollups' integer arrays must not need it.
    assert "django.contrib.postgres" not in settings.INSTALLED_APPS
    errors = [
        message
        for message in run_checks(databases=["default"])
        if message.level >= ERROR and str(message.obj).startswith("django_pgqueue.")
    ]
    assert errors == []


def test_unknown_pgqueue_key_is_error_e001(pgqueue_settings):
    pgqueue_settings(MAX_RETRIES=5)

    (error,) = pgqueue_messages()

    assert error.id == "django_pgqueue.E001"
    assert "MAX_RETRIES" in error.msg


def test_invalid_pgqueue_value_is_error_e001(pgqueue_settings):
    pgqueue_settings(HEARTBEAT_INTERVAL=60, STALE_AFTER=30)

    (error,) = pgqueue_messages()

    assert error.id == "django_pgqueue.E001"
    assert "HEARTBEAT_INTERVAL" in error.msg


def test_database_alias_missing_from_databases_is_error_e002(pgqueue_settings):
    pgqueue_settings(DATABASE="queue")

    (error,) = pgqueue_messages()

    assert error.id == "django_pgqueue.E002"
    assert "'queue'" in error.msg
    assert "'default'" in error.hint


def test_non_postgresql_database_is_error_e003(pgqueue_settings, sqlite_alias):
    pgqueue_settings(DATABASE=sqlite_alias)

    (error,) = pgqueue_messages()

    assert error.id == "django_pgqueue.E003"
    assert "'sqlite'" in error.msg
    assert "django.db.backends.postgresql" in error.hint


def test_database_checks_skip_a_non_postgresql_database(pgqueue_settings, sqlite_alias):
    pgqueue_settings(DATABASE=sqlite_alias)

    assert pgqueue_messages(tags=["database"], databases=[sqlite_alias]) == []


@pytest.mark.django_db
def test_server_version_check_passes_on_the_real_server():
    assert connections["default"].pg_version >= 140000
    assert pgqueue_messages(tags=["database"], databases=["default"]) == []


@pytest.mark.django_db
def test_server_older_than_14_is_error_e004(monkeypatch):
    # The only simulated input in the suite: no supported Django connects to such a
    # server (Django 5.2 and 6.0 need 14, 6.1 needs 15), so the version the check reads
    # is replaced to exercise the message.
    monkeypatch.setattr(connections["default"], "pg_version", 130023)

    (error,) = pgqueue_messages(tags=["database"], databases=["default"])

    assert error.id == "django_pgqueue.E004"
    assert "PostgreSQL 14 or newer" in error.msg and "13.23" in error.msg


class EverythingToDefault:
    """A router that claims every model for ``default``, as project routers often do."""

    def db_for_read(self, model, **hints):
        return "default"

    def db_for_write(self, model, **hints):
        return "default"


class ReadsToReplica:
    """A read-replica router: reads of every model go to ``replica``."""

    def db_for_read(self, model, **hints):
        return "replica"


JOBS_ROUTER = "django_pgqueue.routers.JobsRouter"


def test_jobs_outside_default_without_a_router_is_warning_w005(pgqueue_settings):
    pgqueue_settings(DATABASE="jobs")

    (warning,) = pgqueue_messages()

    assert warning.id == "django_pgqueue.W005"
    assert warning.level == WARNING
    assert "PGQUEUE['DATABASE'] is 'jobs'" in warning.msg
    assert "django_pgqueue.Job to 'default'" in warning.msg
    assert JOBS_ROUTER in warning.hint


def test_jobs_router_silences_w005(pgqueue_settings, settings):
    pgqueue_settings(DATABASE="jobs")
    settings.DATABASE_ROUTERS = [JOBS_ROUTER]

    assert pgqueue_messages() == []


def test_a_router_that_claims_the_jobs_first_is_warning_w005(pgqueue_settings, settings):
    pgqueue_settings(DATABASE="jobs")
    settings.DATABASE_ROUTERS = [f"{__name__}.EverythingToDefault", JOBS_ROUTER]

    (warning,) = pgqueue_messages()

    assert warning.id == "django_pgqueue.W005"


def test_jobs_in_default_are_not_checked_against_the_router(settings):
    settings.DATABASE_ROUTERS = [f"{__name__}.ReadsToReplica"]

    assert pgqueue_messages() == []
