"""``JobQuerySet``: the state transitions that apply to many jobs at once."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from django.db import IntegrityError, connections, models, transaction
from django.db.models import Case, Exists, ExpressionWrapper, OuterRef, Q, Value, When
from django.db.models.functions import Now

from .. import conf
from ..due import not_yet_due_q
from ..exceptions import PgQueueError
from ..held import release_keys
from ..schema import ACTIVE, CANCELLABLE, IN_FLIGHT, RETRYABLE, JobStatus, literal, open_wait
from .dependencies import JobWait

if TYPE_CHECKING:
    from .jobs import Job

logger = logging.getLogger("django_pgqueue.models")


#: ``retry()`` runs its update again at most this many times when new jobs take the keys.
UNIQUE_RETRY_ROUNDS = 10


class JobQuerySet(models.QuerySet["Job"]):
    """State transitions that apply to many jobs at once; each returns the rows changed.

    The query set of ``Job.objects``. ``retry()`` and ``run_now()``, when they changed
    any row and ``PGQUEUE["NOTIFY"]`` is ``True``, also send a ``NOTIFY`` on
    ``PGQUEUE["NOTIFY_CHANNEL"]`` for each queue of the jobs they made due, like
    ``enqueue()`` does: PostgreSQL delivers it when the transaction commits, and idle
    workers serving those queues pick the jobs up at once instead of at their next poll.
    """

    def cancel(self) -> int:
        """Cancel pending and waiting jobs at once and ask workers to stop claimed or
        running ones.

        Returns how many jobs were cancelled or had cancellation requested.

        The selected ``pending`` and ``waiting`` jobs become ``cancelled``
        (``completed_at`` set), and so, in the same transaction, do the waiting jobs that
        [depend on them](../how-to/workflows.md#when-a-dependency-fails) under
        ``"cancel"``; the
        selected ``claimed`` and ``running`` jobs that have no request yet get
        ``cancel_requested_at`` set. The result is the sum of both counts. Finished jobs
        are not touched. See [Cancel jobs](../how-to/cancel.md).

        Cancelling jobs of a [per-key limit](../how-to/per-key-concurrency.md) releases
        held jobs of their keys to take their places.
        """
        cancellable = self.filter(status__in=CANCELLABLE)
        keys = _keys_of(cancellable)
        cancelled = cancellable.update(status=JobStatus.CANCELLED, completed_at=Now(), held=False)
        if cancelled and keys:
            release_keys(_write_db(self), keys)
        requested = self.filter(status__in=IN_FLIGHT, cancel_requested_at__isnull=True).update(
            cancel_requested_at=Now()
        )
        return cancelled + requested

    def retry(self) -> int:
        """Put failed or cancelled jobs back to pending, due now, with attempts reset.

        A job that still waits for [dependencies](../how-to/workflows.md) goes back to
        ``waiting`` instead, and the jobs that its failure cancelled go back to
        ``waiting`` too.

        A job whose ``unique_key`` is held by an active job stays as it is, and so do all
        but the newest of several selected jobs sharing a key: those are skipped (and
        logged), never an ``IntegrityError``. Returns the number of jobs retried.

        Jobs with a [concurrency key](../how-to/per-key-concurrency.md) come back held,
        and as many as their keys have room for are released at once, as at enqueue.

        The selected ``failed`` and ``cancelled`` jobs get ``attempts`` 0, ``snoozes`` 0,
        ``progress`` 0, ``worker_ids`` ``[]``, and ``worker_id``, ``claimed_at``,
        ``started_at``, ``heartbeat_at``, ``completed_at`` and ``cancel_requested_at``
        cleared. Other jobs are not touched. Sends a ``NOTIFY`` for their queues (see above).

        Skipped jobs (they stay ``failed`` or ``cancelled``) are not counted in the result
        and are logged at ``WARNING`` on ``django_pgqueue.models``: a retry never breaks
        the one-active-job-per-key rule. The update runs in a savepoint and is repeated
        when a job with one of the keys is enqueued concurrently (after 10 such rounds,
        ``PgQueueError``).
        """
        eligible = self.filter(status__in=RETRYABLE)
        queues = _queues_of(eligible)
        using = _write_db(self)
        held = self.model.objects.filter(unique_key=OuterRef("unique_key"), status__in=ACTIVE)
        # One job per free key: the newest. DISTINCT ON keeps its ORDER BY in a subquery.
        free = (
            eligible.filter(unique_key__isnull=False)
            .filter(~Exists(held))
            .order_by("unique_key", "-created_at", "-id")
            .distinct("unique_key")
            .values("pk")
        )
        retryable = eligible.filter(Q(unique_key__isnull=True) | Q(pk__in=free))
        keys = _keys_of(retryable)
        # A job that still waits for dependencies goes back to waiting, not pending.
        waits = JobWait._base_manager.filter(job=OuterRef("pk"))
        for _round in range(UNIQUE_RETRY_ROUNDS):
            try:
                # A savepoint: a job enqueued with one of the keys meanwhile (committed
                # after this statement's snapshot) violates the unique index; run again.
                with transaction.atomic(using=using):
                    changed = retryable.update(
                        status=Case(
                            When(Exists(waits), then=Value(JobStatus.WAITING.value)),
                            default=Value(JobStatus.PENDING.value),
                        ),
                        attempts=0,
                        snoozes=0,
                        run_at=Now(),
                        worker_id=None,
                        claimed_at=None,
                        started_at=None,
                        heartbeat_at=None,
                        completed_at=None,
                        cancel_requested_at=None,
                        progress=0,
                        worker_ids=[],
                        held=ExpressionWrapper(
                            Q(concurrency_key__isnull=False) & ~Exists(waits),
                            output_field=models.BooleanField(),
                        ),
                    )
                break
            except IntegrityError:
                continue
        else:
            raise PgQueueError(
                "retry: unique keys of the selected jobs kept being taken by new jobs; try again"
            )
        skipped = eligible.filter(unique_key__isnull=False).count()
        if skipped:
            logger.warning(
                "retry skipped %d job(s) whose unique_key is held by an active job "
                "(or by a newer selected job with the same key)",
                skipped,
            )
        if changed and keys:
            release_keys(using, keys)
        notify_queues(using, queues if changed else [])
        return changed

    def run_now(self) -> int:
        """Make delayed pending jobs due immediately.

        The selected ``pending`` jobs whose ``run_at`` is in the future; sends a ``NOTIFY``
        for their queues (see above).
        """
        eligible = self.filter(not_yet_due_q(), status=JobStatus.PENDING)
        queues = _queues_of(eligible)
        changed = eligible.update(run_at=Now())
        notify_queues(_write_db(self), queues if changed else [])
        return changed

    def end_waits(self) -> int:
        """End the sleeps and waits for events of the selected suspended jobs now, and
        make them due: a sleep is over, a wait times out (``EventTimeout`` in the
        handler). Returns how many jobs it changed.

        Only ``pending`` jobs with a sleep or a wait not over yet (``job.sleep()``,
        ``job.wait_for_event()``); sends a ``NOTIFY`` for their queues (see above).
        """
        return len(self.end_waits_of())

    def end_waits_of(self) -> list[uuid.UUID]:
        """``end_waits()``, returning the ids of the jobs it changed."""
        alias = _write_db(self)
        ids = list(self.using(alias).filter(status=JobStatus.PENDING).values_list("pk", flat=True))
        if not ids:
            return []
        with connections[alias].cursor() as cursor:
            cursor.execute(_END_WAITS, [ids])
            rows = cursor.fetchall()
        notify_queues(alias, sorted({queue for _, queue in rows}))
        return [job_id for job_id, _ in rows]


# The sleeps not over and the waits not received nor timed out (the steps' checkpoints)
# end now, and their jobs are due now.
_END_WAITS = f"""
WITH ended AS (
UPDATE pgqueue_job_steps AS s
   SET wake_at = now()
 WHERE s.job_id = ANY (%s::uuid[])
   AND {open_wait("s")}
RETURNING s.job_id
)
UPDATE pgqueue_jobs AS j
   SET run_at = least(j.run_at, now())
 WHERE j.id IN (SELECT job_id FROM ended) AND j.status = {literal(JobStatus.PENDING)}
RETURNING j.id, j.queue
"""


def _keys_of(jobs: models.QuerySet[Job]) -> list[tuple[str, str]]:
    """The ``(job_type, concurrency_key)`` keys of the selected jobs that have one."""
    keyed = jobs.using(_write_db(jobs)).filter(concurrency_key__isnull=False).order_by()
    pairs = keyed.values_list("job_type", "concurrency_key").distinct()
    return [(job_type, key) for job_type, key in pairs if key is not None]


def _queues_of(jobs: models.QuerySet[Job]) -> list[str]:
    # Read where the update will write: a read replica may lag behind.
    return list(jobs.using(_write_db(jobs)).order_by().values_list("queue", flat=True).distinct())


def _write_db(jobs: models.QuerySet[Job]) -> str:
    # _db: the alias the caller chose with using() (None: the router's); not in django-stubs.
    return conf.jobs_database(jobs._db)  # type: ignore[attr-defined]


def notify_queues(using: str, queues: list[str]) -> None:
    """Wake idle workers of ``queues`` (on commit, like ``enqueue`` does)."""
    settings = conf.get_settings()
    if not queues or not settings.NOTIFY:
        return
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT pg_notify(%s, queue) FROM unnest(%s::text[]) AS queue",
            [settings.NOTIFY_CHANNEL, queues],
        )
