"""The record of a job's attempts that did not complete it."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from .base import JobsDatabaseModel
from .jobs import Job


class AttemptOutcome(models.TextChoices):
    """How an attempt ended without completing its job."""

    RETRIED = "retried", _("Failed, retried")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")
    SNOOZED = "snoozed", _("Snoozed")
    #: It slept (``job.sleep()``) or began waiting for an event: not a spent attempt.
    SUSPENDED = "suspended", _("Suspended (sleep or wait)")
    #: Its worker stopped heartbeating; recovery gave the job back to the queue.
    LOST = "lost", _("Lost with its worker")


class JobAttempt(JobsDatabaseModel):
    """One attempt of a job that ended without completing it: a failure (retried or
    final), a cancellation, a snooze, or a worker lost while it ran.

    Written by the statement that records the attempt's outcome (the worker's, or
    recovery's), so it exists exactly when the outcome does. An attempt that completes
    its job is not written here: its worker and times are the job's own
    (``worker_id``, ``started_at``, ``completed_at``), which keeps completing a job to
    one write. A job's history is therefore its attempts here, in order, then the job's
    current attempt while it is claimed, running or completed. A retry from the admin
    starts counting attempts from 1 again; the rows keep their order (``id``). Deleting
    a job deletes its attempts: the database cascades.

    One row of ``pgqueue_job_attempts``.

    Attributes:
        job (ForeignKey): The ``Job``; reverse name ``attempt_history``.
        attempt (IntegerField): Its number, from 1.
        worker_id (CharField): The worker that ran it.
        started_at (DateTimeField): When its handler started; ``None`` if it never did
            (cancelled or lost before it started).
        ended_at (DateTimeField): When its outcome was recorded.
        outcome (CharField): An ``AttemptOutcome``.
        error (TextField): ``"ExceptionClass: message"``, or the reason; ``""``: none.
        traceback (TextField): The handler's traceback; ``""``: none.
    """

    # As JobEvent's: the database cascades (migration 0026), Django never collects them.
    job = models.ForeignKey(
        Job,
        on_delete=models.DO_NOTHING,
        related_name="attempt_history",
        db_constraint=False,
        db_index=False,
    )
    attempt = models.IntegerField()
    worker_id = models.CharField(max_length=255)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(db_default=Now())
    outcome = models.CharField(max_length=20, choices=AttemptOutcome.choices)
    error = models.TextField(blank=True, db_default="")
    traceback = models.TextField(blank=True, db_default="")

    class Meta:
        db_table = "pgqueue_job_attempts"
        ordering = ("id",)
        verbose_name = _("job attempt")
        verbose_name_plural = _("job attempts")
        indexes = [models.Index(fields=["job", "id"], name="idx_job_attempts_job")]

    def __str__(self) -> str:
        return f"{self.job_id} attempt {self.attempt}: {self.outcome}"

    @property
    def duration(self) -> float | None:
        """Seconds from its start to its end; ``None`` if it never started."""
        if self.started_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()
