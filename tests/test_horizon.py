"""Who holds back vacuum: a session holding the jobs database's xmin horizon is named
by the workers' warning, ``pgqueue_status`` and the metrics once past
``PGQUEUE["HORIZON_WARNING_AFTER"]``."""

from __future__ import annotations

import json
import logging
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue.horizon import HorizonWatch, oldest_holder
from tests.workers import wait_for, worker_thread

pytestmark = pytest.mark.django_db(transaction=True)

SOON = {"HORIZON_WARNING_AFTER": 0.2}


@pytest.fixture
def report(other_connection):
    """A REPEATABLE READ report left open: its snapshot holds the horizon."""
    other_connection.autocommit = False
    other_connection.execute("SET application_name = 'quarterly-report'")
    other_connection.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    other_connection.execute("SELECT count(*) FROM pgqueue_jobs")
    yield other_connection.info.backend_pid
    other_connection.rollback()


def status(*args: str) -> str:
    out = StringIO()
    call_command("pgqueue_status", *args, stdout=out)
    return out.getvalue()


def test_a_report_holding_a_snapshot_is_found_with_its_pid_state_and_age(report):
    time.sleep(0.3)
    holder = oldest_holder()
    assert holder is not None
    assert (holder.kind, holder.pid, holder.state) == ("backend", report, "idle in transaction")
    assert holder.application == "quarterly-report"
    assert holder.age_seconds is not None and holder.age_seconds >= 0.3
    assert "SELECT count(*) FROM pgqueue_jobs" in holder.query
    with override_settings(PGQUEUE=SOON):
        assert holder.past_threshold()
    assert not holder.past_threshold()  # the default: five minutes


def test_a_read_committed_session_that_wrote_holds_it_by_its_transaction_id(other_connection):
    other_connection.autocommit = False
    other_connection.execute("BEGIN")
    other_connection.execute("CREATE TEMPORARY TABLE scratch (x int)")  # takes an xid
    try:
        holder = oldest_holder()
        assert holder is not None and holder.pid == other_connection.info.backend_pid
    finally:
        other_connection.rollback()


def test_nothing_is_reported_without_a_holder():
    assert oldest_holder() is None
    with override_settings(PGQUEUE=SOON):
        assert HorizonWatch().check() is None


def test_the_warning_names_the_holder_once(report, caplog):
    time.sleep(0.3)
    watch = HorizonWatch()
    with override_settings(PGQUEUE=SOON), caplog.at_level(logging.WARNING):
        assert watch.check() is not None
        assert watch.check() is not None
    warnings = [r.getMessage() for r in caplog.records if "xmin horizon" in r.getMessage()]
    assert len(warnings) == 1
    assert f"backend pid {report} of " in warnings[0]
    assert "'quarterly-report'" in warnings[0] and "idle in transaction" in warnings[0]
    assert "idle_in_transaction_session_timeout" in warnings[0]


def test_no_warning_when_the_setting_is_none(report, caplog):
    with (
        override_settings(PGQUEUE={"HORIZON_WARNING_AFTER": None}),
        caplog.at_level(logging.WARNING),
    ):
        assert HorizonWatch().check() is None
    assert not [r for r in caplog.records if "xmin horizon" in r.getMessage()]


def test_a_worker_warns_from_its_heartbeat(report, caplog):
    settings = {**SOON, "HEARTBEAT_INTERVAL": 0.1, "RECOVER_INTERVAL": 0.1}
    with (
        override_settings(PGQUEUE=settings),
        caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"),
        worker_thread(concurrency=1, poll_interval=0.1),
    ):
        wait_for(lambda: any("xmin horizon" in r.getMessage() for r in caplog.records))
    assert any(f"pid {report} " in r.getMessage() for r in caplog.records)


def test_status_names_the_holder_in_json_and_tables(report):
    time.sleep(0.3)
    with override_settings(PGQUEUE=SOON):
        shown = json.loads(status("--json"))["horizon"]
        table = status()
    assert (shown["pid"], shown["state"], shown["past_threshold"]) == (
        report,
        "idle in transaction",
        True,
    )
    assert "Vacuum is held back" in table and f"backend pid {report} " in table
    assert "Vacuum is held back" not in status()  # not past the default threshold


def test_the_metric_gives_the_holders_age(report, client):
    time.sleep(0.3)
    text = client.get("/metrics/").content.decode()
    ages = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "pgqueue_xmin_horizon_age_seconds"
    ]
    assert len(ages) == 1 and ages[0] >= 0.3
