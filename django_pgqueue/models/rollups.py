"""The rollups the admin's charts draw: one row per minute sampled, one per minute, queue
and job type of finished jobs, and the same per hour (written by
``rollups.write_rollups()``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from .. import schema
from .base import JobsDatabaseModel

if TYPE_CHECKING:
    _IntegerListField = models.Field[Any, list[int]]
else:  # Field is generic in django-stubs only
    _IntegerListField = models.Field


class IntegerArrayField(_IntegerListField):
    """An ``integer[]`` column, read and written as a list of ints. Not ``ArrayField``:
    that one needs ``django.contrib.postgres`` in ``INSTALLED_APPS`` (Django 6 checks)."""

    def db_type(self, connection: BaseDatabaseWrapper) -> str:
        return "integer[]"

    def get_prep_value(self, value: Any) -> Any:
        return None if value is None else [int(item) for item in value]

    def to_python(self, value: Any) -> Any:
        return None if value is None else list(value)


class QueueMinute(JobsDatabaseModel):
    """A minute the rollups sampled: the depth of each queue as it began.

    A row of ``pgqueue_minutes``; its primary key makes one worker write each minute.

    Attributes:
        minute (DateTimeField): The minute's start (primary key).
        depths (JSONField): Per queue, ``{"pending": n, "scheduled": n, "running": n,
            "waiting": n}`` as the read model counted them (queues with no job left out).
        written_at (DateTimeField): When the row was written.
    """

    minute = models.DateTimeField(primary_key=True)
    depths = models.JSONField(default=dict)
    written_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_minutes"
        ordering = ("-minute",)
        verbose_name = _("sampled minute")
        verbose_name_plural = _("sampled minutes")

    def __str__(self) -> str:
        return self.minute.isoformat()


class FinishedJobsRollup(JobsDatabaseModel):
    """What a rollup of finished jobs counts, for one queue and job type in its period.

    The histograms count jobs per bucket of duration (``rollups.bucket_bounds()``),
    without their trailing empty buckets.

    Attributes:
        queue (CharField): The queue.
        job_type (CharField): The job type.
        completed (IntegerField): Jobs that completed in the period.
        failed (IntegerField): Jobs that failed for good in it.
        cancelled (IntegerField): Jobs cancelled in it.
        wait_ms (IntegerArrayField): The histogram of their waiting times, due to start.
        run_ms (IntegerArrayField): The histogram of their run times.
    """

    queue = models.CharField(max_length=schema.QUEUE_MAX_LENGTH)
    job_type = models.CharField(max_length=schema.JOB_TYPE_MAX_LENGTH)
    completed = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    cancelled = models.IntegerField(default=0)
    wait_ms = IntegerArrayField(default=list)
    run_ms = IntegerArrayField(default=list)

    class Meta:
        abstract = True


class MinuteJobs(FinishedJobsRollup):
    """The jobs of one queue and job type that finished in one minute (the fields of
    ``FinishedJobsRollup``).

    A row of ``pgqueue_minute_jobs``.

    Attributes:
        minute (DateTimeField): The minute's start.
    """

    pk = models.CompositePrimaryKey("minute", "queue", "job_type")
    minute = models.DateTimeField()

    class Meta:
        db_table = "pgqueue_minute_jobs"
        ordering = ("-minute", "queue", "job_type")
        verbose_name = _("minute of finished jobs")
        verbose_name_plural = _("minutes of finished jobs")

    def __str__(self) -> str:
        return f"{self.minute.isoformat()} {self.queue} {self.job_type}"


class HourJobs(FinishedJobsRollup):
    """The jobs of one queue and job type that finished in one hour: the sums of its
    ``MinuteJobs``, which the week's chart reads (168 rows a pair, not 10,080).

    A row of ``pgqueue_hour_jobs``, rewritten from the minutes each minute.

    Attributes:
        hour (DateTimeField): The hour's start.
    """

    pk = models.CompositePrimaryKey("hour", "queue", "job_type")
    hour = models.DateTimeField()

    class Meta:
        db_table = "pgqueue_hour_jobs"
        ordering = ("-hour", "queue", "job_type")
        verbose_name = _("hour of finished jobs")
        verbose_name_plural = _("hours of finished jobs")

    def __str__(self) -> str:
        return f"{self.hour.isoformat()} {self.queue} {self.job_type}"
