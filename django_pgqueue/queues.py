"""Queue pause and resume, and what is known about each queue.

A paused queue keeps its jobs and accepts new ones, but no worker claims from it until
it is resumed; jobs already claimed or running finish normally. The state lives in
``pgqueue_queues`` (``QueueState``), which
``claim_job_batch`` reads on every claim, so pausing takes effect at every worker's next
claim without restarting anything.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import connections, transaction

from . import conf, registry, stats, validation
from .limits import stored_limits
from .models import LimitScope, notify_queues

logger = logging.getLogger("django_pgqueue.queues")

__all__ = [
    "QueueInfo",
    "describe_queues",
    "known_queues",
    "pause_queue",
    "paused_queues",
    "paused_since",
    "queue_limits",
    "resume_queue",
]


def pause_queue(name: str, *, using: str | None = None) -> bool:
    """Stop workers from claiming jobs of queue ``name``; True if it was not paused.

    The queue need not have jobs yet. Running jobs are not interrupted.

    The queue stays paused until it is resumed: jobs already claimed or running finish,
    and ``enqueue()`` keeps accepting jobs for it. Also ``django_pgqueue.pause_queue``.
    See [Pause and resume queues](../how-to/pause-queues.md).

    Args:
        name: The queue.
        using: Database alias. Default: ``PGQUEUE["DATABASE"]``.

    Returns:
        ``True`` if the queue was active, ``False`` if it was already paused (nothing
            changes).

    Raises:
        InvalidArgumentError: For an invalid queue name (``field`` ``"queue"``).
    """
    validation.queue(name)
    alias = conf.jobs_database(using)
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_queues (name, paused_at, updated_at) VALUES (%s, now(), now()) "
            "ON CONFLICT (name) DO UPDATE SET paused_at = now(), updated_at = now() "
            "WHERE pgqueue_queues.paused_at IS NULL RETURNING name",
            [name],
        )
        changed = cursor.fetchone() is not None
    if changed:
        logger.info("queue %s paused", name)
    return changed


def resume_queue(name: str, *, using: str | None = None) -> bool:
    """Let workers claim jobs of queue ``name`` again; True if it was paused.

    Idle workers serving the queue are woken by ``NOTIFY`` (when ``PGQUEUE["NOTIFY"]``
    is on) once the caller's transaction commits, so its due jobs start at once.

    Also ``django_pgqueue.resume_queue``. Returns ``False`` when the queue was not
    paused (nothing changes). Same ``using`` and errors as
    [`pause_queue()`][django_pgqueue.queues.pause_queue].
    """
    validation.queue(name)
    alias = conf.jobs_database(using)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_queues SET paused_at = NULL, updated_at = now() "
            "WHERE name = %s AND paused_at IS NOT NULL RETURNING name",
            [name],
        )
        changed = cursor.fetchone() is not None
        if changed:
            notify_queues(alias, [name])
    if changed:
        logger.info("queue %s resumed", name)
    return changed


def paused_queues(using: str | None = None) -> list[str]:
    """Names of the paused queues, sorted."""
    return sorted(paused_since(using))


def paused_since(using: str | None = None) -> dict[str, datetime]:
    """When each paused queue was paused."""
    with connections[conf.jobs_database(using)].cursor() as cursor:
        cursor.execute("SELECT name, paused_at FROM pgqueue_queues WHERE paused_at IS NOT NULL")
        return dict(cursor.fetchall())


def queue_limits(using: str | None = None) -> dict[str, int]:
    """The concurrency limit of each limited queue, as workers enforce it now."""
    return {
        name: limit
        for (scope, name), limit in stored_limits(conf.jobs_database(using)).items()
        if scope == LimitScope.QUEUE
    }


@dataclass(frozen=True)
class QueueInfo:
    """A queue as ``pgqueue_queue list`` shows it."""

    name: str
    """The queue's name."""
    paused_at: datetime | None
    """When it was paused; ``None``: active."""
    pending: int
    """Pending jobs, due or delayed."""
    running: int
    """Claimed or running jobs."""
    limit: int | None
    """The queue's concurrency limit (``None``: unlimited)."""

    @property
    def paused(self) -> bool:
        """Whether the queue is paused."""
        return self.paused_at is not None


def known_queues(using: str | None = None) -> list[str]:
    """The names of the queues ``describe_queues()`` describes."""
    return [info.name for info in describe_queues(using)]


def describe_queues(using: str | None = None) -> list[QueueInfo]:
    """Every queue worth showing, sorted by name, with its state and active jobs.

    The figures are those of the read model (:func:`django_pgqueue.stats.snapshot`):
    the queues it reports (active, recently finished, paused, limited or served by a
    worker by name), the default queue and the queues of registered job types.
    """
    snapshot = stats.snapshot(using=using)
    found = {queue.name: queue for queue in snapshot.queues}
    names = {*found, conf.get_settings().DEFAULT_QUEUE}
    for job_type in registry.registered_job_types():
        queue = registry.get_definition(job_type).queue
        if queue:
            names.add(queue)
    described = []
    for name in sorted(names):
        figures = found.get(name) or stats.QueueStats(name=name)
        described.append(
            QueueInfo(
                name=name,
                paused_at=figures.paused_at,
                pending=figures.pending + figures.scheduled,
                running=figures.claimed + figures.running,
                limit=figures.max_running,
            )
        )
    return described
