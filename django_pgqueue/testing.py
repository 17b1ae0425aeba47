"""Assertions for your project's tests: which jobs your code enqueued; and
``run_job()``, one run of a handler as a worker makes it.

```python
from django_pgqueue.testing import assert_enqueued, capture_jobs, refute_enqueued

def test_signing_up_sends_the_welcome_email(client):
    with capture_jobs() as jobs:
        client.post("/signup/", {"email": "ada@example.com"})

    assert [job.job_type for job in jobs] == ["emails.welcome"]
    assert_enqueued(job_type="emails.welcome", data={"email": "ada@example.com"})
    refute_enqueued(job_type="emails.reminder")
```

They read the jobs database as the test sees it, inside ``TestCase``'s transaction or
with pytest-django's ``db`` fixture alike, and only in a test run (Django's test
environment set up): a clear error otherwise, never a query against a real queue.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from asgiref.sync import async_to_sync
from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.db.models import QuerySet
from django.utils import timezone

from . import conf, jobrows, registry, signals, steps, validation
from .exceptions import InvalidJobError, JobFailedError
from .models import Job
from .registry import JobDefinition
from .schema import JobStatus, literal
from .worker import queries
from .worker.async_slots import aexecute
from .worker.execution import LOOP, PENDING, THREAD, Outcome, RunningJob, execute
from .worker.finishing import finish_params

__all__ = [
    "JobRun",
    "assert_enqueued",
    "capture_jobs",
    "drain",
    "enqueued_jobs",
    "immediate",
    "refute_enqueued",
    "run_job",
]

#: The ``worker_id`` a job run by ``run_job()`` holds while its handler runs.
RUN_JOB_WORKER_ID = "django_pgqueue.testing.run_job"


def enqueued_jobs(
    *,
    job_type: str | None = None,
    data: dict[str, Any] | None = None,
    queue: str | None = None,
    using: str | None = None,
) -> list[Job]:
    """The pending jobs (due or delayed) that match, oldest first.

    Args:
        job_type: The job type, exactly.
        data: Key-value pairs the payload contains (``data @> ...``: nested objects
            match by containment, other keys of the payload are ignored).
        queue: The queue, exactly.
        using: The jobs database alias (default: the one ``JobsRouter`` picks).
    """
    _require_test_environment()
    if data is not None and not isinstance(data, dict):
        raise TypeError(f"data must be a dict of what the payload contains, got {data!r}")
    jobs = _pending(using)
    if job_type is not None:
        jobs = jobs.filter(job_type=job_type)
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    if data is not None:
        jobs = jobs.filter(data__contains=data)
    return list(jobs)


def assert_enqueued(
    *,
    job_type: str | None = None,
    data: dict[str, Any] | None = None,
    queue: str | None = None,
    count: int | None = None,
    using: str | None = None,
) -> list[Job]:
    """Fail unless pending jobs match (exactly ``count`` of them, when given); return them.

    The failure lists the pending jobs there are, so that a near miss (another queue, a
    key spelled differently) shows at once. Arguments: as :func:`enqueued_jobs`.
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise TypeError(f"count must be an integer of 0 or more, got {count!r}")
    found = enqueued_jobs(job_type=job_type, data=data, queue=queue, using=using)
    if (count is None and not found) or (count is not None and len(found) != count):
        wanted = "a job" if count is None else f"{count} job(s)"
        raise AssertionError(
            f"expected {wanted} enqueued matching {_criteria(job_type, data, queue)}, "
            f"found {len(found)}.\n{_pending_list(using)}"
        )
    return found


def refute_enqueued(
    *,
    job_type: str | None = None,
    data: dict[str, Any] | None = None,
    queue: str | None = None,
    using: str | None = None,
) -> None:
    """Fail if any pending job matches. Arguments: as :func:`enqueued_jobs`."""
    found = enqueued_jobs(job_type=job_type, data=data, queue=queue, using=using)
    if found:
        raise AssertionError(
            f"expected no job enqueued matching {_criteria(job_type, data, queue)}, "
            f"found {len(found)}.\n{_pending_list(using)}"
        )


@contextmanager
def capture_jobs() -> Iterator[list[Job]]:
    """Collect the jobs enqueued inside the block, in the order they were inserted.

    Every job ``enqueue()``, ``enqueue_many()`` or the Tasks backend inserts is added to
    the list the block receives (jobs only returned because a unique key held them are
    not: nothing was inserted). Whether the transaction then commits does not matter:
    the list says what the code asked for.
    """
    _require_test_environment()
    captured: list[Job] = []

    def collect(sender: Any, job: Job, **kwargs: Any) -> None:
        captured.append(job)

    signals.job_enqueued.connect(collect, weak=False)
    try:
        yield captured
    finally:
        signals.job_enqueued.disconnect(collect)


@dataclass(frozen=True)
class JobRun:
    """What one run of a handler decided (``run_job()``). Nothing of it is written to
    the job's row.

    Attributes:
        status: ``"completed"``; ``"pending"`` when a worker would retry the job (or the
            handler snoozed it), after ``retry_in`` seconds; ``"failed"`` when no attempt
            is left (or on ``FailJob``); ``"cancelled"``.
        result: The handler's return value as a worker stores it (through JSON, so a
            tuple comes back a list); ``None`` unless completed.
        error: ``"ExceptionClass: message"`` of the failure (or the note on a return
            value that cannot be stored); ``""`` for none.
        traceback: The failure's formatted traceback; ``""`` for none.
        retry_in: Seconds until the retry or the end of the snooze, when ``"pending"``;
            else ``None``.
        snoozed: Whether the handler snoozed the job.
        suspended: Whether the handler slept or began waiting for an event
            (``job.sleep()``, ``job.wait_for_event()``); ``retry_in`` is then how long.
        job: The job as the handler saw it: its ``attempts`` counts this run.
    """

    status: str
    result: Any
    error: str
    traceback: str
    retry_in: float | None
    snoozed: bool
    job: Job
    suspended: bool = False


def run_job(
    job: Job | JobDefinition | str,
    data: dict[str, Any] | None = None,
    *,
    attempt: int | None = None,
    using: str | None = None,
) -> JobRun:
    """Run one handler once, in the test's thread, as a worker would, and say what it
    decided.

    ```python
    outcome = run_job("emails.welcome", {"user_id": user.pk})
    assert outcome.status == "completed"

    job = enqueued_jobs(job_type="billing.charge")[0]
    assert run_job(job, attempt=3).status == "failed"  # its last attempt
    ```

    The handler runs in its transaction (``atomic``, the default: a savepoint inside
    ``TestCase``'s transaction), with the job's signals sent; an ``async def`` handler
    runs on an event loop of its own, under its timeout. What it decided is returned,
    not written: the job's row stays as it was, and no retry is scheduled. A sync
    handler's timeout is not enforced (a worker interrupts it from another thread).

    Args:
        job: A job read from the database (``enqueued_jobs()``, ``capture_jobs()``,
            ``enqueue()``'s return), a ``@job`` handler, or a job type.
        data: The payload, for a handler or a job type (validated as ``enqueue()``
            does); not with a job, which has its own.
        attempt: Which attempt this run is, 1 or more (default: the job's next one, 1
            for a new job). The last, ``max_attempts``, fails the job on an error.
        using: The jobs database alias, for a handler or a job type.

    Raises:
        UnknownJobTypeError: No handler is registered for the job type.
        InvalidJobError: A bad ``data`` or ``attempt``, or ``data`` given with a job.
    """
    _require_test_environment()
    running = _running_job(job, data, attempt, using)
    return _job_run(running, _execute(running, running.job._state.db or conf.jobs_database(using)))


def drain(
    *,
    queues: str | Sequence[str] | None = None,
    job_types: str | Sequence[str] | None = None,
    include_delayed: bool = False,
    using: str | None = None,
    max_runs: int = 1000,
) -> list[JobRun]:
    """Run every due job, and the jobs they enqueue or release, in the test's thread,
    until none is due; return the runs in the order they ran.

    ```python
    def test_checkout_charges_then_emails(db):
        checkout(order)
        runs = drain()
        assert [run.job.job_type for run in runs] == ["billing.charge", "emails.receipt"]
        assert all(run.status == "completed" for run in runs)
    ```

    Each job is claimed as a worker claims it (due, in priority order, its queue not
    paused, within its concurrency and rate limits), run as ``run_job()`` runs it, and
    its outcome written as a worker writes it: a completed job is completed, a failed
    one retried or failed, a workflow's next steps released. All of it on the test's
    connection, so inside ``TestCase``'s transaction too. A retry is due only after its
    delay, which passes no time here: with ``include_delayed=True``, delayed jobs and
    retries count as due (their ``run_at`` is set to now), so a failing job runs until
    its attempts are spent.

    Args:
        queues: Only these queues (a name or a list); ``None``: all.
        job_types: Only these job types (a name or a list); ``None``: all.
        include_delayed: Also run pending jobs whose time has not come, with their
            sleeps (``job.sleep()``) over; a job waiting for an event goes on waiting
            until the test emits it (``emit_event()``) or ends the wait
            (``Job.objects.filter(...).end_waits()``).
        using: The jobs database alias (default: the one ``JobsRouter`` picks).
        max_runs: Stop with an ``AssertionError`` after so many runs while jobs are
            still due (a job that enqueues another of its kind forever).
    """
    _require_test_environment()
    queue_names = validation.names(queues, validation.queue, "queues")
    type_names = validation.names(job_types, validation.job_type, "job_types")
    if not isinstance(max_runs, int) or isinstance(max_runs, bool) or max_runs < 1:
        raise InvalidJobError("max_runs", f"must be an integer of 1 or more, got {max_runs!r}")
    alias = conf.jobs_database(using)
    connection = connections[alias]
    runs: list[JobRun] = []
    while True:
        connection.ensure_connection()
        conn = connection.connection
        if include_delayed:
            psycopg.Cursor(conn).execute(
                _DELAYED_DUE, [queue_names, queue_names, type_names, type_names], prepare=False
            )
        claimed = psycopg.Cursor(conn).execute(
            queries.CLAIM,
            [RUN_JOB_WORKER_ID, type_names, 1, queue_names, 1, None, None],
            prepare=False,
        )
        row = claimed.fetchone()
        if row is None:
            return runs
        names = [column.name for column in claimed.description or []]
        job_id = row[names.index("id")]
        if len(runs) >= max_runs:
            # Given back as a worker gives back a job it did not start.
            claimed_at = row[names.index("claimed_at")]
            unstarted = Outcome(job_id, PENDING, claimed_at, refund=1, unstarted=True)
            psycopg.Cursor(conn).execute(
                queries.FINISH, finish_params([unstarted], RUN_JOB_WORKER_ID), prepare=False
            )
            raise AssertionError(
                f"drain() ran {max_runs} jobs and more are due: does a job enqueue "
                "another without end? Pass a larger max_runs if it is expected."
            )
        job = Job.objects.using(alias).get(pk=job_id)
        running = RunningJob(job=job, definition=registry.find_definition(job.job_type))
        outcome = _execute(running, alias)
        steps.write_deferred(job, alias)
        psycopg.Cursor(conn).execute(
            queries.FINISH, finish_params([outcome], RUN_JOB_WORKER_ID), prepare=False
        )
        runs.append(_job_run(running, outcome))


@contextmanager
def immediate(*, raise_errors: bool = True, using: str | None = None) -> Iterator[list[JobRun]]:
    """Run jobs in the test's thread as soon as the transaction that enqueued them
    commits; the block receives the list of runs, filled as they happen.

    ```python
    def test_signing_up_sends_the_welcome_email(db):
        with immediate() as runs:
            client.post("/signup/", {"email": "ada@example.com"})

        assert [run.job.job_type for run in runs] == ["emails.welcome"]
        assert mail.outbox[0].to == ["ada@example.com"]
    ```

    At each commit of a transaction that enqueued a job (at once in autocommit), every
    due job runs as ``drain()`` runs it, the jobs they enqueue too, with their outcomes
    written. Inside ``TestCase`` nothing commits: the jobs run when the ``on_commit``
    callbacks do, under ``captureOnCommitCallbacks(execute=True)`` or pytest-django's
    ``django_capture_on_commit_callbacks``. Also a decorator: ``@immediate()``.

    Args:
        raise_errors: Raise ``JobFailedError`` in the test when a job's attempt fails
            (retried or not), with its error and traceback in the message; ``False``:
            the failure is only in the runs.
        using: The jobs database alias (default: the one ``JobsRouter`` picks).
    """
    _require_test_environment()
    alias = conf.jobs_database(using)
    runs: list[JobRun] = []
    draining = False

    def run_due() -> None:
        nonlocal draining
        if draining:  # a job enqueued by a running job: the drain takes it too
            return
        draining = True
        try:
            ran = drain(using=alias)
        finally:
            draining = False
        runs.extend(ran)
        failed = next((run for run in ran if _attempt_failed(run)), None)
        if raise_errors and failed is not None:
            job = failed.job
            raise JobFailedError(
                f"job {job.id} ({job.job_type}) failed on attempt {job.attempts}"
                f"{' (it would be retried)' if failed.status == PENDING else ''}: "
                f"{failed.error}\n\n{failed.traceback}",
                job_id=job.id,
                error=failed.error,
            )

    def on_enqueued(sender: Any, job: Job, **kwargs: Any) -> None:
        if (job._state.db or alias) == alias:
            transaction.on_commit(run_due, using=alias)

    signals.job_enqueued.connect(on_enqueued, weak=False)
    try:
        yield runs
    finally:
        signals.job_enqueued.disconnect(on_enqueued)


def _attempt_failed(run: JobRun) -> bool:
    return run.status == JobStatus.FAILED or (
        run.status == PENDING and not (run.snoozed or run.suspended)
    )


#: Makes a drain's delayed pending jobs due, their sleeps over (``include_delayed``);
#: not those waiting for an event, which go on waiting for it.
_DELAYED_DUE = f"""
WITH delayed AS (
UPDATE pgqueue_jobs SET run_at = now()
 WHERE status = {literal(JobStatus.PENDING)} AND run_at > now()
   AND (%s::text[] IS NULL OR queue = ANY (%s::text[]))
   AND (%s::text[] IS NULL OR job_type = ANY (%s::text[]))
   AND NOT EXISTS (SELECT 1 FROM pgqueue_job_steps AS s
                    WHERE s.job_id = pgqueue_jobs.id AND s.kind = 'event' AND s.result IS NULL)
RETURNING id
)
UPDATE pgqueue_job_steps SET wake_at = now()
 WHERE job_id IN (SELECT id FROM delayed) AND kind = 'sleep' AND wake_at > now()
"""


def _execute(running: RunningJob, alias: str) -> Outcome:
    """Run ``running``'s handler in this thread; an async one on an event loop whose
    sync calls (the async ORM's) come back to this thread, and its connection."""
    definition = running.definition
    if definition is not None and definition.is_async:
        running.kind = LOOP
        return async_to_sync(aexecute)(running)
    running.kind = THREAD
    return execute(running, alias, in_worker=False)


def _job_run(running: RunningJob, outcome: Outcome) -> JobRun:
    pending = outcome.status == PENDING
    return JobRun(
        status=outcome.status,
        result=None if outcome.result is None else json.loads(outcome.result),
        error=outcome.error or "",
        traceback=outcome.traceback or "",
        retry_in=outcome.delay if pending else None,
        snoozed=bool(outcome.snoozed),
        suspended=bool(outcome.suspended),
        job=running.job,
    )


def _running_job(
    job: Job | JobDefinition | str,
    data: dict[str, Any] | None,
    attempt: int | None,
    using: str | None,
) -> RunningJob:
    """The ``RunningJob`` of a ``run_job()`` call: a copy of the job, held by the test."""
    if attempt is not None and (
        not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1
    ):
        raise InvalidJobError("attempt", f"must be an integer of 1 or more, got {attempt!r}")
    if isinstance(job, Job):
        if data is not None:
            raise InvalidJobError(
                "data", "is the job's own: give data only with a handler or a job type"
            )
        held = copy.copy(job)
        definition = registry.get_definition(job.job_type)
        next_attempt = job.attempts + 1
    else:
        job_type = job.job_type if isinstance(job, JobDefinition) else job
        definition = registry.get_definition(job_type)
        # What enqueue() would insert: its checks, and the type's defaults.
        row = jobrows.prepare(job_type, {} if data is None else data, {})
        now = timezone.now()
        held = Job.from_new_row(
            {
                "id": row.id,
                "job_type": row.job_type,
                "queue": row.queue,
                "priority": row.priority,
                "data": json.loads(row.data),
                "max_attempts": row.max_attempts,
                "created_at": now,
                "run_at": now,
            },
            conf.jobs_database(using),
        )
        next_attempt = 1
    held.attempts = next_attempt if attempt is None else attempt
    held.status = JobStatus.RUNNING
    held.worker_id = RUN_JOB_WORKER_ID
    held._store_steps = False  # run_job() writes nothing: its steps always run
    return RunningJob(job=held, definition=definition)


#: Pending jobs a failure message lists at most.
LISTED = 20


def _criteria(job_type: str | None, data: dict[str, Any] | None, queue: str | None) -> str:
    given = {"job_type": job_type, "data": data, "queue": queue}
    shown = ", ".join(f"{name}={value!r}" for name, value in given.items() if value is not None)
    return shown or "anything"


def _pending(using: str | None) -> QuerySet[Job]:
    """Every pending job of the jobs database, oldest first."""
    jobs = Job.objects.using(conf.jobs_database(using)).filter(status=JobStatus.PENDING)
    return jobs.order_by("created_at", "id")


def _pending_list(using: str | None) -> str:
    pending = list(_pending(using)[: LISTED + 1])
    if not pending:
        return "No job is pending."
    lines = [f"  {job.job_type} queue={job.queue!r} data={job.data!r}" for job in pending[:LISTED]]
    more = ["  ..."] if len(pending) > LISTED else []
    return "Pending jobs:\n" + "\n".join([*lines, *more])


def _require_test_environment() -> None:
    # Django's test environment (its runner, pytest-django) gives mail an outbox.
    if not hasattr(mail, "outbox"):
        raise ImproperlyConfigured(
            "django_pgqueue.testing is for tests: Django's test environment is not set up "
            "(run it under `manage.py test`, pytest-django, or call "
            "django.test.utils.setup_test_environment())"
        )
