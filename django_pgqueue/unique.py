"""Unique jobs: inserted with ``ON CONFLICT DO NOTHING`` on the partial unique index
``pgqueue_jobs_unique_key_active``, so at most one pending, claimed or running job holds
a key, whatever the concurrency.

The same statement reads the active job that holds the key; when that job was committed
by another session while the insert waited for it, the statement's snapshot cannot see
it, and the statement runs again (a new snapshot) until it either inserts or finds the
holder.
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
    undelayed_queues,
    wants_notify,
    with_notify,
)
from .jobrows import JobRow
from .options import OnDuplicate
from .schema import ACTIVE, status_in

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
            COALESCE(%s::timestamptz, now() + %s * interval '1 second'), %s, %s)
    {_ON_CONFLICT}
    RETURNING *
), existing AS (
    SELECT * FROM pgqueue_jobs WHERE unique_key = %s AND {_ACTIVE}
){{notify}}
SELECT inserted.* FROM inserted{{notify_join}}
UNION ALL
SELECT existing.* FROM existing WHERE NOT EXISTS (SELECT FROM inserted)
"""

# Rows are inserted in key order, so that two batches sharing keys wait for each other
# in one order and cannot deadlock; created_at still follows the input order (one
# microsecond apart from a single clock reading): FIFO within one call.
_INSERT_MANY_UNIQUE = f"""
WITH inserted AS (
    INSERT INTO pgqueue_jobs ({COLUMNS}, unique_key, created_at)
    SELECT t.id, t.job_type, t.queue, t.priority, t.data::jsonb,
           COALESCE(t.run_at, now() + t.delay * interval '1 second'), t.max_attempts,
           t.unique_key, (SELECT clock_timestamp()) + t.position * interval '1 microsecond'
      FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::int[], %s::text[],
                  %s::timestamptz[], %s::float8[], %s::int[], %s::text[])
           WITH ORDINALITY
           AS t(id, job_type, queue, priority, data, run_at, delay, max_attempts, unique_key,
                position)
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

#: A unique enqueue runs its statement again at most this many times when the holder of
#: a key keeps changing under it (each run follows a commit by another session).
UNIQUE_ROUNDS = 50


def _unresolved(key: str) -> PgQueueError:
    return PgQueueError(
        f"could not enqueue with unique_key {key!r}: the active job holding it changed "
        f"{UNIQUE_ROUNDS} times during the call; try again"
    )


def enqueue_unique(row: JobRow, on_duplicate: OnDuplicate, alias: str) -> Job:
    assert row.unique_key is not None
    for _ in range(UNIQUE_ROUNDS):
        params: list[Any] = [*row, row.unique_key]
        notify = wants_notify(connections[alias], undelayed_queues([row]), record=False)
        jobs = returning_jobs(with_notify(_INSERT_ONE_UNIQUE, params, notify), params, alias)
        if not jobs:
            continue  # the holder committed while the insert waited: look again
        job = jobs[0]
        if job.id == row.id:
            if notify:
                record_notified(connections[alias], undelayed_queues([row]))
            send_enqueued([job])
            return job
        logger.debug("unique_key %r is held by job %s: not enqueued", row.unique_key, job.id)
        if on_duplicate == "raise":
            raise DuplicateJobError(row.unique_key, job)
        return job
    raise _unresolved(row.unique_key)


def enqueue_many_unique(rows: list[JobRow], on_duplicate: OnDuplicate, alias: str) -> list[Job]:
    # Only the first spec of each key is sent; later ones get its job.
    first: dict[str, int] = {}
    candidates: list[JobRow] = []
    for index, row in enumerate(rows):
        if row.unique_key is not None:
            if row.unique_key in first:
                if on_duplicate == "raise":
                    raise InvalidJobError(
                        f"specs[{index}].unique_key",
                        f"{row.unique_key!r} is also the key of specs[{first[row.unique_key]}]; "
                        "give each spec its own key, or pass on_duplicate='return' to "
                        "enqueue the first one only",
                    )
                continue
            first[row.unique_key] = index
        candidates.append(row)
    if on_duplicate == "raise":
        # A savepoint: raising rolls back the jobs this call inserted (and their NOTIFY).
        with transaction.atomic(using=alias):
            inserted, holders = _insert_unique(candidates, alias)
            duplicate = next((row for row in rows if row.unique_key in holders), None)
            if duplicate is not None:
                assert duplicate.unique_key is not None
                raise DuplicateJobError(duplicate.unique_key, holders[duplicate.unique_key])
    else:
        inserted, holders = _insert_unique(candidates, alias)
    by_key = {**holders, **{job.unique_key: job for job in inserted.values() if job.unique_key}}
    jobs = [inserted.get(row.id) or by_key[row.unique_key or ""] for row in rows]
    send_enqueued([inserted[row.id] for row in candidates if row.id in inserted])
    return jobs


def _insert_unique(rows: list[JobRow], alias: str) -> tuple[dict[uuid.UUID, Job], dict[str, Job]]:
    """Insert ``rows`` (one per key at most); return the inserted jobs by id, and the
    active jobs that hold the keys of the others, by key."""
    inserted: dict[uuid.UUID, Job] = {}
    holders: dict[str, Job] = {}
    todo = rows
    for _ in range(UNIQUE_ROUNDS):
        params: list[Any] = [list(column) for column in zip(*todo, strict=True)]
        params.append([row.unique_key for row in todo if row.unique_key is not None])
        notify = wants_notify(
            connections[alias],
            undelayed_queues(todo),
            scheduled=has_run_at(todo),
            record=False,
        )
        sent = {row.id: row for row in todo}
        for job in returning_jobs(with_notify(_INSERT_MANY_UNIQUE, params, notify), params, alias):
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
