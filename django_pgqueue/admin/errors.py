"""Failed jobs grouped by job type and error class, with a link to each group's jobs and
a button that retries a whole group.

A job's error class is ``Job.error_class``: the exception class that begins its
``last_error`` (``"ValueError: ..."`` is ``ValueError``), or ``""`` for an error that does
not begin with one (a lost worker's, for one), which the database keeps up to date
(sql/error_class_v1.sql). The page and the changelist's ``error`` filter read it from
the partial index ``idx_jobs_failed`` (job type, error class, time), so their cost
follows the number of failed jobs, not the size of the table.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..models import Job, JobQuerySet
from ..schema import JobStatus
from .actions import JobActions
from .filters import NUL
from .formatting import TEMPLATES, display_datetime

#: The groups listed, largest first; the page says when there are more.
GROUPS_SHOWN = 100
#: How much of a group's latest error the page quotes.
ERROR_SHOWN = 300


def failed_group(jobs: QuerySet[Job], job_type: str, error: str) -> QuerySet[Job]:
    """The failed jobs of ``jobs`` of ``job_type`` whose error class is ``error``."""
    return jobs.filter(status=JobStatus.FAILED, job_type=job_type, error_class=error)


def _newest_errors(
    failed: QuerySet[Job], groups: list[dict[str, Any]]
) -> dict[tuple[str, str], str]:
    """The error of each group's newest job, by (job type, error class): the jobs of the
    group that failed at its latest moment, through ``idx_jobs_failed``, one statement
    for every group."""
    if not groups:
        return {}
    moments = Q()
    for group in groups:
        moments |= Q(
            job_type=group["job_type"],
            error_class=group["error_class"],
            completed_at=group["latest"],
        )
    found: dict[tuple[str, str], str] = {}
    rows = failed.filter(moments).values_list("job_type", "error_class", "last_error")
    for job_type, error, message in rows:
        found.setdefault((job_type, error), message)
    return found


class ErrorFilter(admin.SimpleListFilter):
    """Jobs whose error class is the one given (``?error=ValueError``), linked from the
    errors page; shown in the sidebar only while it filters."""

    title = gettext_lazy("error")
    parameter_name = "error"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        # One choice while it filters: without one, Django would not apply the filter.
        return [(value, value or _("(no exception class)"))] if value is not None else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        if value is None:
            return queryset
        if NUL in value:  # no error class holds one
            return queryset.none()
        return queryset.filter(error_class=value)


class ErrorGroups(JobActions):
    """The errors page and its retry of a group."""

    def errors_view(self, request: HttpRequest) -> TemplateResponse:
        """Failed jobs by job type and error class: how many, the latest, its error."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        site = self.admin_site.name
        changelist = reverse(f"{site}:django_pgqueue_job_changelist")
        failed = self.get_queryset(request).filter(status=JobStatus.FAILED)
        groups = list(
            failed.values("job_type", "error_class")
            # count(*), not count(id): the id is not in idx_jobs_failed, the rest is.
            .annotate(jobs=Count("*"), latest=Max("completed_at"))
            .order_by("-jobs", "job_type", "error_class")[: GROUPS_SHOWN + 1]
        )
        messages = _newest_errors(failed, groups[:GROUPS_SHOWN])
        retry = self.has_retry_permission(request)
        rows = [
            self._group_row(group, messages, changelist, retry) for group in groups[:GROUPS_SHOWN]
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": _("Errors"),
            "opts": self.opts,
            "groups": rows,
            "more": len(groups) > GROUPS_SHOWN,
            "changelist_url": changelist,
            "retry_url": reverse(f"{site}:django_pgqueue_job_errors_retry") if retry else None,
        }
        return TemplateResponse(request, f"{TEMPLATES}/errors.html", context)

    def _group_row(
        self,
        group: dict[str, Any],
        messages: dict[tuple[str, str], str],
        changelist: str,
        retry: bool,
    ) -> dict[str, Any]:
        job_type, error = group["job_type"], group["error_class"]
        filters = {"status__exact": JobStatus.FAILED.value, "job_type": job_type, "error": error}
        message = messages.get((job_type, error), "")
        return {
            "job_type": job_type,
            "error_class": error,
            "jobs": group["jobs"],
            "latest": display_datetime(group["latest"]),
            "message": message[:ERROR_SHOWN] + ("…" if len(message) > ERROR_SHOWN else ""),
            "url": f"{changelist}?{urlencode(filters)}",
        }

    def errors_retry_view(self, request: HttpRequest) -> HttpResponse:
        """Retry every failed job of one group (the errors page's buttons), then go back."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and self.has_retry_permission(request)):
            raise PermissionDenied
        job_type, error = request.POST.get("job_type"), request.POST.get("error_class")
        if job_type is None or error is None:
            return self._not_found(request, _("No group of errors was named."))
        group = failed_group(self.get_queryset(request), job_type, error)
        # Job's manager builds JobQuerySets; the admin's get_queryset is typed as QuerySet.
        self.retry_jobs(request, cast(JobQuerySet, group))
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:django_pgqueue_job_errors"))
