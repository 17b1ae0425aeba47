"""The statements that record outcomes: the worker's batches (``FINISH`` and
``FINISH_COMPLETED``, queries.py) and an atomic handler's own completion, recorded in
the handler's transaction so that its work and its completion commit together."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from .. import conf
from ..schema import JobStatus
from . import queries
from .adapters import Float8Array, TimestamptzArray, UUIDArray

if TYPE_CHECKING:
    from .execution import Outcome

_COMPLETED = JobStatus.COMPLETED.value


def finish_statement(
    outcomes: list[Outcome], worker_id: str, *, in_transaction: bool = False
) -> tuple[str, list[Any]]:
    """The statement recording ``outcomes``, and its parameters: ``FINISH_COMPLETED``
    when every job completed with no result and no note, else ``FINISH``. In a handler's
    transaction (one outcome), those that take the statement's moment rather than the
    transaction's: ``COMPLETE_IN_TRANSACTION`` (which returns whether the attempt held
    the job) and ``FINISH_IN_TRANSACTION`` (which returns its id if so)."""
    if all(o.status == _COMPLETED and o.result is None and o.error is None for o in outcomes):
        if in_transaction:
            (outcome,) = outcomes
            ago = math.nan if outcome.started is None else time.monotonic() - outcome.started
            params = [outcome.job_id, outcome.claimed_at, worker_id, ago]
            return queries.COMPLETE_IN_TRANSACTION, params
        return queries.FINISH_COMPLETED, finish_completed_params(outcomes, worker_id)
    statement = queries.FINISH_IN_TRANSACTION if in_transaction else queries.FINISH
    return statement, finish_params(outcomes, worker_id)


def finish_completed_params(outcomes: list[Outcome], worker_id: str) -> list[Any]:
    now = time.monotonic()
    return [
        UUIDArray([o.job_id for o in outcomes]),
        TimestamptzArray([o.claimed_at for o in outcomes]),
        Float8Array([math.nan if o.started is None else now - o.started for o in outcomes]),
        worker_id,
    ]


def seconds_ago(started: float | None, now: float) -> float | None:
    """An outcome's start as the seconds before ``now`` (both ``time.monotonic()``), which
    the statement subtracts from the database's clock; None for none."""
    return None if started is None else now - started


def finish_params(outcomes: list[Outcome], worker_id: str) -> list[Any]:
    """The parameters of ``queries.FINISH`` recording ``outcomes`` of ``worker_id``'s jobs
    (the worker's id twice: it guards the update and names the worker of the attempts).
    Tracebacks are left out when ``PGQUEUE["STORE_TRACEBACKS"]`` is off."""
    store_tracebacks = conf.get_settings().STORE_TRACEBACKS
    now = time.monotonic()
    return [
        [o.job_id for o in outcomes],
        TimestamptzArray([o.claimed_at for o in outcomes]),
        [o.status for o in outcomes],
        # float() always: psycopg refuses a list mixing ints and floats.
        [float(o.delay) for o in outcomes],
        [o.refund for o in outcomes],
        [o.error for o in outcomes],
        [o.traceback if store_tracebacks else None for o in outcomes],
        [o.result for o in outcomes],
        [math.nan if o.unstarted else seconds_ago(o.started, now) for o in outcomes],
        [o.snoozed for o in outcomes],
        [o.suspended for o in outcomes],
        worker_id,
        worker_id,
    ]
