"""The models of running the queue: workers, queue states, limits, rates and
schedule ticks."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce, Now
from django.utils.translation import gettext_lazy as _

from .. import rates, schema
from .base import JobsDatabaseModel


class WorkerRecord(JobsDatabaseModel):
    """A worker process, as it last reported itself (one row per worker start).

    One row of the [`pgqueue_workers`](sql.md#the-pgqueue_workers-table) table. Workers
    write these rows; read them to see which workers are running:

    ```python
    from datetime import timedelta

    from django.utils import timezone

    from django_pgqueue.models import WorkerRecord

    WorkerRecord.objects.filter(
        stopped_at__isnull=True, heartbeat_at__gte=timezone.now() - timedelta(minutes=1)
    )
    ```

    Attributes:
        worker_id (CharField): Primary key.
        hostname (CharField): The host the worker runs on.
        pid (IntegerField): Its process id.
        queues (JSONField): The queues it serves, ``None`` for all.
        job_types (JSONField): The job types it runs, ``None`` for all.
        concurrency (IntegerField): Its number of slots.
        started_at (DateTimeField): When it started.
        heartbeat_at (DateTimeField): Its last heartbeat.
        stopped_at (DateTimeField): When it stopped; ``None`` while running.
    """

    worker_id = models.CharField(max_length=255, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(null=True, blank=True, help_text="null: every queue")
    job_types = models.JSONField(null=True, blank=True, help_text="null: every job type")
    concurrency = models.IntegerField()
    started_at = models.DateTimeField(db_default=Now())
    heartbeat_at = models.DateTimeField(db_default=Now())
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgqueue_workers"
        ordering = ("-heartbeat_at",)
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return self.worker_id


class QueueState(JobsDatabaseModel):
    """Runtime state of a queue that someone changed: a paused queue is not claimed.

    A queue with no row here is active; rows appear when a queue is first paused.

    A row of ``pgqueue_queues``, written by
    [`pause_queue()`][django_pgqueue.queues.pause_queue] and
    [`resume_queue()`][django_pgqueue.queues.resume_queue].

    Attributes:
        name (CharField): The queue (primary key).
        paused_at (DateTimeField): When it was paused; ``None``: active.
        updated_at (DateTimeField): When the row last changed.
    """

    name = models.CharField(max_length=schema.QUEUE_MAX_LENGTH, primary_key=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_queues"
        ordering = ("name",)
        verbose_name = _("queue state")
        verbose_name_plural = _("queue states")

    def __str__(self) -> str:
        return f"{self.name} ({'paused' if self.paused_at else 'active'})"


class LimitScope(models.TextChoices):
    QUEUE = "queue", _("Queue")
    JOB_TYPE = "job_type", _("Job type")
    #: Per key of a job type: the row's name is the job type, the limit applies to each key.
    KEY = "key", _("Each key of a job type")


class ConcurrencyLimit(JobsDatabaseModel):
    """At most ``max_running`` jobs of a queue or job type claimed or running at once,
    across all workers; ``claim_job_batch`` enforces it.

    ``declared`` is what the code and settings say: workers write it when they start.
    ``override`` is what staff set, in the admin or with
    [`override_limit()`][django_pgqueue.limits.override_limit]; it wins, and workers
    never change it. ``max_running``, the limit enforced, is computed by the database
    from the two (a generated column).

    A row of ``pgqueue_limits``; see [concurrency limits](#limits).

    Attributes:
        scope (CharField): ``"queue"`` or ``"job_type"``.
        name (CharField): The queue or job type.
        declared (IntegerField): The declared limit, at least 1; ``NULL`` when nothing
            declares one (the row then holds an override).
        override (IntegerField): The limit set by staff, at least 1, or ``NULL``.
        max_running (GeneratedField): The limit enforced: ``COALESCE(override,
            declared)``.
        updated_at (DateTimeField): When the row last changed.
    """

    scope = models.CharField(max_length=16, choices=LimitScope.choices)
    name = models.CharField(max_length=255)
    declared = models.IntegerField(null=True, blank=True, editable=False)
    override = models.IntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(schema.CONCURRENCY_LIMIT_MAX)],
        help_text=_("Wins over the declared limit; empty: the declared limit applies."),
    )
    #: One rule, in the database: the override if set, else the declared limit.
    max_running = models.GeneratedField(
        expression=Coalesce("override", "declared"),
        output_field=models.IntegerField(),
        db_persist=True,
    )
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_limits"
        ordering = ("scope", "name")
        verbose_name = _("concurrency limit")
        verbose_name_plural = _("concurrency limits")
        constraints = [
            models.UniqueConstraint(fields=["scope", "name"], name="pgqueue_limits_scope_name"),
            models.CheckConstraint(
                condition=Q(scope__in=LimitScope.values), name="pgqueue_limits_scope_valid"
            ),
            models.CheckConstraint(
                condition=Q(declared__isnull=True) | Q(declared__gte=1),
                name="pgqueue_limits_declared_positive",
            ),
            models.CheckConstraint(
                condition=Q(override__isnull=True) | Q(override__gte=1),
                name="pgqueue_limits_override_positive",
            ),
            models.CheckConstraint(
                condition=Q(declared__isnull=False) | Q(override__isnull=False),
                name="pgqueue_limits_declared_or_override",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.name}: {self.max_running}"


class RateLimitScope(models.TextChoices):
    QUEUE = "queue", _("Queue")
    JOB_TYPE = "job_type", _("Job type")
    #: Per key of a job type: the row's name is the job type, the rate applies to each key.
    KEY = "key", _("Each key of a job type")


class RateLimit(JobsDatabaseModel):
    """At most ``max_jobs`` jobs of a queue or job type started in any window of
    ``period_seconds``, across all workers; ``claim_job_batch`` enforces it.

    As with [`ConcurrencyLimit`][django_pgqueue.models.ConcurrencyLimit], ``declared``
    is what the code and settings say (workers write it when they start) and
    ``override`` what staff set, in the admin or with
    [`override_rate_limit()`][django_pgqueue.rate_limits.override_rate_limit]; the
    database computes the rate enforced from the two.

    A row of ``pgqueue_rate_limits``; see [rate limits](#rate-limits).

    Attributes:
        scope (CharField): ``"queue"``, ``"job_type"`` or ``"key"`` (the rate applies to
            each key of the job type).
        name (CharField): The queue or job type.
        declared_jobs (IntegerField): Jobs per period declared, or ``NULL``.
        declared_seconds (IntegerField): The declared period in seconds, or ``NULL``.
        override_jobs (IntegerField): Jobs per period set by staff, or ``NULL``.
        override_seconds (IntegerField): The period set by staff, or ``NULL``.
        max_jobs (GeneratedField): Jobs per period enforced: the override's if set.
        period_seconds (GeneratedField): The period enforced: the override's if set.
        updated_at (DateTimeField): When the row last changed.
    """

    scope = models.CharField(max_length=16, choices=RateLimitScope.choices)
    name = models.CharField(max_length=255)
    declared_jobs = models.IntegerField(null=True, blank=True, editable=False)
    declared_seconds = models.IntegerField(null=True, blank=True, editable=False)
    override_jobs = models.IntegerField(null=True, blank=True)
    override_seconds = models.IntegerField(null=True, blank=True)
    #: One rule, in the database: the override's rate if set, else the declared one.
    max_jobs = models.GeneratedField(
        expression=Coalesce("override_jobs", "declared_jobs"),
        output_field=models.IntegerField(),
        db_persist=True,
    )
    period_seconds = models.GeneratedField(
        expression=models.Case(
            models.When(override_jobs__isnull=False, then="override_seconds"),
            default="declared_seconds",
        ),
        output_field=models.IntegerField(),
        db_persist=True,
    )
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_rate_limits"
        ordering = ("scope", "name")
        verbose_name = _("rate limit")
        verbose_name_plural = _("rate limits")
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "name"], name="pgqueue_rate_limits_scope_name"
            ),
            models.CheckConstraint(
                condition=Q(scope__in=RateLimitScope.values),
                name="pgqueue_rate_limits_scope_valid",
            ),
            models.CheckConstraint(
                condition=Q(declared_jobs__isnull=True, declared_seconds__isnull=True)
                | Q(
                    declared_jobs__range=(1, rates.RATE_JOBS_MAX),
                    declared_seconds__range=(1, rates.RATE_PERIOD_MAX_SECONDS),
                ),
                name="pgqueue_rate_limits_declared_valid",
            ),
            models.CheckConstraint(
                condition=Q(override_jobs__isnull=True, override_seconds__isnull=True)
                | Q(
                    override_jobs__range=(1, rates.RATE_JOBS_MAX),
                    override_seconds__range=(1, rates.RATE_PERIOD_MAX_SECONDS),
                ),
                name="pgqueue_rate_limits_override_valid",
            ),
            models.CheckConstraint(
                condition=Q(declared_jobs__isnull=False) | Q(override_jobs__isnull=False),
                name="pgqueue_rate_limits_declared_or_override",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.name}: {self.rate}"

    @property
    def rate(self) -> rates.Rate:
        """The rate enforced."""
        return rates.Rate(self.max_jobs, self.period_seconds)


class RateLimitStart(JobsDatabaseModel):
    """How many jobs under a rate limit ``claim_job_batch`` started at one moment: the
    sliding window a rate limit is counted in.

    Written by the claim under the limit's lock; rows older than their limit's period are
    deleted by workers' recovery. Table ``pgqueue_rate_starts``. For a per-key rate
    (scope ``"key"``), ``name`` is the job type, a newline, and the key.
    """

    pk = models.CompositePrimaryKey("scope", "name", "started_at")
    scope = models.CharField(max_length=16)
    name = models.CharField(max_length=255)
    started_at = models.DateTimeField()
    jobs = models.IntegerField()
    #: On the row of a claim that filled its limit's window: when the window's oldest
    #: start leaves it, the first moment it can have room again. The claim leaves out the
    #: keys whose window is full until then, and workers wake up then.
    full_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgqueue_rate_starts"
        indexes = [
            # The windows filled and not yet with room: few rows, read by every claim
            # and wake-up query. Led by scope, so that their "scope = 'key' AND
            # full_until > now" is all index condition: on full_until alone, the
            # planner judged the log from stale statistics (it grows by a hundred rows
            # a claim) and read every key's starts through the primary key instead.
            models.Index(
                fields=["scope", "full_until"],
                condition=Q(full_until__isnull=False),
                name="idx_rate_starts_marks",
            ),
        ]
        verbose_name = _("rate limit start")
        verbose_name_plural = _("rate limit starts")

    def __str__(self) -> str:
        return f"{self.scope} {self.name}: {self.jobs} at {self.started_at.isoformat()}"


class PeriodicTick(JobsDatabaseModel):
    """The last tick of a periodic job that was enqueued: the row that makes each tick
    enqueue exactly once, whichever worker gets there first.

    Table ``pgqueue_periodic``: one row per schedule seen by a worker.

    Attributes:
        name (CharField): The schedule's name (primary key).
        schedule (CharField): The expression and time zone, such as
            ``"0 3 * * * (UTC)"``. A different value resets the schedule.
        last_tick (DateTimeField): The latest tick recorded: enqueued, or recorded on
            first sight or change.
        last_job_id (UUIDField): The job enqueued for the latest enqueued tick, or
            ``None``.
        paused_at (DateTimeField): When staff paused the schedule; ``None``: it runs.
            A paused schedule enqueues no tick; resumed, it runs from its next tick.
        updated_at (DateTimeField): When the row last changed.
    """

    name = models.CharField(max_length=255, primary_key=True)
    schedule = models.CharField(max_length=255)
    last_tick = models.DateTimeField()
    last_job_id = models.UUIDField(null=True, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_periodic"
        ordering = ("name",)
        verbose_name = _("periodic job")
        verbose_name_plural = _("periodic jobs")

    def __str__(self) -> str:
        return f"{self.name} ({self.schedule})"


class StoredSchedule(JobsDatabaseModel):
    """A periodic job stored in the database: staff add, edit and delete it in the admin
    (or with [`save_schedule()`][django_pgqueue.stored_schedules.save_schedule]), and
    workers tick it like those declared in code and settings, each tick exactly once.

    A row of ``pgqueue_schedules``. Its name is shared with the schedules declared in
    code and settings (and with ``pgqueue_periodic``, which records its ticks): a stored
    schedule whose name the code or settings also declare is ignored, with a warning.

    Attributes:
        name (CharField): The schedule's name, unique among all schedules.
        job_type (CharField): The job type each tick enqueues.
        schedule (CharField): A cron expression, as in ``@job(schedule=...)``.
        timezone (CharField): The IANA time zone of the expression; blank: Django's
            ``TIME_ZONE``.
        data (JSONField): The job's payload, a JSON object.
        queue (CharField): The job's queue; blank: the job type's.
        priority (SmallIntegerField): The job's priority; ``None``: the job type's.
        max_attempts (IntegerField): The job's attempts; ``None``: the job type's.
        unique_key (CharField): The job's unique key (a tick is skipped while an active
            job holds it); blank: none.
        created_at (DateTimeField): When it was added.
        updated_at (DateTimeField): When it last changed.
    """

    name = models.CharField(_("name"), max_length=255, unique=True)
    job_type = models.CharField(_("job type"), max_length=schema.JOB_TYPE_MAX_LENGTH)
    schedule = models.CharField(
        _("schedule"),
        max_length=150,
        help_text=_(
            "A cron expression: minute hour day-of-month month day-of-week, such as "
            "“0 3 * * *” or “*/15 * * * *”, a sixth field for seconds, or @daily, @hourly…"
        ),
    )
    timezone = models.CharField(
        _("time zone"),
        max_length=64,
        blank=True,
        default="",
        help_text=_("An IANA name such as “Europe/Paris”; blank: the site's TIME_ZONE."),
    )
    data = models.JSONField(_("data"), default=dict, blank=True)
    queue = models.CharField(
        _("queue"),
        max_length=schema.QUEUE_MAX_LENGTH,
        blank=True,
        default="",
        help_text=_("Blank: the job type's queue."),
    )
    priority = models.SmallIntegerField(_("priority"), null=True, blank=True)
    max_attempts = models.IntegerField(_("max attempts"), null=True, blank=True)
    unique_key = models.CharField(
        _("unique key"),
        max_length=schema.UNIQUE_KEY_MAX_LENGTH,
        blank=True,
        default="",
        help_text=_("A tick is skipped while an active job holds this key; blank: none."),
    )
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_schedules"
        ordering = ("name",)
        verbose_name = _("stored schedule")
        verbose_name_plural = _("stored schedules")

    def __str__(self) -> str:
        return self.name
