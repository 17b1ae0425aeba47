"""Single enqueues reuse one Django cursor per connection (django_pgqueue/reused_cursor.py):
what Django's own ``connection.cursor()`` guarantees must still hold for them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest
from django.core.exceptions import SynchronousOnlyOperation
from django.core.signals import request_finished, request_started
from django.db import (
    DataError,
    OperationalError,
    close_old_connections,
    connection,
    connections,
    transaction,
)
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from django_pgqueue import enqueue, reused_cursor
from django_pgqueue.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def kept_cursor() -> Any:
    _, cursor = reused_cursor._kept.cursors.get(connection.alias, (None, None))
    return cursor


def test_enqueues_in_a_loop_share_one_cursor_and_all_commit():
    enqueue("tests.noop")
    first = kept_cursor()
    jobs = [enqueue("tests.noop", {"n": n}) for n in range(5)]

    assert first is not None and kept_cursor() is first
    assert Job.objects.count() == 6
    assert [job.data for job in jobs] == [{"n": n} for n in range(5)]


def test_execute_wrappers_see_every_enqueue_through_the_reused_cursor():
    enqueue("tests.noop")  # the cursor is kept from here on
    seen: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        enqueue("tests.noop")
        enqueue("tests.noop")

    assert len(seen) == 2 and all("INSERT INTO pgqueue_jobs" in sql for sql in seen)


def test_logged_queries_include_enqueues_made_after_a_cursor_was_kept():
    enqueue("tests.noop")
    with CaptureQueriesContext(connection) as captured:
        enqueue("tests.noop")
        enqueue("tests.noop")

    assert len(captured.captured_queries) == 2


def test_enqueue_after_the_connection_was_closed_reconnects():
    enqueue("tests.noop")
    stale = kept_cursor()
    connection.close()

    job = enqueue("tests.noop")

    assert kept_cursor() is not stale
    assert Job.objects.filter(pk=job.pk).exists()


def test_database_errors_are_still_djangos_exceptions(other_connection: psycopg.Connection[Any]):
    enqueue("tests.noop")
    with other_connection.transaction():
        other_connection.execute("LOCK TABLE pgqueue_jobs IN ACCESS EXCLUSIVE MODE")
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '100ms'")
        with pytest.raises(OperationalError, match="lock timeout"):
            enqueue("tests.noop")
    with connection.cursor() as cursor:
        cursor.execute("RESET lock_timeout")

    assert enqueue("tests.noop").pk  # the kept cursor still works after the error


def test_enqueue_in_a_broken_transaction_raises_djangos_error():
    enqueue("tests.noop")
    with transaction.atomic():
        # An error inside atomic(savepoint=False) leaves the outer block to roll back.
        with (
            pytest.raises(DataError),
            transaction.atomic(savepoint=False),
            connection.cursor() as cursor,
        ):
            cursor.execute("SELECT 1/0")
        with pytest.raises(TransactionManagementError):
            enqueue("tests.noop")


def test_enqueue_from_async_code_still_raises_synchronous_only_operation():
    enqueue("tests.noop")

    async def from_async() -> None:
        enqueue("tests.noop")

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(from_async())


def test_a_kept_cursor_is_not_used_inside_a_running_event_loop():
    # Async code gets its own DatabaseWrapper from Django; this reaches the sync one
    # from inside a loop, as sync code run by the loop's thread could.
    enqueue("tests.noop")
    sync_wrapper = connections[connection.alias]  # this thread's, not the proxy

    async def from_async() -> None:
        reused_cursor.execute_fetchone(sync_wrapper, "SELECT 1", [])

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(from_async())


def test_with_health_checks_a_killed_connection_is_replaced_at_the_next_request(
    settings: Any, other_connection: psycopg.Connection[Any]
):
    connection.close()
    connection.settings_dict["CONN_HEALTH_CHECKS"] = True
    connection.settings_dict["CONN_MAX_AGE"] = None
    try:
        request_started.send(sender=None)
        enqueue("tests.noop")
        backend_pid = connection.connection.info.backend_pid
        request_finished.send(sender=None)
        other_connection.execute("SELECT pg_terminate_backend(%s)", [backend_pid])

        request_started.send(sender=None)  # Django checks the connection's health again
        job = enqueue("tests.noop")

        assert connection.connection.info.backend_pid != backend_pid
        assert Job.objects.filter(pk=job.pk).exists()
    finally:
        connection.close()
        connection.settings_dict["CONN_HEALTH_CHECKS"] = False
        connection.settings_dict["CONN_MAX_AGE"] = 0
        close_old_connections()


def test_each_thread_enqueues_through_its_own_cursor():
    cursors: dict[str, Any] = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            for n in range(20):
                enqueue("tests.noop", {"thread": name, "n": n})
            cursors[name] = kept_cursor()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not errors
    assert len({id(cursor) for cursor in cursors.values()}) == 3
    assert Job.objects.count() == 60
