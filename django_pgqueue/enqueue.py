"""``enqueue`` and ``enqueue_many``: the public API of writing jobs.

Each call validates its arguments into rows (``jobrows``), then inserts them on the
caller's connection: plain jobs with one statement or ``COPY`` (``inserts``), jobs with
a unique key with ``ON CONFLICT DO NOTHING`` (``unique``). Inside
``transaction.atomic`` the jobs exist only if that transaction commits; the NOTIFY that
wakes idle workers is delivered on commit.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Unpack, get_args

from asgiref.sync import sync_to_async
from django.db import connections, transaction

from . import conf, reused_cursor, tracing
from .exceptions import InvalidJobError
from .inserts import (
    COPY_PART_ROWS,
    INSERT_ONE,
    INSERT_ONE_DUE_QUIET,
    INSERT_ONE_QUIET,
    KeyedRowFound,
    built_one,
    insert_plain_many,
    send_enqueued,
    settle_held,
    wants_notify,
    with_notify,
)
from .jobrows import PLAIN_FIELDS, JobRow, prepare, prepared_rows
from .options import ENQUEUE_KEYS, EnqueueOptions, JobSpec, OnDuplicate, check_keys
from .unique import enqueue_many_unique, enqueue_unique
from .workflows.insert import enqueue_graph

if TYPE_CHECKING:
    from .models import Job

__all__ = ["aenqueue", "aenqueue_many", "enqueue", "enqueue_many"]


def _depends_on_field(index: int) -> str:
    return "depends_on"


def _check_no_index(row: JobRow) -> None:
    for position, item in enumerate(row.depends_on or ()):
        if isinstance(item.target, int):
            raise InvalidJobError(
                f"depends_on[{position}]",
                f"{item.target} is an index, which names a spec of enqueue_many(); "
                "enqueue() takes Jobs and job ids",
            )


def _spec_depends_on_field(index: int) -> str:
    return f"specs[{index}].depends_on"


def _check_on_duplicate(value: Any) -> None:
    if value not in get_args(OnDuplicate):
        allowed = ", ".join(map(repr, get_args(OnDuplicate)))
        raise InvalidJobError("on_duplicate", f"must be one of {allowed}, got {value!r}")


def enqueue(
    job_type: str,
    data: dict[str, Any] | None = None,
    *,
    on_duplicate: OnDuplicate = "return",
    using: str | None = None,
    **options: Unpack[EnqueueOptions],
) -> Job:
    """Insert one job and return it.

    With a ``unique_key`` (or the job type's default key) held by an active job, nothing
    is inserted and that job is returned instead. Sends
    [`job_enqueued`](#signals) for the job it inserted (not for an existing
    unique job), before returning. Do not create jobs with ``Job.objects.create()``: it
    skips validation and does not wake workers.

    Args:
        job_type: Name of a registered job type: 1 to 200 characters, letters, digits and
            ``_ . : / -``, not starting with ``.``, ``:``, ``/`` or ``-``. Must be
            registered with [`@job`][django_pgqueue.job] in this process unless
            ``PGQUEUE["VALIDATE_JOB_TYPES"]`` is ``False``.
        data: The payload: a ``dict`` that can be serialised to JSON, or ``None`` for
            ``{}``. Its compact UTF-8 JSON must fit in ``PGQUEUE["MAX_PAYLOAD_BYTES"]``
            (64 KiB by default). What is accepted reaches the handler unchanged as
            ``job.data`` (tuples become lists); what PostgreSQL's ``jsonb`` or Python
            could not give back unchanged is rejected: NaN and infinities, floats of
            magnitude 1e16 or more (``jsonb`` returns them as integers: pass an ``int`` or
            a string), integers of more than 4,300 digits, keys that are not strings,
            nesting deeper than 100 levels (``django_pgqueue.validation.MAX_NESTING``),
            NUL characters and lone surrogates.
        on_duplicate: What to do when an active job holds ``unique_key``: ``"return"``
            (the default) returns it, ``"raise"`` raises
            [`DuplicateJobError`][django_pgqueue.DuplicateJobError], ``"replace"``
            gives a ``pending`` holder this call's ``data`` and run time (``run_at`` or
            ``delay``, else now) and returns it; a ``claimed`` or ``running`` holder is
            returned as it is. Nothing is inserted either way. See
            [Debounce](../how-to/unique-jobs.md#replace-a-pending-job-debounce).
        using: Database alias to write to. Default: ``PGQUEUE["DATABASE"]``.
        **options: The keys of
            [`EnqueueOptions`][django_pgqueue.options.EnqueueOptions]: ``queue``,
            ``priority``, ``max_attempts``, ``run_at``, ``delay``, ``unique_key``. Type
            checkers see each key's type; an undeclared keyword raises ``TypeError``.

    Returns:
        The new [`Job`][django_pgqueue.Job], as inserted (status ``pending``, defaults
            filled in), or the active job that holds ``unique_key``, as it is in the
            database (replaced, with ``"replace"``).

    Raises:
        InvalidJobError: Before writing anything, when an argument is invalid; its
            ``field`` attribute names the argument.
        DuplicateJobError: With ``on_duplicate="raise"``, when an active job holds the
            key.
        PgQueueError: When the holder of the key kept changing during the call (see
            below).

    Database errors propagate as usual.

    The job is inserted with one statement on the connection of ``using``, so inside
    ``transaction.atomic`` on that database it exists only if the transaction commits.
    When ``PGQUEUE["NOTIFY"]`` is ``True`` and the job is due (its ``run_at``, given or
    not, is at or before the database's ``now()``: the same test the claim makes), the
    same statement sends a ``NOTIFY`` on ``PGQUEUE["NOTIFY_CHANNEL"]`` with the queue name
    as payload; PostgreSQL delivers it only on commit.

    The statement runs through a Django cursor of that connection, so
    [`connection.execute_wrapper()`](https://docs.djangoproject.com/en/stable/topics/db/instrumentation/)
    hooks, Django's database exceptions and tools that instrument Django's cursors see it
    as any other query. A job without a ``unique_key`` reuses one cursor per thread and
    connection instead of opening a new one per call (opening one costs the client about
    as much as the insert); a new cursor is opened whenever ``connection.cursor()`` would
    do more than hand one out: after a reconnect, while queries are logged (``DEBUG``,
    ``assertNumQueries``, ``CaptureQueriesContext``), before the health check of a
    request (``CONN_HEALTH_CHECKS``), inside a running event loop (Django then raises
    ``SynchronousOnlyOperation``, as for any query) and while the connection is shared
    between threads.

    With a ``unique_key`` the statement is ``INSERT ... ON CONFLICT (unique_key) WHERE
    status IN ('pending', 'claimed', 'running') DO NOTHING``, on the partial unique index
    ``pgqueue_jobs_unique_key_active``, and reads the job holding the key in the same
    statement: still one statement, and no ``NOTIFY`` when nothing was inserted. When the
    holder was committed by another session while the insert waited for it, the
    statement runs again (up to 50 times, then ``PgQueueError``). Concurrent enqueues of
    one key from any number of processes get one job.
    """
    _check_on_duplicate(on_duplicate)
    if options:
        check_keys(options, ENQUEUE_KEYS, "enqueue()")
    if conf.get_settings().OPENTELEMETRY:
        with tracing.enqueue_span(job_type, options.get("queue")) as span:
            job = _enqueue(job_type, data, on_duplicate, using, options, tracing.current_context())
            tracing.describe_enqueued(span, [job])
            return job
    return _enqueue(job_type, data, on_duplicate, using, options, None)


def _enqueue(
    job_type: str,
    data: dict[str, Any] | None,
    on_duplicate: OnDuplicate,
    using: str | None,
    options: EnqueueOptions,
    trace_context: str | None,
) -> Job:
    row = prepare(job_type, data, options, trace_context=trace_context)
    alias = conf.jobs_database(using)
    if row.depends_on is not None:
        _check_no_index(row)
        return enqueue_graph([row], alias, _depends_on_field)[0]
    if row.held:
        # A due job with a key is inserted held and its key released, in one transaction.
        with transaction.atomic(using=alias):
            return _enqueue_row(row, on_duplicate, alias)
    return _enqueue_row(row, on_duplicate, alias)


def _enqueue_row(row: JobRow, on_duplicate: OnDuplicate, alias: str) -> Job:
    if row.unique_key is not None:
        return enqueue_unique(row, on_duplicate, alias)
    settings = conf.get_settings()
    db = connections[alias]
    undelayed = row.undelayed
    if wants_notify(db, {row.queue} if undelayed else set()) and settings.NOTIFY:
        params: list[Any] = list(row[:PLAIN_FIELDS])
        sql = with_notify(INSERT_ONE, params, True)
    elif (
        undelayed
        and row.concurrency_key is None
        and row.timeout is None
        and row.trace_context is None
    ):
        params = [row.id, row.job_type, row.queue, row.priority, row.data, row.max_attempts]
        sql = INSERT_ONE_DUE_QUIET
    else:
        params = list(row[:PLAIN_FIELDS])
        sql = INSERT_ONE_QUIET
    created_us, run_us = reused_cursor.execute_fetchone(db, sql, params)
    job = built_one(row, created_us, run_us, alias)
    settle_held([job], [row], alias)
    send_enqueued([job])
    return job


def enqueue_many(
    specs: Iterable[JobSpec | Mapping[str, Any]],
    *,
    on_duplicate: OnDuplicate = "return",
    using: str | None = None,
) -> list[Job]:
    """Insert many jobs and return them in the order given; all of them or none.

    An empty iterable returns ``[]`` without a query. One ``NOTIFY`` is sent per queue
    that received a due job, after the rows.
    [`job_enqueued`](#signals) is sent for each inserted job, in the order
    of ``specs``.

    Args:
        specs: Mappings with the keys of [`JobSpec`][django_pgqueue.JobSpec]:
            ``job_type`` is required, every other key is optional and defaults as in
            [`enqueue()`][django_pgqueue.enqueue.enqueue].
        on_duplicate: As in ``enqueue()``; see the unique keys below.
        using: Database alias to write to. Default: ``PGQUEUE["DATABASE"]``.

    Returns:
        The jobs, one per spec, in the order of ``specs``.

    Raises:
        InvalidJobError: For the whole call, with ``field`` naming the spec (for example
            ``specs[3].priority``), for an invalid spec, a spec that is not a mapping, a
            missing ``job_type`` or an unknown key; nothing of the batch is inserted.
        DuplicateJobError: With ``on_duplicate="raise"``, for the first spec whose key is
            held by an active job; nothing of the batch is inserted (the call uses a
            savepoint of its own).

    Plain jobs (no unique key) are sent with ``COPY``, after one query that reads the
    database's clock: ``created_at`` is that reading plus one microsecond per spec, so
    among equal priorities the jobs are claimed in the order of ``specs``, and ``run_at``
    is the transaction's ``now()`` plus any ``delay``, as ``enqueue()`` sets it. Up to
    ``COPY_PART_ROWS`` (1,000) specs are validated before anything is sent. A larger batch
    is streamed: each part goes to the server while the next is validated, inside a
    transaction of its own (a savepoint inside ``transaction.atomic``), so a bad spec late
    in the batch rolls back what was sent and leaves the caller's transaction usable.
    While a streamed batch is built, Python's cyclic garbage collector is paused
    (``gc.disable()``, resumed at the end if it was running): the call creates several
    objects per job and no cycles, and the collections they triggered took a fifth of its
    time. Django's query log (``connection.queries``, ``assertNumQueries``) shows the
    ``COPY`` as one query; execute wrappers (``connection.execute_wrapper``) do not see
    it.

    Unique keys: a spec whose ``unique_key`` is held by an active job gets that job; the
    first spec with a key inserts a job when the key is free, and every later spec with
    the same key gets that job (the same ``Job`` object). With ``on_duplicate="raise"``,
    two specs with one key raise ``InvalidJobError`` (``field`` ``specs[<i>].unique_key``)
    before anything is written. With ``on_duplicate="replace"`` the **last** spec of each
    key is the one sent: it inserts the job, or replaces the payload and run time of a
    ``pending`` holder, and every spec with the key gets that job. A batch with keys
    inserts its rows in key order, so concurrent batches sharing keys cannot deadlock on
    each other; ``created_at`` still follows the order of ``specs``.
    """
    _check_on_duplicate(on_duplicate)
    if conf.get_settings().OPENTELEMETRY:
        with tracing.enqueue_span(None) as span:
            jobs = _enqueue_many(specs, on_duplicate, using, tracing.current_context())
            tracing.describe_enqueued(span, jobs)
            return jobs
    return _enqueue_many(specs, on_duplicate, using, None)


def _enqueue_many(
    specs: Iterable[JobSpec | Mapping[str, Any]],
    on_duplicate: OnDuplicate,
    using: str | None,
    trace_context: str | None,
) -> list[Job]:
    prepared = prepared_rows(specs, trace_context)
    rows = list(itertools.islice(prepared, COPY_PART_ROWS))
    if not rows:
        return []
    alias = conf.jobs_database(using)
    if not any(row.unique_key is not None or row.depends_on is not None for row in rows):
        try:
            jobs = insert_plain_many(rows, prepared, alias)
        except KeyedRowFound as found:
            rows = found.rows  # everything validated so far; the rest follows below
        else:
            send_enqueued(jobs)
            return jobs
    rows.extend(prepared)
    if any(row.depends_on is not None for row in rows):
        return enqueue_graph(rows, alias, _spec_depends_on_field)
    if any(row.held for row in rows):
        # Held rows are released in the same transaction as their insert.
        with transaction.atomic(using=alias):
            return enqueue_many_unique(rows, on_duplicate, alias)
    return enqueue_many_unique(rows, on_duplicate, alias)


async def aenqueue(
    job_type: str,
    data: dict[str, Any] | None = None,
    *,
    on_duplicate: OnDuplicate = "return",
    using: str | None = None,
    **options: Unpack[EnqueueOptions],
) -> Job:
    """[`enqueue()`][django_pgqueue.enqueue.enqueue] for async code: the same arguments,
    errors and result.

    ```python
    async def signup(request):
        user = await User.objects.acreate(email=email)
        await aenqueue("accounts.send_welcome", {"user_id": user.pk})
    ```

    The insert runs in Django's thread for sync code (``sync_to_async`` with
    ``thread_sensitive=True``), on the connection that thread uses, as Django's own async
    ORM methods do: in autocommit, the job is committed when the ``await`` returns. To
    enqueue in one transaction with other writes, put them and ``enqueue()`` in one sync
    function under ``transaction.atomic`` and await it through ``sync_to_async`` (Django's
    transactions do not span ``await``).
    """
    insert = sync_to_async(enqueue, thread_sensitive=True)
    return await insert(job_type, data, on_duplicate=on_duplicate, using=using, **options)


async def aenqueue_many(
    specs: Iterable[JobSpec | Mapping[str, Any]],
    *,
    on_duplicate: OnDuplicate = "return",
    using: str | None = None,
) -> list[Job]:
    """[`enqueue_many()`][django_pgqueue.enqueue.enqueue_many] for async code, as
    [`aenqueue()`][django_pgqueue.enqueue.aenqueue] is ``enqueue()``'s: all the jobs or
    none, inserted in Django's thread for sync code. ``specs`` is consumed there: give a
    list, or a generator that does not await."""
    insert = sync_to_async(enqueue_many, thread_sensitive=True)
    return await insert(specs, on_duplicate=on_duplicate, using=using)
