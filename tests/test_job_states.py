"""Job states: one enum, derived sets, and the SQL predicates rendered from them."""

import pytest
from django.db import connection

from django_pgqueue.schema import ACTIVE, FINISHED, IN_FLIGHT, RETRYABLE, JobStatus, status_in


def test_every_state_is_waiting_pending_in_flight_or_finished_exactly_once():
    groups = [(JobStatus.WAITING,), (JobStatus.PENDING,), IN_FLIGHT, FINISHED]
    assert sorted(state for group in groups for state in group) == sorted(JobStatus)
    assert set(ACTIVE) == {JobStatus.PENDING, *IN_FLIGHT}
    assert set(RETRYABLE) <= set(FINISHED)


def test_status_in_renders_the_enum_values():
    assert status_in(IN_FLIGHT) == "status IN ('claimed', 'running')"
    assert status_in(JobStatus.PENDING) == "status = 'pending'"
    assert status_in([JobStatus.FAILED]) == "status = 'failed'"


def test_status_in_refuses_what_is_not_a_state():
    with pytest.raises(ValueError):
        status_in(["pending'); DROP TABLE pgqueue_jobs; --"])
    with pytest.raises(ValueError):
        status_in([])


@pytest.mark.django_db
def test_status_in_selects_the_jobs_in_those_states(make_job):
    for state in JobStatus:
        make_job(status=state)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT status FROM pgqueue_jobs WHERE {status_in(FINISHED)}")
        found = sorted(row[0] for row in cursor.fetchall())
    assert found == sorted(state.value for state in FINISHED)
