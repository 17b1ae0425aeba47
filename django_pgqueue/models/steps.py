"""The checkpoints of durable steps: the result of each step a job has completed."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from .. import schema
from .base import JobsDatabaseModel
from .jobs import Job


class JobStep(JobsDatabaseModel):
    """The checkpoint of one completed [step](../how-to/steps.md) of a job: its name and
    JSON result, written once; every later attempt of the job returns the result
    instead of running the step again.

    One row of ``pgqueue_job_steps``, unique per job and name. Deleting a job deletes
    its steps: the database cascades (migration 0028). A retry from the admin keeps
    them.

    Attributes:
        job (ForeignKey): The ``Job``; reverse name ``steps``.
        name (CharField): The step's name, unique within its job.
        attempt (IntegerField): The attempt that ran it.
        result (JSONField): What the step returned, as JSON (``None``: it returned
            ``None``).
        started_at (DateTimeField): When the step's function was called.
        completed_at (DateTimeField): When its checkpoint was written.
    """

    # As JobEvent's: the database cascades, Django never collects them.
    job = models.ForeignKey(
        Job,
        on_delete=models.DO_NOTHING,
        related_name="steps",
        db_constraint=False,
        db_index=False,
    )
    name = models.CharField(max_length=schema.STEP_NAME_MAX_LENGTH)
    attempt = models.IntegerField()
    result = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField()
    completed_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_job_steps"
        ordering = ("id",)
        verbose_name = _("job step")
        verbose_name_plural = _("job steps")
        constraints = [
            models.UniqueConstraint(fields=["job", "name"], name="pgqueue_job_steps_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.job_id} step {self.name}"

    @property
    def duration(self) -> float:
        """Seconds from the step's start to its checkpoint."""
        return (self.completed_at - self.started_at).total_seconds()
