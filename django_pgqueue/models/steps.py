"""The checkpoints of durable steps: the result of each step a job has completed."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from .. import schema
from ..schema import StepKind
from .base import JobsDatabaseModel
from .jobs import Job


class JobStep(JobsDatabaseModel):
    """The checkpoint of one completed [step](../how-to/steps.md) of a job: its name and
    JSON result, written once; every later attempt of the job returns the result
    instead of running the step again. Sleeps (``job.sleep()``) and waits for events
    (``job.wait_for_event()``) are checkpoints too, with the moment they end.

    One row of ``pgqueue_job_steps``, unique per job and name. Deleting jobs deletes
    their steps, by a trigger of the database (migration 0038), however they are
    deleted. A retry from the admin keeps them.

    Attributes:
        job (ForeignKey): The ``Job``; reverse name ``steps``.
        name (CharField): The step's name, unique within its job.
        kind (CharField): ``"step"``, ``"sleep"`` or ``"event"`` (``StepKind``).
        attempt (IntegerField): The attempt that ran it.
        result (JSONField): What the step returned, as JSON (``None``: it returned
            ``None``); for a wait, the event's payload, ``None`` (SQL NULL) while it
            waits.
        wake_at (DateTimeField): When a sleep ends, or a wait times out (``None``: a
            step, or a wait without a timeout).
        started_at (DateTimeField): When the step's function was called, or the sleep
            or wait began.
        completed_at (DateTimeField): When its checkpoint was written (for a wait: when
            the event was received).
    """

    # The database deletes them with their job (sql/steps_cascade_v1.sql); Django never
    # collects them.
    job = models.ForeignKey(
        Job,
        on_delete=models.DO_NOTHING,
        related_name="steps",
        db_constraint=False,
        db_index=False,
    )
    name = models.CharField(max_length=schema.STEP_NAME_MAX_LENGTH)
    kind = models.CharField(max_length=10, choices=StepKind.choices, db_default=StepKind.STEP)
    attempt = models.IntegerField()
    result = models.JSONField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
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
        indexes = [
            # The waits an emitted event ends (sql/events_v1.sql): few rows at any time.
            models.Index(
                fields=["name"],
                condition=models.Q(kind=StepKind.EVENT, result__isnull=True),
                name="pgqueue_job_steps_waiting",
            )
        ]

    def __str__(self) -> str:
        return f"{self.job_id} step {self.name}"

    @property
    def duration(self) -> float:
        """Seconds from the step's start to its checkpoint."""
        return (self.completed_at - self.started_at).total_seconds()


class EmittedEvent(JobsDatabaseModel):
    """An event emitted by ``emit_event()``: its name, its latest payload and when.

    An event is kept once emitted, so that a job that reaches ``wait_for_event()``
    after the emit still receives it; emitting the same name again replaces the
    payload. Events older than ``PGQUEUE["EVENT_RETENTION"]`` are deleted by pruning.
    One row of ``pgqueue_emitted_events``.

    Attributes:
        name (CharField): The event's name, its primary key.
        payload (JSONField): The JSON payload of the latest emit.
        emitted_at (DateTimeField): When it was last emitted.
    """

    name = models.CharField(max_length=schema.EVENT_NAME_MAX_LENGTH, primary_key=True)
    payload = models.JSONField(null=True, blank=True)
    emitted_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgqueue_emitted_events"
        ordering = ("-emitted_at",)
        verbose_name = _("emitted event")
        verbose_name_plural = _("emitted events")
        indexes = [models.Index(fields=["emitted_at"], name="pgqueue_events_emitted_at")]

    def __str__(self) -> str:
        return self.name
