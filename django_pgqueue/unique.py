"""Unique jobs: inserted with ``ON CONFLICT DO NOTHING`` on the partial unique index
``pgqueue_jobs_unique_key_active``, so at most one pending, claimed or running job holds
a key, whatever the concurrency.

The same statement reads the active job that holds the key; when that job was committed
by another session while the insert waited for it, the statement's snapshot cannot see
it, and the statement runs again (a new snapshot) until it either inserts or finds the
holder.

With ``unique_for`` a job with the key enqueued within the window holds it too, finished
or not (but cancelled): the statement looks for one first, in its own snapshot. With
``on_duplicate="replace"`` a pending holder then takes the new payload and run time, in
one ``UPDATE`` guarded by its status.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from .exceptions import DuplicateJobError, InvalidJobError, PgQueueError
from .inserts import (
    COLUMNS,
    has_run_at,
    record_notified,
    returning_jobs,
    send_enqueued,
    settle_held,
    undelayed_queues,
    wants_notify,
    with_notify,
)
from .jobrows import UNIQUE_FIELDS, JobRow
from .logfields import job_fields
from .options import OnDuplicate
from .schema import ACTIVE, CLAIMABLE, JobStatus, literal, status_in

if TYPE_CHECKING:
    from .models import Job

logger = logging.getLogger("django_pgqueue.enqueue")


# The predicate of the partial unique index pgqueue_jobs_unique_key_active (migration 0006).
_ACTIVE = status_in(ACTIVE)
_ON_CONFLICT = f"ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND {_ACTIVE} DO NOTHING"

# ``existing`` reads with the statement's snapshot: it sees an active job committed before
# the statement started or written earlier in this transaction, never the rows inserted
# here. The result is the inserted row, or else the holder of the key, or else nothing
# (the holder committed while the insert waited for it: the caller runs it again).
_INSERT_ONE_UNIQUE = f"""
WITH inserted AS (
    INSERT INTO pgqueue_jobs ({COLUMNS}, unique_key)
    VALUES (%s, %s, %s, %s, %s::jsonb,
            COALESCE(%s::timestamptz, now() + %s * interval '1 second'), %s, %s, %s, %s,
            %s::jsonb, %s)
    {_ON_CONFLICT}
    RETURNING *
), existing AS (
    SELECT * FROM pgqueue_jobs WHERE unique_key = %s AND {_ACTIVE}
){{notify}}
SELECT inserted.* FROM inserted{{notify_join}}
UNION ALL
SELECT existing.* FROM existing WHERE NOT EXISTS (SELECT FROM inserted)
"""

# With unique_for: a job with the key enqueued within the window (by created_at), in any
# state but cancelled, holds the key too. Reading it with the statement's snapshot closes
# the race with a holder finishing meanwhile: the snapshot still sees it, in the window.
# The holder returned is the active one, else the newest in the window.
_INSERT_ONE_UNIQUE_WINDOW = f"""
WITH recent AS (
    SELECT * FROM pgqueue_jobs
     WHERE unique_key = %s AND created_at >= now() - %s * interval '1 second'
       AND status <> {literal(JobStatus.CANCELLED)}
     ORDER BY created_at DESC
     LIMIT 1
), inserted AS (
    INSERT INTO pgqueue_jobs ({COLUMNS}, unique_key)
    SELECT %s, %s, %s, %s, %s::jsonb,
           COALESCE(%s::timestamptz, now() + %s * interval '1 second'), %s, %s, %s, %s,
           %s::jsonb, %s
     WHERE NOT EXISTS (SELECT FROM recent)
    {_ON_CONFLICT}
    RETURNING *
), holder AS (
    SELECT h.id FROM (
        SELECT id, 0 AS rank FROM pgqueue_jobs WHERE unique_key = %s AND {_ACTIVE}
        UNION ALL
        SELECT id, 1 FROM recent
    ) AS h ORDER BY h.rank LIMIT 1
){{notify}}
SELECT inserted.* FROM inserted{{notify_join}}
UNION ALL
SELECT jobs.* FROM pgqueue_jobs AS jobs JOIN holder USING (id)
 WHERE NOT EXISTS (SELECT FROM inserted)
"""

# Rows are inserted in key order, so that two batches sharing keys wait for each other
# in one order and cannot deadlock; created_at still follows the input order (one
# microsecond apart from a single clock reading): FIFO within one call.
_INSERT_MANY_UNIQUE = f"""
WITH inserted AS (
    INSERT INTO pgqueue_jobs ({COLUMNS}, unique_key, created_at)
    SELECT t.id, t.job_type, t.queue, t.priority, t.data::jsonb,
           COALESCE(t.run_at, now() + t.delay * interval '1 second'), t.max_attempts,
           t.concurrency_key, t.held, t.timeout, t.trace_context::jsonb, t.unique_key,
           (SELECT clock_timestamp()) + t.position * interval '1 microsecond'
      FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::int[], %s::text[],
                  %s::timestamptz[], %s::float8[], %s::int[], %s::text[], %s::bool[],
                  %s::float8[], %s::text[], %s::text[])
           WITH ORDINALITY
           AS t(id, job_type, queue, priority, data, run_at, delay, max_attempts,
                concurrency_key, held, timeout, trace_context, unique_key, position)
     ORDER BY t.unique_key
    {_ON_CONFLICT}
    RETURNING *
), existing AS (
    SELECT * FROM pgqueue_jobs WHERE unique_key = ANY(%s::text[]) AND {_ACTIVE}
){{notify}}
SELECT inserted.* FROM inserted{{notify_join}}
UNION ALL
SELECT existing.* FROM existing
 WHERE existing.unique_key NOT IN (
       SELECT inserted.unique_key FROM inserted WHERE inserted.unique_key IS NOT NULL)
"""

# on_duplicate="replace": pending holders take the payload and run time of the rows that
# found them. A holder claimed or finished since it was found is left alone, and the
# caller looks again. Named "inserted" for the NOTIFY the inserts share.
_REPLACE = f"""
WITH inserted AS (
    UPDATE pgqueue_jobs AS jobs
       SET data = r.data::jsonb,
           run_at = COALESCE(r.run_at, now() + r.delay * interval '1 second')
      FROM unnest(%s::uuid[], %s::text[], %s::timestamptz[], %s::float8[])
           AS r(id, data, run_at, delay)
     WHERE jobs.id = r.id AND jobs.{status_in(CLAIMABLE)}
    RETURNING jobs.*
){{notify}}
SELECT inserted.* FROM inserted{{notify_join}}
"""

# _INSERT_MANY_UNIQUE with each row's unique_for (NULL: none), as _INSERT_ONE_UNIQUE_WINDOW.
_INSERT_MANY_UNIQUE_WINDOW = f"""
WITH t AS (
    SELECT *
      FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::int[], %s::text[],
                  %s::timestamptz[], %s::float8[], %s::int[], %s::text[], %s::bool[],
                  %s::float8[], %s::text[], %s::text[], %s::float8[])
           WITH ORDINALITY
           AS t(id, job_type, queue, priority, data, run_at, delay, max_attempts,
                concurrency_key, held, timeout, trace_context, unique_key, unique_for,
                position)
), recent AS (
    SELECT DISTINCT ON (jobs.unique_key) jobs.*
      FROM pgqueue_jobs AS jobs JOIN t ON jobs.unique_key = t.unique_key
     WHERE t.unique_for IS NOT NULL
       AND jobs.created_at >= now() - t.unique_for * interval '1 second'
       AND jobs.status <> {literal(JobStatus.CANCELLED)}
     ORDER BY jobs.unique_key, jobs.created_at DESC
), inserted AS (
    INSERT INTO pgqueue_jobs ({COLUMNS}, unique_key, created_at)
    SELECT t.id, t.job_type, t.queue, t.priority, t.data::jsonb,
           COALESCE(t.run_at, now() + t.delay * interval '1 second'), t.max_attempts,
           t.concurrency_key, t.held, t.timeout, t.trace_context::jsonb, t.unique_key,
           (SELECT clock_timestamp()) + t.position * interval '1 microsecond'
      FROM t
     WHERE t.unique_key IS NULL OR t.unique_key NOT IN (SELECT unique_key FROM recent)
     ORDER BY t.unique_key
    {_ON_CONFLICT}
    RETURNING *
), holders AS (
    SELECT DISTINCT ON (h.unique_key) h.id FROM (
        SELECT id, unique_key, 0 AS rank
          FROM pgqueue_jobs WHERE unique_key = ANY(%s::text[]) AND {_ACTIVE}
        UNION ALL
        SELECT id, unique_key, 1 FROM recent
    ) AS h ORDER BY h.unique_key, h.rank
){{notify}}
SELECT inserted.* FROM inserted{{notify_join}}
UNION ALL
SELECT jobs.* FROM pgqueue_jobs AS jobs JOIN holders USING (id)
 WHERE jobs.unique_key NOT IN (
       SELECT inserted.unique_key FROM inserted WHERE inserted.unique_key IS NOT NULL)
"""

#: A unique enqueue runs its statement again at most this many times when the holder of
#: a key keeps changing under it (each run follows a commit by another session).
UNIQUE_ROUNDS = 50


def _duplicate(row: JobRow, holder: Job) -> DuplicateJobError:
    """The error for ``row``'s key, held by ``holder``: an active job, or one enqueued
    within the row's ``unique_for``."""
    assert row.unique_key is not None
    window = None if holder.status in ACTIVE else row.unique_for
    return DuplicateJobError(row.unique_key, holder, window=window)


def _unresolved(key: str) -> PgQueueError:
    return PgQueueError(
        f"could not enqueue with unique_key {key!r}: the active job holding it changed "
        f"{UNIQUE_ROUNDS} times during the call; try again"
    )


def enqueue_unique(row: JobRow, on_duplicate: OnDuplicate, alias: str) -> Job:
    assert row.unique_key is not None
    for _ in range(UNIQUE_ROUNDS):
        if row.unique_for is None:
            statement, params = _INSERT_ONE_UNIQUE, [*row[:UNIQUE_FIELDS], row.unique_key]
        else:
            statement = _INSERT_ONE_UNIQUE_WINDOW
            params = [row.unique_key, row.unique_for, *row[:UNIQUE_FIELDS], row.unique_key]
        notify = wants_notify(connections[alias], undelayed_queues([row]), record=False)
        jobs = returning_jobs(with_notify(statement, params, notify), params, alias)
        if not jobs:
            continue  # the holder committed while the insert waited: look again
        job = jobs[0]
        if job.id == row.id:
            if notify:
                record_notified(connections[alias], undelayed_queues([row]))
            settle_held([job], [row], alias)
            send_enqueued([job])
            return job
        logger.debug(
            "unique_key %r is held by job %s: not enqueued",
            row.unique_key,
            job.id,
            extra=job_fields(job),
        )
        if on_duplicate == "raise":
            raise _duplicate(row, job)
        if on_duplicate == "replace" and job.status == JobStatus.PENDING:
            replaced = _replace({row.unique_key: job}, [row], alias)
            if not replaced:
                continue  # claimed or finished since it was found: look again
            return replaced[row.unique_key]
        return job
    raise _unresolved(row.unique_key)


def enqueue_many_unique(rows: list[JobRow], on_duplicate: OnDuplicate, alias: str) -> list[Job]:
    candidates = _one_per_key(rows, on_duplicate)
    if on_duplicate == "raise":
        # A savepoint: raising rolls back the jobs this call inserted (and their NOTIFY).
        with transaction.atomic(using=alias):
            inserted, holders = _insert_unique(candidates, alias)
            duplicate = next((row for row in rows if row.unique_key in holders), None)
            if duplicate is not None:
                assert duplicate.unique_key is not None
                raise _duplicate(duplicate, holders[duplicate.unique_key])
    elif on_duplicate == "replace":
        inserted, holders = _insert_or_replace(candidates, alias)
    else:
        inserted, holders = _insert_unique(candidates, alias)
    settle_held(list(inserted.values()), [row for row in candidates if row.id in inserted], alias)
    by_key = {**holders, **{job.unique_key: job for job in inserted.values() if job.unique_key}}
    jobs = [inserted.get(row.id) or by_key[row.unique_key or ""] for row in rows]
    send_enqueued([inserted[row.id] for row in candidates if row.id in inserted])
    return jobs


def _one_per_key(rows: list[JobRow], on_duplicate: OnDuplicate) -> list[JobRow]:
    """The rows to send: every row without a key, and one row per key, the first (the
    later ones get its job) or, to replace, the last (its payload and time win)."""
    chosen: dict[str, int] = {}
    for index, row in enumerate(rows):
        if row.unique_key is None:
            continue
        if row.unique_key in chosen and on_duplicate == "raise":
            raise InvalidJobError(
                f"specs[{index}].unique_key",
                f"{row.unique_key!r} is also the key of specs[{chosen[row.unique_key]}]; "
                "give each spec its own key, or pass on_duplicate='return' to "
                "enqueue the first one only",
            )
        if row.unique_key not in chosen or on_duplicate == "replace":
            chosen[row.unique_key] = index
    sent = set(chosen.values())
    return [row for index, row in enumerate(rows) if row.unique_key is None or index in sent]


def _insert_or_replace(
    rows: list[JobRow], alias: str
) -> tuple[dict[uuid.UUID, Job], dict[str, Job]]:
    """``_insert_unique``, then the pending holders replaced with their rows; a holder
    claimed or finished in between is looked for again."""
    inserted: dict[uuid.UUID, Job] = {}
    holders: dict[str, Job] = {}
    todo = rows
    for _ in range(UNIQUE_ROUNDS):
        new, found = _insert_unique(todo, alias)
        inserted.update(new)
        pending = {key: job for key, job in found.items() if job.status == JobStatus.PENDING}
        replaced = _replace(pending, todo, alias) if pending else {}
        holders.update({key: job for key, job in found.items() if key not in pending})
        holders.update(replaced)
        todo = [row for row in todo if row.unique_key in pending.keys() - replaced.keys()]
        if not todo:
            return inserted, holders
    raise _unresolved(str(todo[0].unique_key))


def _replace(holders: dict[str, Job], rows: list[JobRow], alias: str) -> dict[str, Job]:
    """Give each pending holder (by key) the payload and run time of the row with its
    key; return the jobs replaced, by key (a holder no longer pending is left out)."""
    # Each row in its holder's queue: the queue the NOTIFY wakes.
    chosen = [
        row._replace(queue=holders[row.unique_key].queue)
        for row in rows
        if row.unique_key is not None and row.unique_key in holders
    ]
    params: list[Any] = [
        [holders[str(row.unique_key)].id for row in chosen],
        [row.data for row in chosen],
        [row.run_at for row in chosen],
        [row.delay for row in chosen],
    ]
    db = connections[alias]
    notify = wants_notify(db, undelayed_queues(chosen), scheduled=has_run_at(chosen), record=False)
    replaced = returning_jobs(with_notify(_REPLACE, params, notify), params, alias)
    if notify:
        done = {job.unique_key for job in replaced}
        record_notified(db, undelayed_queues(row for row in chosen if row.unique_key in done))
    for job in replaced:
        logger.debug(
            "unique_key %r: pending job %s replaced", job.unique_key, job.id, extra=job_fields(job)
        )
    return {str(job.unique_key): job for job in replaced}


def _insert_unique(rows: list[JobRow], alias: str) -> tuple[dict[uuid.UUID, Job], dict[str, Job]]:
    """Insert ``rows`` (one per key at most); return the inserted jobs by id, and the
    active jobs that hold the keys of the others, by key."""
    inserted: dict[uuid.UUID, Job] = {}
    holders: dict[str, Job] = {}
    todo = rows
    for _ in range(UNIQUE_ROUNDS):
        columns = [list(column) for column in zip(*todo, strict=True)]
        windowed = any(row.unique_for is not None for row in todo)
        statement = _INSERT_MANY_UNIQUE_WINDOW if windowed else _INSERT_MANY_UNIQUE
        # Through unique_for, or through unique_key without a window.
        params: list[Any] = columns[: UNIQUE_FIELDS + 1 if windowed else UNIQUE_FIELDS]
        params.append([row.unique_key for row in todo if row.unique_key is not None])
        notify = wants_notify(
            connections[alias],
            undelayed_queues(todo),
            scheduled=has_run_at(todo),
            record=False,
        )
        sent = {row.id: row for row in todo}
        for job in returning_jobs(with_notify(statement, params, notify), params, alias):
            if job.id in sent:
                inserted[job.id] = job
            else:
                assert job.unique_key is not None
                holders[job.unique_key] = job
        if notify:
            record_notified(
                connections[alias], undelayed_queues(row for row in todo if row.id in inserted)
            )
        # Left: keys whose holder committed while the insert waited for it.
        todo = [row for row in todo if row.id not in inserted and row.unique_key not in holders]
        if not todo:
            if holders:
                logger.debug("unique keys held by active jobs, not enqueued: %s", sorted(holders))
            return inserted, holders
    raise _unresolved(str(todo[0].unique_key))
