"""Migrations: in sync with the models, reversible, and the only readers of sql/*.sql."""

from __future__ import annotations

import io
from importlib import resources

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations import RunSQL

from django_pgqueue import enqueue

SQL_DIR = resources.files("django_pgqueue").joinpath("sql")
FUNCTIONS = [
    "claim_job_batch(text, text[], integer, text[], boolean, integer, double precision, text[])",
    "pgqueue_rate_limit_wait(text[], text[])",
    "recover_stale_jobs(interval)",
]
INDEXES = [
    "idx_jobs_claimable",
    "idx_jobs_worker",
    "idx_jobs_data",
    "idx_jobs_created",
    "idx_jobs_unique_recent",
    "idx_job_events_job",
]


def pgqueue_run_sql() -> list[tuple[str, RunSQL]]:
    """Every RunSQL operation of django_pgqueue's migrations, with its migration name."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return [
        (name, operation)
        for (app, name), migration in sorted(loader.disk_migrations.items())
        if app == "django_pgqueue"
        for operation in migration.operations
        if isinstance(operation, RunSQL)
    ]


def schema_objects() -> dict[str, bool]:
    """Which of the app's table, indexes and functions exist."""
    lookups = [(name, "to_regclass") for name in ["pgqueue_jobs", "pgqueue_job_events", *INDEXES]]
    lookups += [(signature, "to_regprocedure") for signature in FUNCTIONS]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT " + ", ".join(f"{function}(%s) IS NOT NULL" for _, function in lookups),
            [name for name, _ in lookups],
        )
        return dict(zip([name for name, _ in lookups], cursor.fetchone(), strict=True))


@pytest.mark.django_db
def test_models_and_migrations_are_in_sync():
    out = io.StringIO()
    try:
        call_command(
            "makemigrations", "django_pgqueue", "testapp", check=True, dry_run=True, stdout=out
        )
    except SystemExit:
        pytest.fail(f"models changed without a migration:\n{out.getvalue()}")


@pytest.mark.django_db(transaction=True)
def test_migrating_to_zero_and_back_removes_and_restores_the_schema():
    assert all(schema_objects().values())

    call_command("migrate", "django_pgqueue", "zero", verbosity=0)
    try:
        assert not any(schema_objects().values()), schema_objects()
    finally:
        call_command("migrate", "django_pgqueue", verbosity=0)

    assert all(schema_objects().values()), schema_objects()
    enqueue("tests.noop")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM claim_job_batch('w', NULL)")
        assert cursor.fetchone() == (1,)


def jobs_table_options() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = 'pgqueue_jobs'::regclass")
        (options,) = cursor.fetchone()
    return dict(option.split("=", 1) for option in options or [])


@pytest.mark.django_db(transaction=True)
def test_the_jobs_table_is_vacuumed_after_one_percent_of_dead_rows_and_back_to_defaults():
    autovacuum = {
        "autovacuum_vacuum_scale_factor": "0.01",
        "autovacuum_vacuum_threshold": "1000",
        "autovacuum_analyze_scale_factor": "0.02",
        "autovacuum_analyze_threshold": "1000",
    }
    assert jobs_table_options() == {**autovacuum, "fillfactor": "70"}

    call_command("migrate", "django_pgqueue", "0006", verbosity=0)
    try:
        assert jobs_table_options() == {}
    finally:
        call_command("migrate", "django_pgqueue", verbosity=0)

    assert jobs_table_options() == {**autovacuum, "fillfactor": "70"}


@pytest.mark.django_db(transaction=True)
def test_job_rows_leave_room_on_their_page_for_their_next_versions():
    assert jobs_table_options()["fillfactor"] == "70"

    call_command("migrate", "django_pgqueue", "0042", verbosity=0)
    try:
        assert "fillfactor" not in jobs_table_options()
    finally:
        call_command("migrate", "django_pgqueue", verbosity=0)

    assert jobs_table_options()["fillfactor"] == "70"


def test_every_sql_file_is_installed_by_exactly_one_migration():
    operations = pgqueue_run_sql()
    files = sorted(path for path in SQL_DIR.iterdir() if path.name.endswith(".sql"))
    assert files, "django_pgqueue/sql/ has no .sql files"

    readers = {
        path.name: {name for name, operation in operations if operation.sql == path.read_text()}
        for path in files
    }

    assert {name: len(migrations) for name, migrations in readers.items()} == {
        path.name: 1 for path in files
    }, readers


def test_every_run_sql_operation_can_be_reversed():
    operations = pgqueue_run_sql()
    assert operations

    assert [name for name, operation in operations if not operation.reversible] == []
