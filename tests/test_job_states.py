"""Job states: one enum, derived sets, and the SQL predicates rendered from them."""

import pytest
from django.db import connection

from django_pgqueue.models import (
    ACTIVE,
    FINISHED,
    IN_FLIGHT,
    RETRYABLE,
    JobStatus,
    status_sql,
)


def test_every_state_is_pending_in_flight_or_finished_exactly_once():
    groups = [(JobStatus.PENDING,), IN_FLIGHT, FINISHED]
    assert sorted(state for group in groups for state in group) == sorted(JobStatus)
    assert set(ACTIVE) == {JobStatus.PENDING, *IN_FLIGHT}
    assert set(RETRYABLE) <= set(FINISHED)


def test_status_sql_renders_the_enum_values():
    assert status_sql(IN_FLIGHT) == "status IN ('claimed', 'running')"
    assert status_sql(JobStatus.PENDING) == "status = 'pending'"
    assert status_sql([JobStatus.FAILED]) == "status = 'failed'"


def test_status_sql_refuses_what_is_not_a_state():
    with pytest.raises(ValueError):
        status_sql(["pending'); DROP TABLE pgqueue_jobs; --"])
    with pytest.raises(ValueError):
        status_sql([])


@pytest.mark.django_db
def test_status_sql_selects_the_jobs_in_those_states(make_job):
    for state in JobStatus:
        make_job(status=state)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status FROM pgqueue_jobs WHERE {status_sql(FINISHED)}")
        found = sorted(row[0] for row in cursor.fetchall())
    assert found == sorted(state.value for state in FINISHED)
