"""Workflows in the admin: a workflow's page (its steps, live, with what each waits
for), the Workflow section of a job's page, and the changelist filtered to a workflow.

A job outside workflows shows none of it. Every list is bounded (``EDGES_SHOWN``,
``STEPS_SHOWN``): a chord's callback may wait for ten thousand jobs, and the pages show
the first ones and how many there are.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..models import Job, JobDependency, JobWait
from ..schema import JobStatus, edge_resolved
from .base import JobAdminBase
from .cells import JobCells
from .formatting import TEMPLATES

#: Dependencies (and dependents) listed on a job's page; the rest are counted.
EDGES_SHOWN = 50
#: Steps listed on a workflow's page (the live refresh asks about 200 jobs at most).
STEPS_SHOWN = 200
#: Dependencies named in a step's row of a workflow's page; more are counted.
WAITS_NAMED = 5

#: The fieldset of the job page, added for jobs of a workflow.
WORKFLOW_FIELDSET = (
    gettext_lazy("Workflow"),
    {"fields": ("workflow", "waits_for", "needed_by")},
)


def workflow_url(workflow_id: uuid.UUID) -> str:
    """The page of a workflow."""
    return reverse("admin:django_pgqueue_job_workflow", args=[workflow_id])


def workflow_jobs_url(workflow_id: uuid.UUID) -> str:
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


class WorkflowCells(JobCells, JobAdminBase):
    """The display methods of the job page's Workflow fieldset, and the workflow page."""

    def workflow_view(self, request: HttpRequest, workflow_id: uuid.UUID) -> HttpResponse:
        """A workflow's steps in the order they were enqueued: status and progress (live),
        what each waits for, and the counts of the whole workflow by status."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        jobs = self.get_queryset(request).filter(workflow_id=workflow_id)
        counts = dict(jobs.order_by().values_list("status").annotate(count=Count("id")))
        if not counts:
            return self._not_found(request, _("No workflow with id “%s”.") % workflow_id)
        steps = list(jobs.order_by("created_at", "id")[:STEPS_SHOWN])
        number = {job.pk: index for index, job in enumerate(steps, 1)}
        waits = _waits_for([job.pk for job in steps], jobs.db)
        total = sum(counts.values())
        site = self.admin_site.name
        context = {
            **self.admin_site.each_context(request),
            "title": _("Workflow %(id)s") % {"id": workflow_id},
            "opts": self.opts,
            "changelist_url": reverse(f"{site}:django_pgqueue_job_changelist"),
            "jobs_url": workflow_jobs_url(workflow_id),
            "counts": [
                {"status": status, "label": status.label, "count": counts[status.value]}
                for status in JobStatus
                if status.value in counts
            ],
            "total": total,
            "more": total - len(steps),
            "rows": [
                {
                    "number": number[job.pk],
                    "job": job,
                    "url": _job_url(job),
                    "status": self.status_badge(job),
                    "progress": self.progress_bar(job),
                    "waits_for": [
                        {"number": number.get(dependency), "id": dependency}
                        for dependency in waits.get(job.pk, ([], 0))[0]
                    ],
                    "waits_more": waits.get(job.pk, ([], 0))[1],
                }
                for job in steps
            ],
        }
        return TemplateResponse(request, f"{TEMPLATES}/workflow.html", context)

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


def _waits_for(
    job_ids: list[uuid.UUID], using: str
) -> dict[uuid.UUID, tuple[list[uuid.UUID], int]]:
    """For each of ``job_ids`` with dependencies: the first ``WAITS_NAMED`` of them, and
    how many more there are. Two queries, however many edges a job has."""
    edges = JobDependency.objects.using(using).filter(job_id__in=job_ids)
    totals = dict(edges.order_by().values_list("job_id").annotate(count=Count("id")))
    few = [job_id for job_id, count in totals.items() if count <= WAITS_NAMED]
    named: dict[uuid.UUID, list[uuid.UUID]] = {job_id: [] for job_id in totals}
    for job_id, dependency_id in (
        edges.filter(job_id__in=few).order_by("id").values_list("job_id", "dependency_id")
    ):
        named[job_id].append(dependency_id)
    return {job_id: (named[job_id], totals[job_id] - len(named[job_id])) for job_id in totals}


def _job_url(job: Job) -> str:
    return _job_url_by_id(job.pk)


def _job_url_by_id(job_id: uuid.UUID) -> str:
    return reverse("admin:django_pgqueue_job_change", args=[job_id])
