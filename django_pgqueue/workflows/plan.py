"""The plan of a call that enqueues jobs with dependencies: each job's edges, its
first status and counter, checked before anything is written.

Pure: the jobs already in the database come in as their statuses. A job starts
``pending`` when every dependency is resolved already, ``cancelled`` when one it depends
on under ``"cancel"`` has failed or was cancelled (and so, in turn, do the jobs of the
call that depend on it that way), ``waiting`` otherwise. The rules after enqueue are
the database's (``sql/workflow_settle_v1.sql``); these are the same rules at birth.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..exceptions import InvalidJobError
from ..jobrows import JobRow
from ..schema import JobStatus, OnDependencyFailure, edge_resolved

#: The most jobs one call may enqueue with dependencies among them.
MAX_WORKFLOW_JOBS = 100_000

_FAILED = frozenset({JobStatus.FAILED.value, JobStatus.CANCELLED.value})
#: Why a job that runs only after a failure is cancelled when none came (the same words
#: as pgqueue_settle_jobs).
NOT_NEEDED = (
    "Not run: it runs only after a failure of a job it waits for, and every one of them completed."
)


@dataclass(frozen=True, slots=True)
class Edge:
    """``job`` waits for ``dependency``."""

    job: uuid.UUID
    dependency: uuid.UUID
    on_failure: str


@dataclass(slots=True)
class Step:
    """A job of the call as it starts."""

    status: str = JobStatus.PENDING.value
    unresolved: int = 0
    cancelled_by: uuid.UUID | None = None
    #: Why it starts cancelled ("" unless it does), as the database words it.
    reason: str = ""
    #: The failed or cancelled job at the root of its cancellation.
    root: uuid.UUID | None = None
    edges: list[Edge] = field(default_factory=list)


def check_size(index: int) -> None:
    """``InvalidJobError`` if the job at ``index`` of a call is past ``MAX_WORKFLOW_JOBS``."""
    if index >= MAX_WORKFLOW_JOBS:
        raise InvalidJobError(
            "specs", f"more than {MAX_WORKFLOW_JOBS:,} jobs with dependencies in one call"
        )


def internal_order(rows: Sequence[JobRow], field_of: Callable[[int], str]) -> list[int]:
    """The indexes of ``rows``, each after the rows of the call it depends on.

    Checks the indexes among ``depends_on`` (in range, not the row itself) and that they
    form no cycle; ``InvalidJobError`` naming the row otherwise.
    """
    count = len(rows)
    dependents: list[list[int]] = [[] for _ in rows]
    waiting_for = [0] * count
    for index, row in enumerate(rows):
        for position, item in enumerate(row.depends_on or ()):
            if isinstance(item.target, int):
                target = item.target
                if not 0 <= target < count or target == index:
                    what = "itself" if target == index else f"no spec (there are {count})"
                    raise InvalidJobError(
                        f"{field_of(index)}[{position}]", f"index {target} names {what}"
                    )
                dependents[target].append(index)
                waiting_for[index] += 1
    order = [index for index in range(count) if not waiting_for[index]]
    for index in order:  # grows while it is walked: Kahn's algorithm
        for dependent in dependents[index]:
            waiting_for[dependent] -= 1
            if not waiting_for[dependent]:
                order.append(dependent)
    if len(order) < count:
        in_cycle = [index for index in range(count) if waiting_for[index]]
        raise InvalidJobError(
            field_of(in_cycle[0]),
            f"the specs {in_cycle[:10]} depend on each other in a cycle",
        )
    return order


def plan_steps(
    rows: Sequence[JobRow], order: Sequence[int], existing: Mapping[uuid.UUID, str]
) -> list[Step]:
    """Each row's first status, counter and edges; ``existing``: the status of every job
    of the database the rows depend on."""
    steps = [Step() for _ in rows]
    for index in order:
        steps[index] = plan_step(rows, steps, rows[index], existing)
    return steps


def plan_step(
    rows: Sequence[JobRow],
    steps: Sequence[Step],
    row: JobRow,
    existing: Mapping[uuid.UUID, str],
) -> Step:
    """``row``'s first status, counter and edges, once the steps of the rows it depends
    on (by index into ``rows`` and ``steps``) are planned."""
    step = Step()
    only_after_failure = failure_came = False
    for item in row.depends_on or ():
        policy = item.on_failure or row.on_dependency_failure
        if isinstance(item.target, int):
            dependency_id = rows[item.target].id
            dependency = steps[item.target]
            status, root = dependency.status, dependency.root
        else:
            dependency_id, status, root = item.target, existing[item.target], None
        step.edges.append(Edge(row.id, dependency_id, policy))
        if policy == OnDependencyFailure.RUN_ONLY:
            only_after_failure = True
            failure_came = failure_came or status in _FAILED
        if edge_resolved(policy, status):
            continue
        step.unresolved += 1
        if status in _FAILED and step.cancelled_by is None:
            step.cancelled_by, step.root = dependency_id, root or dependency_id
            # The root is a job of the database, or this dependency: a job of the call
            # cancelled at birth as not needed.
            step.reason = _reason(dependency_id, step.root, existing.get(step.root, status))
    if step.cancelled_by is not None:
        step.status = JobStatus.CANCELLED.value
    elif step.unresolved:
        step.status = JobStatus.WAITING.value
    elif only_after_failure and not failure_came:
        step.status, step.reason = JobStatus.CANCELLED.value, NOT_NEEDED
    return step


def _reason(cause: uuid.UUID, root: uuid.UUID, root_status: str) -> str:
    """Why a job starts cancelled, in the words of pgqueue_cancel_dependents (the root,
    a job of the database, failed or was cancelled)."""
    if cause == root:
        return f"Cancelled: job {root}, which it depends on, is {root_status}."
    return (
        f"Cancelled: job {cause}, which it depends on, was cancelled because job {root} "
        f"is {root_status}."
    )
