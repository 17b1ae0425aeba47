"""The dependencies of workflow steps: which job waits for which, and how many of its
dependencies a waiting job still waits for.

The database keeps them true (``sql/workflow_settle_v1.sql``): in the transaction that
finishes a job, the counters of the jobs that depend on it go down by the edges its new
status resolves, and a job whose counter reaches zero becomes ``pending``. The rows are written by
``enqueue(depends_on=...)`` (``django_pgqueue.dependencies``) and read by the admin.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from ..schema import OnDependencyFailure, edge_resolved
from .base import JobsDatabaseModel

# By name: the transitions of jobs read these models, and jobs.py imports them.
_JOB = "django_pgqueue.Job"


class JobDependency(JobsDatabaseModel):
    """One edge of a workflow: ``job`` runs after ``dependency`` has finished.

    One row of ``pgqueue_job_dependencies``. There are no foreign key constraints: a
    job's finish must not pay for them, and pruning removes a workflow's rows together.

    Attributes:
        job (ForeignKey): The job that waits; reverse name ``dependency_edges``.
        dependency (ForeignKey): The job it waits for; reverse name ``dependent_edges``.
        on_failure (CharField): An [`OnDependencyFailure`][django_pgqueue.OnDependencyFailure]:
            what happens to ``job`` when ``dependency`` fails for good or is cancelled.

    An edge is never written after the enqueue: whether it still holds ``job`` back
    follows from ``dependency``'s status (``resolved``).
    """

    job = models.ForeignKey(
        _JOB,
        on_delete=models.DO_NOTHING,
        related_name="dependency_edges",
        db_constraint=False,
    )
    dependency = models.ForeignKey(
        _JOB,
        on_delete=models.DO_NOTHING,
        related_name="dependent_edges",
        db_constraint=False,
        db_index=False,  # the unique constraint's index leads with it
    )
    on_failure = models.CharField(max_length=8, choices=OnDependencyFailure.choices)

    class Meta:
        db_table = "pgqueue_job_dependencies"
        verbose_name = _("job dependency")
        verbose_name_plural = _("job dependencies")
        constraints = [
            # A finish looks up the edges of the job it finished through this index.
            models.UniqueConstraint(
                fields=["dependency", "job"], name="pgqueue_job_dependencies_unique"
            ),
            models.CheckConstraint(
                condition=~Q(job=F("dependency")), name="pgqueue_job_dependencies_not_self"
            ),
            models.CheckConstraint(
                condition=Q(on_failure__in=OnDependencyFailure.values),
                name="pgqueue_job_dependencies_on_failure_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} after {self.dependency_id}"

    @property
    def resolved(self) -> bool:
        """Whether ``dependency`` no longer holds ``job`` back: it completed, or, under
        ``"run"``, failed or was cancelled. Reads ``dependency`` (a query unless it was
        selected with ``select_related``)."""
        return edge_resolved(self.on_failure, self.dependency.status)


class JobWait(JobsDatabaseModel):
    """What a job enqueued with ``depends_on`` still waits for.

    One row of ``pgqueue_job_waits`` per such job, deleted when its last dependency is
    resolved and the job becomes ``pending``. A job cancelled because a dependency failed
    keeps its row, with ``cancelled_by`` naming that dependency, so that retrying the
    dependency puts the job back to ``waiting``.

    Attributes:
        job (OneToOneField): The waiting job (primary key); reverse name ``workflow_wait``.
        unresolved (IntegerField): How many of its dependencies are not resolved.
        cancelled_by (ForeignKey): The dependency whose failure or cancellation cancelled
            the job; ``NULL`` unless the job was cancelled that way.
    """

    job = models.OneToOneField(
        _JOB,
        on_delete=models.DO_NOTHING,
        primary_key=True,
        related_name="workflow_wait",
        db_constraint=False,
    )
    unresolved = models.IntegerField()
    cancelled_by = models.ForeignKey(
        _JOB,
        on_delete=models.DO_NOTHING,
        null=True,
        blank=True,
        related_name="+",
        db_constraint=False,
        db_index=False,  # the partial index below
    )

    class Meta:
        db_table = "pgqueue_job_waits"
        verbose_name = _("job wait")
        verbose_name_plural = _("job waits")
        indexes = [
            # A retry finds the jobs its failure cancelled through this index.
            models.Index(
                fields=["cancelled_by"],
                name="idx_job_waits_cancelled_by",
                condition=Q(cancelled_by__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(unresolved__gt=0), name="pgqueue_job_waits_unresolved_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} waits for {self.unresolved}"
