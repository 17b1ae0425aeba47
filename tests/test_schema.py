"""The job states are stated once (``django_pgqueue.schema``): the SQL the database runs
(partial indexes, constraints, the installed functions) agrees with the enum's sets."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from django_pgqueue.due import CLAIM_INDEX_FIELDS, CLAIM_ORDER
from django_pgqueue.schema import (
    ACTIVE,
    BLOCKED,
    CANCELLABLE,
    CLAIMABLE,
    FINISHED,
    IN_FLIGHT,
    RETRYABLE,
    JobStatus,
    OnDependencyFailure,
    edge_resolved,
    literal,
    status_in,
    values,
)

pytestmark = pytest.mark.django_db

# status = 'x' or status IN ('x', 'y'), with or without a table prefix.
_PREDICATE = re.compile(
    r"(?:\w+\.)?status\)?(?:::text)?\s*(?:=\s*'(\w+)'|IN\s*\(([^)]*)\)|=\s*ANY\s*\(\(?ARRAY\[([^\]]*)\])"
)


def states_named(sql: str) -> list[set[str]]:
    """Each set of states a ``status = ...`` or ``status IN (...)`` predicate names."""
    found = []
    for single, listed, array in _PREDICATE.findall(sql):
        text = single or listed or array
        found.append(set(re.findall(r"'(\w+)'", text)) if not single else {single})
    return found


def index_predicate(name: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", [name])
        (definition,) = cursor.fetchone()
    (states,) = states_named(definition.partition(" WHERE ")[2])
    return states


def function_source(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", [name])
        (source,) = cursor.fetchone()
    return source


@pytest.mark.parametrize(
    ("index", "states"),
    [
        ("idx_jobs_claimable", CLAIMABLE),
        ("idx_jobs_worker", IN_FLIGHT),
        ("idx_jobs_finished", FINISHED),
        ("idx_jobs_finished_queue", FINISHED),
        ("idx_jobs_finished_job_type", FINISHED),
        ("idx_jobs_waiting", BLOCKED),
        ("pgqueue_jobs_unique_key_active", ACTIVE),
    ],
)
def test_each_partial_index_covers_its_state_set(index, states):
    assert index_predicate(index) == set(values(states))


def test_workflow_steps_are_settled_when_they_finish_or_are_retried():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger "
            "WHERE tgname = 'pgqueue_jobs_note_settlement'"
        )
        (definition,) = cursor.fetchone()

    finished, retried_from, retried_to = states_named(definition.partition(" WHEN ")[2])
    assert finished == set(values(FINISHED))
    assert retried_from == set(values(RETRYABLE))
    assert retried_to == set(values(CANCELLABLE))


@pytest.mark.parametrize("on_failure", OnDependencyFailure.values)
def test_the_database_resolves_dependencies_by_the_same_rule(on_failure):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT status, pgqueue_edge_resolved(%s, status) FROM unnest(%s::text[]) AS status",
            [on_failure, JobStatus.values],
        )
        in_sql = dict(cursor.fetchall())

    assert in_sql == {status: edge_resolved(on_failure, status) for status in JobStatus.values}
    assert in_sql[JobStatus.COMPLETED] and not in_sql[JobStatus.RUNNING]


def test_the_status_constraint_allows_exactly_the_states():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conname = 'pgqueue_jobs_status_valid'"
        )
        (definition,) = cursor.fetchone()

    (states,) = states_named(definition)
    assert states == set(JobStatus.values)


def test_the_claim_takes_claimable_jobs_and_counts_jobs_in_flight():
    named = states_named(function_source("claim_job_batch"))

    assert set(values(CLAIMABLE)) in named
    assert all(states in (set(values(CLAIMABLE)), set(values(IN_FLIGHT))) for states in named)


def test_recovery_reads_jobs_in_flight_only():
    named = states_named(function_source("recover_stale_jobs"))

    assert set(values(IN_FLIGHT)) in named
    assert all(states <= set(values(IN_FLIGHT)) for states in named)


def test_sets_partition_the_states():
    sets = [BLOCKED, CLAIMABLE, IN_FLIGHT, FINISHED]
    assert set(JobStatus) == frozenset().union(*sets)
    assert sum(map(len, sets)) == len(JobStatus)
    assert ACTIVE == CLAIMABLE | IN_FLIGHT


def test_sql_text_is_built_from_the_enum():
    assert status_in(IN_FLIGHT, "jobs.status") == "jobs.status IN ('claimed', 'running')"
    assert literal(JobStatus.PENDING) == "'pending'"
    assert values(FINISHED) == ["completed", "failed", "cancelled"]


# -- Claim order (django_pgqueue.due.CLAIM_ORDER) ------------------------------------------


def test_the_claim_orders_every_walk_and_ranking_by_the_claim_order():
    orders = re.findall(r"ORDER BY ([^)\n]*priority[^)\n]*)", function_source("claim_job_batch"))

    assert orders
    assert {re.sub(r"\b\w+\.", "", order).strip() for order in orders} == {CLAIM_ORDER}


def test_the_claimable_index_leads_with_the_claim_order():
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_jobs_claimable'")
        (definition,) = cursor.fetchone()
    columns = definition.partition("(")[2].partition(")")[0]

    assert columns.startswith(CLAIM_ORDER + ", ")
    assert [name.lstrip("-") for name in CLAIM_INDEX_FIELDS] == [
        column.split()[0] for column in CLAIM_ORDER.split(", ")
    ]


def test_the_claim_is_never_compiled_by_jit():
    # Its enable_sort = off makes every sort cost 10^10, above jit_above_cost: with JIT on
    # (the default where PostgreSQL has LLVM) each claim under limits was compiled first,
    # taking hundreds of milliseconds.
    with connection.cursor() as cursor:
        cursor.execute("SELECT proconfig FROM pg_proc WHERE proname = 'claim_job_batch'")
        (config,) = cursor.fetchone()

    assert "jit=off" in config and "enable_sort=off" in config
