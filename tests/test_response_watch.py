"""The response watch: a worker's statement left unanswered past its timeout has its
connection cut, which fails the call as a lost connection would; one answered in time
is left alone (tests/faults/test_half_open.py has whole workers)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from django_pgqueue.response_watch import WATCH, guard
from tests.faults.proxy import SilentProxy
from tests.workers import database_url_for_tests

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def through_proxy():
    """A connection to the test database through a proxy that can go silent."""
    proxy = SilentProxy(database_url_for_tests()).start()
    conn = psycopg.connect(proxy.url(), autocommit=True)
    yield conn, proxy
    proxy.heal()
    conn.close()
    proxy.stop()


def test_an_unanswered_statement_fails_once_its_timeout_is_past(through_proxy):
    conn, proxy = through_proxy
    cut_before = WATCH.cut
    proxy.partition()
    started = time.monotonic()

    with pytest.raises(psycopg.OperationalError), guard(conn, 0.5, "a test's statement"):
        conn.execute("SELECT 1")

    assert 0.5 <= time.monotonic() - started < 5
    assert WATCH.cut == cut_before + 1
    assert conn.broken or conn.closed


def test_an_answered_statement_is_left_alone(through_proxy):
    conn, _ = through_proxy
    cut_before = WATCH.cut

    with guard(conn, 0.5, "a test's statement"):
        conn.execute("SELECT pg_sleep(0.1)")
    time.sleep(1)  # past the timeout: the guard is gone with its block

    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert WATCH.cut == cut_before


def test_a_slow_answer_within_the_timeout_is_waited_for(through_proxy):
    conn, _ = through_proxy

    with guard(conn, 3, "a test's statement"):
        assert conn.execute("SELECT 1 FROM pg_sleep(1)").fetchone() == (1,)


def test_a_timeout_of_zero_waits_as_long_as_the_network_does(through_proxy):
    conn, proxy = through_proxy
    cut_before = WATCH.cut
    proxy.partition()
    threading.Timer(1.0, proxy.heal).start()

    with guard(conn, 0, "a test's statement"):
        assert conn.execute("SELECT 1").fetchone() == (1,)

    assert WATCH.cut == cut_before
