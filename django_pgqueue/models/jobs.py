"""The ``Job`` model: one row of ``pgqueue_jobs``, and its events."""

from __future__ import annotations

import functools
import operator
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, Protocol, Self, TypeVar, cast

from asgiref.sync import sync_to_async
from django.contrib.postgres.functions import RandomUUID
from django.db import connections, models, transaction
from django.db.models import Q, Value
from django.db.models.base import ModelState
from django.db.models.functions import Now
from django.db.models.signals import post_init, pre_init
from django.utils.translation import gettext_lazy as _

from .. import conf, schema, waiting
from ..due import CLAIM_INDEX_FIELDS
from ..exceptions import InvalidJobError, JobCancelled, StepError
from ..indexes import GinIndex
from ..progress import write_progress
from ..schema import ACTIVE, FINISHED, IN_FLIGHT, RETRYABLE, JobStatus
from ..steps import arun_step, clear_checkpoints_from, run_step, sleep, wait_for_event
from .base import JobsDatabaseManager, JobsDatabaseModel
from .dependencies import JobDependency
from .transitions import JobQuerySet

T = TypeVar("T")


class _CancelSignal(Protocol):
    """What the worker gives a running job to tell it cancellation was asked for."""

    def is_set(self) -> bool: ...


#: Codename of the permission to retry, cancel and run jobs now (``django_pgqueue.retry_job``).
RETRY_PERMISSION = "retry_job"


# The rows of each partial index below that has one state class as its predicate:
# together, every job in every state, so a filter ANDed with ``EVERY_JOB_BY_STATE`` can
# be served by a bitmap scan of these indexes for a value few jobs have (the admin's
# queue and job type filters). Held jobs always have a key (only the key limits' sweep
# holds a job, and only a keyed one).
_CLAIMABLE_ROWS = Q(status=JobStatus.PENDING.value, held=False)
_KEYED_PENDING_ROWS = Q(status=JobStatus.PENDING.value, concurrency_key__isnull=False)
_IN_FLIGHT_ROWS = Q(status__in=schema.values(IN_FLIGHT))
_FINISHED_ROWS = Q(status__in=schema.values(FINISHED))
_WAITING_ROWS = Q(status=JobStatus.WAITING.value)

#: Every job, written as one alternative per partial index (see above). Always true;
#: ``Job.objects.filter(Q(queue=...) & EVERY_JOB_BY_STATE)`` lets PostgreSQL choose
#: between walking ``idx_jobs_created`` (a common value) and a ``BitmapOr`` of those
#: indexes (a rare one).
EVERY_JOB_BY_STATE = (
    _FINISHED_ROWS
    | _CLAIMABLE_ROWS
    | (_KEYED_PENDING_ROWS & Q(held=True))
    | _IN_FLIGHT_ROWS
    | _WAITING_ROWS
)


#: ``Job.objects``: the transitions of ``JobQuerySet`` on the jobs database.
JobManager = JobsDatabaseManager.from_queryset(JobQuerySet)


class Job(JobsDatabaseModel):
    """A unit of background work.

    Create jobs with [`enqueue()`][django_pgqueue.enqueue.enqueue], not
    ``Job.objects.create``: enqueue validates the payload and wakes idle workers.

    One row of the ``pgqueue_jobs`` table; also ``django_pgqueue.Job``. App label
    ``django_pgqueue``; default ordering newest first (``-created_at``).

    ``Job.objects`` (a [`JobQuerySet`][django_pgqueue.models.JobQuerySet]), like the
    managers of the app's other models (``JobEvent``, ``WorkerRecord``, ``QueueState``,
    ``ConcurrencyLimit``, ``PeriodicTick``), queries ``PGQUEUE["DATABASE"]``, not the
    database router's choice; ``using()`` picks another alias. An instance is saved,
    deleted, reloaded, cancelled or retried in the database it was loaded from.

    Attributes:
        id (UUIDField): Primary key, default ``gen_random_uuid()``. ``enqueue()`` gives
            each job a
            [version 7 UUID](https://www.rfc-editor.org/rfc/rfc9562#name-uuid-version-7):
            time-ordered, so ids of later jobs sort after earlier ones (to the
            millisecond) and inserts append to the primary key.
        job_type (CharField): Which handler runs the job.
        queue (CharField): The queue the job is in. Default ``"default"``.
        priority (IntegerField): 0 to 1000, higher first. Default 100.
        status (CharField): Where the job is in its life cycle, a
            [`JobStatus`][django_pgqueue.JobStatus]. Default ``"pending"``.
        data (JSONField): The payload. Default ``{}``.
        result (JSONField): What the handler returned, when it completed and the value
            was JSON-serialisable; nullable, default ``NULL``.
        progress (SmallIntegerField): Percent, 0 to 100; set to 100 on completion.
            Default 0.
        current_stage (CharField): Label given to the last ``set_progress()``.
            Default ``""``.
        events_count (IntegerField): How many times ``set_progress()`` wrote progress.
            Default 0.
        worker_id (CharField): The worker holding the job, or the one that finished
            it. ``NULL`` while pending.
        worker_ids (JSONField): The worker of every attempt, oldest first. An attempt that
            is [given back](../how-to/retries.md#how-attempts-are-counted) is removed from
            it. ``retry()`` resets it to ``[]``. Default ``[]``.
        created_at (DateTimeField): Default: the time of the insert.
        run_at (DateTimeField): The job is not claimed before this time. Default: the
            time of the insert.
        claimed_at (DateTimeField): When the current or last attempt was claimed;
            nullable.
        started_at (DateTimeField): When the current or last attempt started; nullable.
        heartbeat_at (DateTimeField): Last sign of life from the worker holding the job;
            nullable.
        completed_at (DateTimeField): When the job became ``completed``, ``failed`` or
            ``cancelled``; nullable.
        cancel_requested_at (DateTimeField): When cancellation of the claimed or running
            job was requested; nullable.
        attempts (IntegerField): Attempts made so far, counted at claim time. Default 0.
        max_attempts (IntegerField): Attempts allowed before the job ends ``failed``.
            Default 3.
        snoozes (IntegerField): How many times the handler
            [snoozed](../how-to/snooze.md) the job (``raise Snooze(...)``); a snooze
            spends no attempt. ``retry()`` resets it to 0. Default 0.
        last_error (TextField): ``"<ExceptionType>: <message>"`` of the last failure, why
            recovery took the job back, or a note that a return value could not be
            stored. Kept after a later success. Default ``""``.
        error_class (CharField): The exception class ``last_error`` begins with
            (``"ValueError: ..."`` is ``ValueError``), else ``""``; at most 200
            characters. Written by the database whenever an update changes
            ``last_error`` (trigger ``pgqueue_jobs_error_class``), for the admin's errors
            page and its ``error`` filter. Default ``""``.
        last_traceback (TextField): Traceback of the last failure. Default ``""``.
        unique_key (CharField): The job's
            [unique key](../how-to/unique-jobs.md): no two ``pending``, ``claimed`` or
            ``running`` jobs share one (partial unique index
            ``pgqueue_jobs_unique_key_active``). ``NULL`` (the default): no key.
        concurrency_key (CharField): The job's key under a
            [per-key concurrency limit](../how-to/per-key-concurrency.md), from
            ``@job(concurrency_key=...)``. ``NULL`` (the default): no key.
        held (BooleanField): ``True`` while the job is pending but left out of the claim
            because its key already has as many due jobs waiting as its limit; it is
            released, in claim order, as they are claimed or cancelled. Default
            ``False``.
        lost_with_worker (BooleanField): ``True`` once a run of the job was lost with
            its worker: recovery took the job back, running, from a worker that stopped
            heartbeating. A worker holds at most one such job at a time, so a job that
            kills its worker cannot take another such job with it again (see
            [Guarantees](../explanation/guarantees.md#a-job-that-kills-its-worker)). Default
            ``False``.
        workflow_id (UUIDField): The workflow the job is a step of: jobs enqueued with
            ``depends_on``, the jobs they depend on, and every job of an
            ``enqueue_many`` call with dependencies share one. ``NULL`` (the default):
            not in a workflow. See [Workflows](../how-to/workflows.md).

    Defaults are database defaults, so rows inserted with SQL get them too. See
    [SQL schema](sql.md#the-pgqueue_jobs-table) for the column types and lengths, the
    constraints and the indexes.

    ``cancel()`` and ``retry()`` do not update the instance: call ``refresh_from_db()``
    to see the new status.
    """

    id = models.UUIDField(primary_key=True, db_default=RandomUUID(), editable=False)
    job_type = models.CharField(max_length=schema.JOB_TYPE_MAX_LENGTH)
    queue = models.CharField(max_length=schema.QUEUE_MAX_LENGTH, db_default="default")
    priority = models.IntegerField(db_default=100)
    status = models.CharField(
        max_length=16, choices=JobStatus.choices, db_default=JobStatus.PENDING.value
    )
    data = models.JSONField(default=dict, db_default=Value({}, models.JSONField()))
    result = models.JSONField(null=True, blank=True)
    progress = models.SmallIntegerField(db_default=0)
    current_stage = models.CharField(max_length=schema.STAGE_MAX_LENGTH, blank=True, db_default="")
    events_count = models.IntegerField(db_default=0)
    # NULL, not "", means "no worker": SQL written against the pattern tests IS NULL.
    worker_id = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(db_default=Now())
    run_at = models.DateTimeField(db_default=Now())
    claimed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(db_default=0)
    max_attempts = models.IntegerField(db_default=3)
    snoozes = models.IntegerField(db_default=0)
    last_error = models.TextField(blank=True, db_default="")
    last_traceback = models.TextField(blank=True, db_default="")
    #: The exception class ``last_error`` begins with, else ""; the database writes it
    #: (sql/error_class_v1.sql) when an update changes last_error.
    error_class = models.CharField(
        max_length=schema.ERROR_CLASS_MAX_LENGTH, blank=True, db_default="", editable=False
    )
    #: The worker of every attempt, oldest first (``claim_job_batch`` appends to it).
    worker_ids = models.JSONField(default=list, db_default=Value([], models.JSONField()))
    #: At most one pending, claimed or running job has a given key (NULL: no limit).
    unique_key = models.CharField(  # noqa: DJ001  (NULL, not "", means "no key")
        max_length=schema.UNIQUE_KEY_MAX_LENGTH, null=True, blank=True
    )
    #: The key of a per-key concurrency limit (``@job(concurrency_key=...)``); NULL: none.
    concurrency_key = models.CharField(  # noqa: DJ001  (NULL, not "", means "no key")
        max_length=schema.CONCURRENCY_KEY_MAX_LENGTH, null=True, blank=True
    )
    #: Pending, but left out of the claim until its key has room (sql/key_limits_v1.sql).
    held = models.BooleanField(db_default=False)
    #: The workflow the job is a step of (``depends_on``); NULL: none. Its finish and
    #: retry settle the steps that depend on it (sql/workflow_settle_v1.sql).
    workflow_id = models.UUIDField(null=True, blank=True)
    #: A run of the job was lost with its worker: recovery took it back, running, from a
    #: worker that stopped heartbeating (sql/recover_stale_jobs_v4.sql). A worker holds
    #: at most one such job at a time (sql/claim_job_batch_v10.sql).
    lost_with_worker = models.BooleanField(db_default=False, editable=False)
    #: Someone waits for its finish (``wait()``): it then notifies ``pgqueue_finished``
    #: (sql/notify_finished_v1.sql).
    awaited = models.BooleanField(db_default=False)
    #: Seconds an attempt may run, given to ``enqueue(timeout=...)``; NULL: the job
    #: type's ``@job(timeout=...)``, if any.
    timeout = models.FloatField(null=True, blank=True)
    #: The trace context of the enqueue, as the OpenTelemetry propagator writes it
    #: (``{"traceparent": ...}``); NULL: enqueued without ``PGQUEUE["OPENTELEMETRY"]``
    #: or outside any trace. Each run's span continues it (``tracing``).
    trace_context = models.JSONField(null=True, blank=True, editable=False)

    objects: ClassVar[JobManager[Self]] = JobManager()

    class Meta:
        db_table = "pgqueue_jobs"
        ordering = ("-created_at",)
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        permissions = [(RETRY_PERMISSION, _("Can retry, cancel and run jobs now"))]
        indexes = [
            # The claim walks this index in claim order and filters on the trailing
            # columns inside the index, so only due, matching rows are fetched and locked.
            models.Index(
                fields=[*CLAIM_INDEX_FIELDS, "queue", "job_type"],
                name="idx_jobs_claimable",
                # CLAIMABLE, its one state, without the jobs held back by a key's limit.
                condition=_CLAIMABLE_ROWS,
            ),
            # Per-key limits: a key's visible and held pending jobs, in claim order ...
            models.Index(
                fields=["job_type", "concurrency_key", "held", *CLAIM_INDEX_FIELDS],
                name="idx_jobs_keyed",
                condition=_KEYED_PENDING_ROWS,
            ),
            # ... and its jobs in flight, which the claim counts.
            models.Index(
                fields=["job_type", "concurrency_key"],
                name="idx_jobs_keyed_in_flight",
                condition=Q(status__in=schema.values(IN_FLIGHT), concurrency_key__isnull=False),
            ),
            models.Index(
                fields=["worker_id", "heartbeat_at"],
                name="idx_jobs_worker",
                condition=_IN_FLIGHT_ROWS,
            ),
            # The claim's test of whether a worker holds a job lost with its worker: empty
            # but for such jobs in flight, so the test costs a claim next to nothing.
            models.Index(
                fields=["worker_id"],
                name="idx_jobs_lost_in_flight",
                condition=Q(status__in=schema.values(IN_FLIGHT), lost_with_worker=True),
            ),
            GinIndex(fields=["data"], name="idx_jobs_data", opclasses=["jsonb_path_ops"]),
            # Pruning deletes the oldest finished rows first (pruning.py).
            models.Index(
                fields=["completed_at"],
                name="idx_jobs_finished",
                condition=_FINISHED_ROWS,
            ),
            # The admin's errors page groups failed jobs by job type and error class, the
            # newest of each group first, from the index alone: its cost follows the
            # failed jobs, not the table (a small index, written only for rows that fail).
            models.Index(
                fields=["job_type", "error_class", "completed_at"],
                name="idx_jobs_failed",
                condition=Q(status=JobStatus.FAILED.value),
                # The overview counts failed jobs per queue from the index alone.
                include=["queue"],
            ),
            # The admin lists newest first (then by id, for a stable order): without it
            # every page of the changelist sorts the whole table.
            models.Index(fields=["created_at", "id"], name="idx_jobs_created"),
            # The admin's filters on a queue or a job type find the jobs of a value that
            # few jobs have through these and the other states' own indexes
            # (EVERY_JOB_BY_STATE); each is written once a job, when it finishes. A
            # common value walks idx_jobs_created instead.
            models.Index(
                fields=["queue"],
                name="idx_jobs_finished_queue",
                condition=_FINISHED_ROWS,
            ),
            models.Index(
                fields=["job_type"],
                name="idx_jobs_finished_job_type",
                condition=_FINISHED_ROWS,
            ),
            # Waiting jobs have no other index on their status; only jobs enqueued with
            # dependencies are ever written to it.
            models.Index(
                fields=["queue", "job_type"],
                name="idx_jobs_waiting",
                condition=_WAITING_ROWS,
            ),
            # A workflow's steps, for its page and for cancelling it.
            models.Index(
                fields=["workflow_id", "created_at"],
                name="idx_jobs_workflow",
                condition=Q(workflow_id__isnull=False),
            ),
            # unique_for: the jobs with a key enqueued within a window, in any state.
            models.Index(
                fields=["unique_key", "created_at"],
                name="idx_jobs_unique_recent",
                condition=Q(unique_key__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=JobStatus.values), name="pgqueue_jobs_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(progress__gte=0, progress__lte=100),
                name="pgqueue_jobs_progress_percent",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=schema.PRIORITY_MIN, priority__lte=schema.PRIORITY_MAX),
                name="pgqueue_jobs_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1), name="pgqueue_jobs_max_attempts_positive"
            ),
            models.CheckConstraint(
                condition=Q(attempts__gte=0), name="pgqueue_jobs_attempts_not_negative"
            ),
            # Enqueue relies on it (INSERT ... ON CONFLICT) for race-free unique jobs.
            # Only rows with a key are in it: jobs without one cost it nothing.
            models.UniqueConstraint(
                fields=["unique_key"],
                condition=Q(unique_key__isnull=False, status__in=schema.values(ACTIVE)),
                name="pgqueue_jobs_unique_key_active",
            ),
        ]

    # Set by the worker while it runs the job; see ``is_cancel_requested``.
    _cancel_event: _CancelSignal | None = None
    # False on the test kit's run_job() copies: steps run, and nothing is stored.
    _store_steps: bool = True

    def __str__(self) -> str:
        return f"{self.job_type} [{self.status}] {self.id}"

    @property
    def attempt_started_at(self) -> datetime | None:
        """When the current attempt's handler started; ``None`` while ``pending``: a job
        waiting for its retry keeps the previous attempt's ``started_at`` until it is
        claimed again."""
        return None if self.status == JobStatus.PENDING else self.started_at

    def dependency_results(self) -> dict[uuid.UUID, Any]:
        """The results of the jobs this one [depends on](../how-to/workflows.md), by id,
        in the order they were given.

        One query. A dependency that did not complete (failed or cancelled, under
        ``on_dependency_failure="run"``), returned nothing or a value that could not be
        stored, gives ``None``; so does one that was pruned. ``{}`` for a job without
        dependencies. In a chord's callback, ``list(job.dependency_results().values())``
        are the members' results in the order of the group.
        """
        edges = JobDependency.objects.using(self._state.db).filter(job_id=self.pk)
        return dict(edges.order_by("id").values_list("dependency_id", "dependency__result"))

    def dependency_outcome(self) -> DependencyOutcome:
        """How the jobs this one [depends on](../how-to/workflows.md) ended: how many
        completed, and which failed or were cancelled (by id, in the order given).

        One query. A batch's callbacks read it (``on_complete``, ``on_failure``); jobs
        not finished yet (a dependency retried since) are counted in ``unfinished``.
        """
        edges = JobDependency.objects.using(self._state.db).filter(job_id=self.pk)
        outcome = DependencyOutcome()
        for dependency_id, status in edges.order_by("id").values_list(
            "dependency_id", "dependency__status"
        ):
            if status == JobStatus.COMPLETED:
                outcome.completed += 1
            elif status == JobStatus.FAILED:
                outcome.failed.append(dependency_id)
            elif status == JobStatus.CANCELLED:
                outcome.cancelled.append(dependency_id)
            else:
                outcome.unfinished += 1  # retried, or pruned (status None)
        return outcome

    @property
    def is_finished(self) -> bool:
        """``True`` when the status is ``completed``, ``failed`` or ``cancelled``."""
        return self.status in FINISHED

    def set_progress(self, percent: int, stage: str | None = None) -> bool:
        """Record progress (0-100), optionally the current stage, and a ``JobEvent``.

        The write (one statement) is committed immediately, outside any transaction the
        handler is in, so the admin shows it while the job is still running. Returns
        False, writing nothing, when the job is no longer claimed or running by this
        job's worker (it finished, or recovery gave it to another worker).

        Updates ``progress``, ``current_stage`` (only when ``stage`` is given) and
        ``events_count`` in the database and on the instance, and records a
        [`JobEvent`][django_pgqueue.models.JobEvent] in the same SQL statement. Inside a
        transaction the write goes through a separate autocommit connection, so it is
        visible to others immediately and survives a rollback of the handler's
        transaction. That side connection is one per thread and database, opened directly
        with psycopg (never taken from Django's connection pool), closed when a worker's
        slot thread ends and at the end of every request, and otherwise kept open. It
        sets ``lock_timeout = '10s'``: a write that waits on a row lock (for example one
        held by the caller's own transaction) fails after 10 seconds instead of waiting
        forever.

        It writes only while the job is ``claimed`` or ``running`` and held by the worker
        recorded on this instance (its ``worker_id``). Otherwise (the job has finished, is
        still ``pending``, or was recovered and handed to another worker) it writes
        nothing and leaves the instance unchanged.

        Args:
            percent: An integer from 0 to 100.
            stage: A string of at most 200 characters without NUL characters or lone
                surrogates; ``None`` keeps ``current_stage``.

        Returns:
            ``True`` when the progress was written, ``False`` otherwise.

        Raises:
            InvalidJobError: For invalid arguments (``field`` ``"percent"`` or
                ``"stage"``).
            DatabaseError: Django's, whichever connection was used
                (``OperationalError`` for a lost connection).
        """
        if not isinstance(percent, int) or isinstance(percent, bool) or not 0 <= percent <= 100:
            raise InvalidJobError("percent", f"must be an integer from 0 to 100, got {percent!r}")
        if stage is not None and (
            not isinstance(stage, str)
            or len(stage) > schema.STAGE_MAX_LENGTH
            or "\x00" in stage
            or not stage.encode(errors="ignore").decode() == stage
        ):
            raise InvalidJobError(
                "stage",
                f"must be text of at most {schema.STAGE_MAX_LENGTH} characters, "
                "without NUL characters or lone surrogates",
            )
        if not write_progress(self, percent, stage):
            return False
        self.progress = percent
        if stage is not None:
            self.current_stage = stage
        self.events_count += 1
        return True

    async def aset_progress(self, percent: int, stage: str | None = None) -> bool:
        """``set_progress()`` for async code, such as an ``async def`` handler.

        The same arguments, result and errors; the write runs in Django's thread for
        async ORM calls (``sync_to_async``), so the event loop is not blocked.
        """
        return await sync_to_async(self.set_progress)(percent, stage)

    def step(
        self, name: str, func: Callable[..., T], /, *args: Any, atomic: bool = False, **kwargs: Any
    ) -> T:
        """Run ``func(*args, **kwargs)`` as the durable step ``name`` of this job: the
        first attempt to reach it calls the function and stores its result; every later
        attempt of the job gets the stored result back without calling it.

        ```python
        @job("shop.checkout")
        def checkout(job):
            charge = job.step("charge", payments.charge, job.data["order_id"])
            job.step("receipt", mail.send_receipt, job.data["order_id"], charge["id"])
        ```

        A step that raises stores nothing: the attempt fails as usual, and the retry
        runs it again. Steps are matched by name, not by position, so the code around
        them may change between attempts. See [Durable steps](../how-to/steps.md).

        Args:
            name: The step's name within the job: 1 to 200 characters, no NUL.
            func: What the step does. Its return value must be JSON (as a payload is,
                within ``PGQUEUE["MAX_PAYLOAD_BYTES"]``); it comes back through JSON,
                the first time too (a tuple is returned as a list).
            *args: Passed to ``func``.
            atomic: Run ``func`` and store its result in one transaction on the jobs
                database: its writes there and the checkpoint commit together, so the
                step happens exactly once even if the worker dies right after it.
                Without it the checkpoint is committed right after ``func`` returns, on
                its own, even when the handler's transaction later rolls back: a worker
                killed in between runs the step again (at least once).
            **kwargs: Passed to ``func``.

        Returns:
            The step's result, as JSON gives it back.

        Raises:
            InvalidArgumentError: For an invalid name, or a result that is not JSON or
                is too large; nothing is stored.
            StepError: Outside a running job, for a name already used in this attempt,
                or for an atomic step whose job is no longer held by this attempt.
        """
        return cast(T, run_step(self, name, func, args, kwargs, atomic))

    async def astep(
        self,
        name: str,
        func: Callable[..., Any],
        /,
        *args: Any,
        atomic: bool = False,
        **kwargs: Any,
    ) -> Any:
        """``step()`` for an ``async def`` handler: ``func`` may be a coroutine function
        (``async def``), awaited on the handler's event loop, or a plain one, run in
        Django's thread for sync code (``sync_to_async``).

        ```python
        @job("shop.sync_crm", atomic=False)
        async def sync_crm(job):
            contact = await job.astep("contact", crm.aupsert_contact, job.data["email"])
            await job.astep("tag", crm.tag_contact, contact["id"], "customer")
        ```

        The same arguments, result and errors as ``step()``. An atomic step
        (``atomic=True``) takes a plain function only: Django runs no transaction
        across awaits, so an async one raises ``StepError``.
        """
        return await arun_step(self, name, func, args, kwargs, atomic)

    def sleep(self, name: str, duration: float | timedelta) -> None:
        """Sleep for ``duration`` inside the handler, as the durable step ``name``: the
        job is suspended and gives up its slot, then runs again once the sleep is over,
        without spending an attempt.

        ```python
        @job("shop.settle", atomic=False)
        def settle(job):
            charge = job.step("charge", payments.charge, job.data["order_id"])
            job.sleep("settlement", timedelta(days=2))
            job.step("capture", payments.capture, charge["id"])
        ```

        The first time, the sleep's end is stored as a checkpoint and ``JobSuspended``
        is raised: the worker sets the job ``pending``, due at that end. The handler
        then runs from the start again: its steps return their checkpoints, and this
        call returns (the end stays as first stored, across retries and restarts).
        Staff can end a sleep early from the admin. Let ``JobSuspended`` propagate.
        See [Durable steps](../how-to/steps.md#sleep-for-days).

        Args:
            name: The sleep's name within the job, unique among its steps, sleeps and
                waits: 1 to 200 characters, no NUL.
            duration: Seconds or a ``timedelta``, from 0 to 1,000 years.

        Raises:
            JobSuspended: Until the sleep is over.
            InvalidArgumentError: For an invalid name or duration.
            StepError: Outside a running job, or for a name already used in this attempt
                or stored as a step or a wait.
        """
        sleep(self, name, duration)

    async def asleep(self, name: str, duration: float | timedelta) -> None:
        """``sleep()`` for an ``async def`` handler: the same arguments and errors."""
        await sync_to_async(sleep)(self, name, duration)

    def wait_for_event(self, name: str, *, timeout: float | timedelta | None) -> Any:
        """Wait until the event ``name`` is emitted (``emit_event()``) and return its
        payload; the job is suspended meanwhile, holding no slot and no connection.

        ```python
        @job("shop.ship", atomic=False)
        def ship(job):
            order_id = job.data["order_id"]
            parcel = job.wait_for_event(f"packed:{order_id}", timeout=timedelta(days=1))
            job.step("label", carriers.print_label, parcel["weight"])
        ```

        If the event was emitted already (it is kept for ``PGQUEUE["EVENT_RETENTION"]``),
        the payload comes back at once. Otherwise the wait is stored as a checkpoint and
        ``JobSuspended`` is raised: the job is ``pending`` until the event or the
        timeout, and the emit makes it due at once. When it runs again, this call
        returns the payload, which the checkpoint keeps for every later attempt. Let
        ``JobSuspended`` propagate. See [Durable steps](../how-to/steps.md#wait-for-an-event).

        Args:
            name: The event's name: 1 to 200 characters, no NUL. It is also the wait's
                name among the job's steps, sleeps and waits.
            timeout: Seconds or a ``timedelta`` (up to 1,000 years) after which
                ``EventTimeout`` is raised in the handler; ``None`` to wait without end.

        Returns:
            The payload given to ``emit_event()``.

        Raises:
            JobSuspended: Until the event is emitted or the timeout passes.
            EventTimeout: Once the timeout has passed without the event (on later
                attempts too, unless it has been emitted by then).
            InvalidArgumentError: For an invalid name or timeout.
            StepError: Outside a running job, for a name already used in this attempt
                or stored as a step or a sleep, or for a job no longer held by this
                attempt.
        """
        return wait_for_event(self, name, timeout)

    async def await_for_event(self, name: str, *, timeout: float | timedelta | None) -> Any:
        """``wait_for_event()`` for an ``async def`` handler: the same arguments, result
        and errors."""
        return await sync_to_async(wait_for_event)(self, name, timeout)

    def is_cancel_requested(self) -> bool:
        """Tell whether someone asked to cancel this job while it runs.

        Inside a worker this is a cheap in-memory check kept fresh by the worker's
        heartbeat; elsewhere it reads the database.

        The worker sets the flag within ``HEARTBEAT_INTERVAL`` of the request; it also
        sets it when it releases the job at shutdown, or finds it was recovered (given to
        another worker, or claimed again by this one while this run went on).
        """
        if self._cancel_event is not None:
            return self._cancel_event.is_set()
        return self._this_job().filter(cancel_requested_at__isnull=False).exists()

    def raise_if_cancel_requested(self) -> None:
        """Raise ``JobCancelled`` if cancellation was asked."""
        if self.is_cancel_requested():
            raise JobCancelled(f"job {self.id} was cancelled")

    def wait(
        self,
        timeout: float | timedelta | None = None,
        *,
        poll_interval: float | timedelta = waiting.DEFAULT_POLL_INTERVAL,
    ) -> Any:
        """Block until this job finishes, and return its result.

        Woken by a notification when the job finishes (the job is marked ``awaited``,
        and its finish notifies ``pgqueue_finished``), and reading its status every
        ``poll_interval`` seconds besides, so it also works where notifications do not
        arrive (behind PgBouncer in transaction mode). Opens a connection of its own to
        the jobs database (``PGQUEUE["LISTEN_DATABASE"]`` when set) for the wait.

        The instance is not refreshed: call ``refresh_from_db()`` for the other fields.

        Args:
            timeout: Seconds (or a ``timedelta``) to wait at most, positive; ``None``:
                no limit.
            poll_interval: Seconds between reads of the status, positive.

        Returns:
            The job's ``result``: its handler's return value (``None`` for none).

        Raises:
            JobFailedError: The job failed; the message quotes its last error.
            CancelledJobError: The job was cancelled.
            WaitTimeoutError: ``timeout`` passed first (also a ``TimeoutError``); the
                job goes on.
            JobNotFoundError: The job is not in the jobs database: called inside the
                transaction that enqueued it, before it committed, or the job was
                deleted.
            InvalidArgumentError: For a bad ``timeout`` or ``poll_interval`` (its
                ``field`` names it).
        """
        alias = self._state.db or conf.jobs_database()
        wait = waiting.waiting(self.id, alias, timeout, poll_interval)
        return waiting.wait_for(wait, in_transaction=connections[alias].in_atomic_block)

    async def await_result(
        self,
        timeout: float | timedelta | None = None,
        *,
        poll_interval: float | timedelta = waiting.DEFAULT_POLL_INTERVAL,
    ) -> Any:
        """``wait()`` for async code: ``await job.await_result(timeout=30)``.

        The same arguments, result and errors. It waits on an async connection of its
        own, so no thread is held while it waits.
        """
        alias = self._state.db or conf.jobs_database()
        wait = waiting.waiting(self.id, alias, timeout, poll_interval)
        return await waiting.await_finish(wait, in_transaction=False)

    def cancel(self) -> bool:
        """Cancel this job (see ``JobQuerySet.cancel()``); True if anything changed.

        ``Job.objects.filter(pk=job.pk).cancel()``: ``True`` if the job was cancelled or
        asked to stop. See
        [`JobQuerySet.cancel()`][django_pgqueue.models.JobQuerySet.cancel].
        """
        return self._this_job().cancel() > 0

    def retry(self) -> bool:
        """Put this failed or cancelled job back to pending; True if it was eligible.

        ``Job.objects.filter(pk=job.pk).retry()``: wakes idle workers like
        [`JobQuerySet.retry()`][django_pgqueue.models.JobQuerySet.retry].
        """
        return self._this_job().retry() > 0

    def rerun_from_step(self, name: str) -> int:
        """Forget the checkpoint of the step, sleep or wait ``name`` and of every one
        stored after it, so that the job runs them again; retry the job if it is failed
        or cancelled. Returns how many checkpoints were deleted.

        ```python
        job.rerun_from_step("receipt")  # the charge stays done; the receipt is sent again
        ```

        For a job whose later steps went wrong because of a step's stored result (a bug
        since fixed, a partner's bad answer). A pending or waiting job keeps its status
        and runs from there when it runs. The admin's job page offers it as **Re-run
        from step**.

        Raises:
            StepError: The job has no checkpoint ``name``, or it is claimed, running or
                completed (a completed job is not run again: enqueue a new one).
        """
        alias = conf.jobs_database(self._state.db)
        with transaction.atomic(using=alias):
            locked = self._this_job().select_for_update().values_list("status", flat=True)
            status = locked.first()
            if status is None or status in IN_FLIGHT or status == JobStatus.COMPLETED:
                raise StepError(
                    f"job {self.pk} is {status or 'gone'}: only a failed, cancelled, "
                    "pending or waiting job can run from a step again"
                )
            cleared = clear_checkpoints_from(self.pk, name, alias)
            if status in RETRYABLE:
                self._this_job().retry()
        self.refresh_from_db(using=alias)
        return cleared

    def _this_job(self) -> JobQuerySet:
        """This job's row, in the database the job was loaded from (else the jobs one)."""
        return Job.objects.using(conf.jobs_database(self._state.db)).filter(pk=self.pk)

    @classmethod
    def from_row(cls, columns: list[str], row: tuple[Any, ...], using: str) -> Job:
        """Build a ``Job`` from a raw ``pgqueue_jobs`` row, decoding JSON columns.

        For rows as returned by the SQL function ``claim_job_batch``.
        """
        by_name = dict(zip(columns, row, strict=True))
        for name in ("data", "result", "worker_ids"):
            if isinstance(by_name.get(name), str):
                # JSONField reads neither the expression nor the connection for a plain
                # column; django-stubs requires both.
                by_name[name] = _json_field.from_db_value(by_name[name], None, None)  # type: ignore[arg-type]
        attnames = [f.attname for f in cls._meta.concrete_fields]
        return cls.from_db(using, attnames, [by_name[name] for name in attnames])

    @classmethod
    def from_new_rows(cls, rows: list[dict[str, Any]], using: str) -> list[Job]:
        """The ``Job``s just inserted with these values, every other field at its default
        (``enqueue``: no need to read the rows back)."""
        if not rows:
            return []
        if not _builds_new_rows_directly(cls, rows[0]):
            full = [_new_row(values) for values in rows]
            return cls.from_rows(list(full[0]), [tuple(row.values()) for row in full], using)
        return [_loaded(cls, _new_row(values), using) for values in rows]

    @classmethod
    def from_new_row(cls, values: dict[str, Any], using: str) -> Job:
        """``from_new_rows`` for one row."""
        if not _builds_new_rows_directly(cls, values):
            return cls.from_new_rows([values], using)[0]
        return _loaded(cls, _new_row(values), using)

    @classmethod
    def from_rows(
        cls, columns: Sequence[str], rows: list[tuple[Any, ...]], using: str
    ) -> list[Job]:
        """Build ``Job``s a batch at a time from raw rows whose JSON columns are already
        decoded (the worker's claim, read in binary; ``from_new_rows``).

        Sets the attributes directly instead of running ``Model.__init__`` per row, which
        costs more than the claim itself on fast jobs; runs ``Model.__init__`` when
        something listens to ``pre_init``/``post_init`` of ``Job``.
        """
        attnames, pick = _row_plan(cls, tuple(columns))
        if _runs_init_signals(cls):
            return [cls.from_db(using, attnames, pick(row)) for row in rows]
        return [_loaded(cls, dict(zip(attnames, pick(row), strict=True)), using) for row in rows]


@dataclass
class DependencyOutcome:
    """How the jobs a job depends on ended (``Job.dependency_outcome()``).

    Attributes:
        completed: How many completed.
        failed: The ids of those that failed for good, in the order given.
        cancelled: The ids of those that were cancelled, in the order given.
        unfinished: How many have not finished (retried since), or were pruned.
    """

    completed: int = 0
    failed: list[uuid.UUID] = field(default_factory=list)
    cancelled: list[uuid.UUID] = field(default_factory=list)
    unfinished: int = 0

    @property
    def total(self) -> int:
        """How many jobs there are."""
        return self.completed + len(self.failed) + len(self.cancelled) + self.unfinished


# What a freshly inserted row holds besides what enqueue sends: the database defaults.
_NEW_ROW_DEFAULTS: dict[str, Any] = {
    "status": JobStatus.PENDING.value,
    "result": None,
    "progress": 0,
    "current_stage": "",
    "events_count": 0,
    "worker_id": None,
    "claimed_at": None,
    "started_at": None,
    "heartbeat_at": None,
    "completed_at": None,
    "cancel_requested_at": None,
    "attempts": 0,
    "snoozes": 0,
    "last_error": "",
    "last_traceback": "",
    "error_class": "",
    "unique_key": None,
    "concurrency_key": None,
    "held": False,
    "lost_with_worker": False,
    "awaited": False,
    "timeout": None,
    "trace_context": None,
    "workflow_id": None,
}


def _new_row(values: dict[str, Any]) -> dict[str, Any]:
    """Every attribute of a freshly inserted job: the database defaults, then ``values``."""
    return {**_NEW_ROW_DEFAULTS, "worker_ids": [], **values}


def _builds_new_rows_directly(model: type[Job], values: dict[str, Any]) -> bool:
    """Whether new rows with these keys can skip ``Model.__init__``: no init signal
    listens, and the keys with the defaults cover every field."""
    return not _runs_init_signals(model) and _fields_new_rows_lack(model) <= values.keys()


def _loaded(model: type[Job], attributes: dict[str, Any], using: str) -> Job:
    """A ``model`` instance with these attributes, as loaded from ``using``, built
    without ``Model.__init__`` (callers check that no init signal listens). The
    instance takes ``attributes`` as its ``__dict__``."""
    job = model.__new__(model)
    job.__dict__ = attributes  # callers pass a dict of their own: no copy needed
    state = job._state = ModelState()
    state.adding = False
    state.db = using
    return job


@functools.cache
def _fields_new_rows_lack(model: type[models.Model]) -> frozenset[str]:
    """The attributes of ``model`` that ``_NEW_ROW_DEFAULTS`` does not give."""
    return frozenset(f.attname for f in model._meta.concrete_fields) - {
        *_NEW_ROW_DEFAULTS,
        "worker_ids",
    }


@functools.lru_cache(maxsize=32)
def _row_plan(
    model: type[Job], columns: tuple[str, ...]
) -> tuple[list[str], operator.itemgetter[tuple[Any, ...]]]:
    """For rows with these columns: the model's attribute names, and a getter picking
    their values from a row in that order."""
    attnames = [f.attname for f in model._meta.concrete_fields]
    missing = [name for name in attnames if name not in columns]
    if missing:
        raise ValueError(f"the rows lack the column(s) {', '.join(missing)} of {model.__name__}")
    return attnames, operator.itemgetter(*[columns.index(name) for name in attnames])


def _runs_init_signals(model: type[models.Model]) -> bool:
    if not pre_init.receivers and not post_init.receivers:
        return False  # a list check, where has_listeners() looks the sender up in a cache
    return pre_init.has_listeners(model) or post_init.has_listeners(model)


_json_field = models.JSONField()


class JobEvent(JobsDatabaseModel):
    """One ``Job.set_progress`` call: the progress and stage it recorded, and when.

    Written by the same statement as the progress itself. Only recent events are kept:
    every ``EVENTS_KEPT``-th event of a job trims its history to the newest
    ``EVENTS_KEPT``. Deleting a job deletes its events: the database does it.

    One row of the [`pgqueue_job_events`](sql.md#the-pgqueue_job_events-table) table.
    Default ordering newest first (``-id``). An event exists exactly when the progress was
    written. ``EVENTS_KEPT`` is 100, so a job has fewer than 200 events. Deleting jobs
    relies on ``ON DELETE CASCADE``, so ``Job.objects.filter(...).delete()`` stays a
    single ``DELETE``. The admin shows the newest 50 on a job's page.

    ```python
    job.events.order_by("id").values_list("created_at", "progress", "stage")
    ```

    Attributes:
        job (ForeignKey): The ``Job``; reverse name ``events``.
        created_at (DateTimeField): When the call was made.
        progress (SmallIntegerField): The percent written.
        stage (CharField): The job's ``current_stage`` after the call.
        attempt (IntegerField): The attempt that made the call (``None`` for events
            older than this field).
    """

    # The database cascades (migration 0003 creates the constraint with ON DELETE
    # CASCADE, which Django 5.2 cannot declare). DO_NOTHING keeps Django from collecting
    # events itself, so ``Job.objects.filter(...).delete()`` stays one DELETE statement
    # instead of loading every job it deletes. The index below covers lookups by job.
    job = models.ForeignKey(
        Job,
        on_delete=models.DO_NOTHING,
        related_name="events",
        db_constraint=False,
        db_index=False,
    )
    created_at = models.DateTimeField(db_default=Now())
    progress = models.SmallIntegerField()
    stage = models.CharField(max_length=schema.STAGE_MAX_LENGTH, blank=True)
    #: The attempt that reported it (``None``: recorded before attempts were).
    attempt = models.IntegerField(null=True, blank=True)

    class Meta:
        db_table = "pgqueue_job_events"
        ordering = ("-id",)
        verbose_name = _("job event")
        verbose_name_plural = _("job events")
        indexes = [models.Index(fields=["job", "id"], name="idx_job_events_job")]

    def __str__(self) -> str:
        return f"{self.job_id} {self.progress}% {self.stage}".rstrip()
