"""Durable steps: ``job.step(name, func, ...)`` runs ``func`` once per job and name.

The first attempt that reaches a step calls the function and writes its JSON result as
a checkpoint (``pgqueue_job_steps``); every later attempt of the job returns the stored
result without calling it. A step that raised stores nothing and runs again next time.

Where the checkpoint is written decides what "once" means:

- A plain step writes it right after the function returns, committed on its own: on the
  caller's connection in autocommit, or through the side connection (``sideconn``)
  when the handler is inside a transaction, so that a later failure that rolls the
  handler back keeps it. A worker killed between the function's return and that commit
  runs the step again: at least once.
- An atomic step (``atomic=True``) runs the function and writes the checkpoint in one
  transaction on the jobs database: the function's writes there and the checkpoint
  commit together, or neither does. Exactly once, for writes to the jobs database.

A checkpoint is written only while this attempt holds the job (its worker and attempt
number, as ``set_progress()`` checks): a job recovered and handed to another worker
meanwhile gets no checkpoint from the one that lost it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections, transaction

from . import conf, validation
from .exceptions import StepError
from .schema import IN_FLIGHT, status_in
from .sideconn import execute_autocommit

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .models import Job

T = TypeVar("T")

_CHECKPOINTS = "SELECT name, result::text FROM pgqueue_job_steps WHERE job_id = %s"

# Only while the same attempt holds the job: a worker that lost it writes nothing.
_CHECKPOINT = f"""
INSERT INTO pgqueue_job_steps (job_id, name, attempt, result, started_at, completed_at)
SELECT id, %s, attempts, %s::jsonb, to_timestamp(%s), now()
  FROM pgqueue_jobs
 WHERE id = %s
   AND {status_in(IN_FLIGHT)}
   AND worker_id IS NOT DISTINCT FROM %s
   AND attempts = %s
"""


def run_step(
    job: Job, name: str, func: Callable[..., Any], args: Any, kwargs: Any, atomic: bool
) -> Any:
    """``job.step()``: the stored result of step ``name``, or ``func(*args, **kwargs)``'s
    once its checkpoint is written."""
    name = validation.step_name(name)
    if job.status not in IN_FLIGHT:
        raise StepError(
            f"job {job.id} is {job.status}: steps run inside the handler of a running job"
        )
    seen = job.__dict__.setdefault("_steps_seen", set())
    if name in seen:
        raise StepError(
            f"step {name!r} was already run in this attempt of job {job.id}: give each "
            "step of a job its own name"
        )
    seen.add(name)
    alias = conf.jobs_database(job._state.db)
    stored = _checkpoints(job, alias)
    if name in stored:
        return json.loads(stored[name])
    started = time.time()
    if atomic:
        with transaction.atomic(using=alias):
            text = _result_json(func(*args, **kwargs))
            if job._store_steps and not _write(connections[alias], job, name, text, started):
                raise StepError(
                    f"job {job.id} is no longer held by this attempt (it was recovered or "
                    f"finished meanwhile): step {name!r} and its writes were rolled back"
                )
    else:
        text = _result_json(func(*args, **kwargs))
        if job._store_steps:
            _write_now(alias, job, name, text, started)
    stored[name] = text
    return json.loads(text)


def _checkpoints(job: Job, alias: str) -> dict[str, str]:
    """The job's stored results by step name, read once per attempt."""
    cached: dict[str, str] | None = job.__dict__.get("_steps_stored")
    if cached is None:
        cached = {}
        if job._store_steps:
            with connections[alias].cursor() as cursor:
                cursor.execute(_CHECKPOINTS, [job.id])
                cached = dict(cursor.fetchall())
        job.__dict__["_steps_stored"] = cached
    return cached


def _result_json(value: Any) -> str:
    return validation.json_value(value, "result", max_bytes=conf.get_settings().MAX_PAYLOAD_BYTES)


def _params(job: Job, name: str, text: str, started: float) -> list[Any]:
    return [name, text, started, job.id, job.worker_id, job.attempts]


def _write(connection: BaseDatabaseWrapper, job: Job, name: str, text: str, started: float) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_CHECKPOINT, _params(job, name, text, started))
        return bool(cursor.rowcount == 1)


def _write_now(alias: str, job: Job, name: str, text: str, started: float) -> None:
    """Commit the checkpoint of a plain step now, whatever transaction the caller is in."""
    connection = connections[alias]
    if not connection.in_atomic_block:
        _write(connection, job, name, text, started)
        return
    params = tuple(_params(job, name, text, started))
    if execute_autocommit(alias, _CHECKPOINT, params):
        return
    # Not held as the side connection sees the database: either lost (nothing to
    # write), or a job that exists only in the caller's transaction, a test's: the
    # test kit writes it once the handler's savepoint is over (write_deferred()).
    job.__dict__.setdefault("_steps_deferred", []).append(params)


def write_deferred(job: Job, alias: str) -> None:
    """Write the checkpoints of plain steps that the side connection could not, on the
    caller's connection: for the test kit, whose jobs live in the test's transaction,
    after the handler's own savepoint has ended (kept, or rolled back)."""
    with connections[alias].cursor() as cursor:
        for params in job.__dict__.pop("_steps_deferred", ()):
            cursor.execute(_CHECKPOINT, list(params))
