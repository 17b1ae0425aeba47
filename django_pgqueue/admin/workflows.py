"""The workflow of a job in the admin: what it waits for, what waits for it, and the
changelist filtered to its workflow.

A job outside workflows shows none of it. Each list is bounded (``EDGES_SHOWN``): a
chord's callback may wait for ten thousand jobs, and the page shows the first ones and
how many there are.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy

from ..models import Job, JobDependency, JobWait
from ..schema import edge_resolved
from .base import JobModelAdmin
from .formatting import TEMPLATES

#: Dependencies (and dependents) listed on a job's page; the rest are counted.
EDGES_SHOWN = 50

#: The fieldset of the job page, added for jobs of a workflow.
WORKFLOW_FIELDSET = (
    gettext_lazy("Workflow"),
    {"fields": ("workflow", "waits_for", "needed_by")},
)


def workflow_url(workflow_id: uuid.UUID) -> str:
    """The changelist of a workflow's jobs."""
    changelist = reverse("admin:django_pgqueue_job_changelist")
    return f"{changelist}?{urlencode({WorkflowFilter.parameter_name: str(workflow_id)})}"


class WorkflowFilter(admin.SimpleListFilter):
    """The jobs of one workflow (``?workflow=<id>``), linked from each job's page; shown
    in the sidebar only while it filters."""

    title = gettext_lazy("workflow")
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, f"…{value[-12:]}")] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        if not value:
            return queryset
        try:
            workflow_id = uuid.UUID(value)
        except ValueError:
            return queryset.none()
        return queryset.filter(workflow_id=workflow_id)


class WorkflowCells(JobModelAdmin):
    """The display methods of the job page's Workflow fieldset."""

    @admin.display(description=gettext_lazy("workflow"))
    def workflow(self, job: Job) -> SafeString | str:
        if job.workflow_id is None:
            return self.get_empty_value_display()
        return format_html(
            '<a href="{}"><code>{}</code></a>', workflow_url(job.workflow_id), job.workflow_id
        )

    @admin.display(description=gettext_lazy("waits for"))
    def waits_for(self, job: Job) -> str:
        edges = JobDependency.objects.using(job._state.db).filter(job=job)
        wait = JobWait.objects.using(job._state.db).filter(job=job).first()
        return _edge_list(edges, "dependency", job, wait)

    @admin.display(description=gettext_lazy("needed by"))
    def needed_by(self, job: Job) -> str:
        edges = JobDependency.objects.using(job._state.db).filter(dependency=job)
        return _edge_list(edges, "job", job, None)


def _edge_list(edges: QuerySet[JobDependency], side: str, job: Job, wait: JobWait | None) -> str:
    """The jobs at ``side`` of ``edges``, each with its status and the edge's policy."""
    total = edges.count()
    shown = list(edges.select_related(side).order_by("id")[:EDGES_SHOWN])
    return render_to_string(
        f"{TEMPLATES}/edges.html",
        {
            "rows": [
                {
                    "job": getattr(edge, side),
                    "edge": edge,
                    "url": _job_url(getattr(edge, side)),
                    # The dependency of an edge to a dependent is this job: no query.
                    "resolved": edge_resolved(
                        edge.on_failure,
                        edge.dependency.status if side == "dependency" else job.status,
                    ),
                }
                for edge in shown
            ],
            "more": total - len(shown),
            "wait": wait,
            "cancelled_by_url": (
                _job_url_by_id(wait.cancelled_by_id) if wait and wait.cancelled_by_id else ""
            ),
        },
    )


def _job_url(job: Job) -> str:
    return _job_url_by_id(job.pk)


def _job_url_by_id(job_id: uuid.UUID) -> str:
    return reverse("admin:django_pgqueue_job_change", args=[job_id])
