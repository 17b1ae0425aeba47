"""The Job ModelAdmin: its changelist (columns, filters, search, a bounded paginator) and
the job page, assembled from the admin's parts.

The cells come from ``cells``, the actions from ``actions``, the live endpoint from
``live`` and the queue overview from ``overview``; this module says which are shown
where, and mounts the extra URLs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.core.paginator import EmptyPage, Page
from django.db.models import BooleanField, ExpressionWrapper, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils.functional import cached_property
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from .. import schema
from ..due import due_q
from ..models import Job, JobWait
from ..schema import IN_FLIGHT, JobStatus
from .actions import rerun_choices
from .base import JobPaginator
from .charts import ChartsPage
from .errors import ErrorFilter, ErrorGroups
from .filters import JobTypeFilter, QueueFilter, SearchError, search_filter
from .formatting import TEMPLATES
from .live import LiveView
from .overview import QueueOverview
from .periodic import PeriodicPage
from .refusals import refusing_writes
from .workflows import WORKFLOW_FIELDSET, WorkflowCells, WorkflowFilter

#: The columns the job list sorts by in any case: their order is idx_jobs_created's.
INDEXED_SORTS = ("short_id", "created", "age")
#: The states whose lists sort by every column (a partial index holds only their jobs).
SORTS_EVERY_COLUMN = frozenset(schema.values(IN_FLIGHT | {JobStatus.PENDING}))

#: The fieldset of the job page, added for jobs with durable steps.
STEPS_FIELDSET = (gettext_lazy("Steps"), {"fields": ("steps_display",)})


class EstimatedCountPaginator(JobPaginator):
    """Counts exactly up to ``exact_count_limit`` rows and estimates beyond that.

    A page of a million-row changelist then costs a bounded scan instead of a
    ``COUNT(*)`` of the table. Beyond the limit the count is the planner's estimate
    (``EXPLAIN``, which scales ``pg_class.reltuples``), and ``count_is_estimate`` is set
    so the page can say "about".

    The first page is read before anything is counted: when it is not full, its rows are
    the count, and the list shows them without another query. A filter matching a few
    jobs among millions (a rare queue or job type, which no index holds) then reads the
    table once, not once to count and again to list.
    """

    exact_count_limit = 10_000
    count_is_estimate = False

    @cached_property
    def first_rows(self) -> list[Job]:
        """The first page's rows and, if there is one, the row after them."""
        return list(self.object_list[: self.per_page + 1])

    @cached_property
    def count(self) -> int:
        if len(self.first_rows) <= self.per_page:
            return len(self.first_rows)
        exact: int = self._rows()[: self.exact_count_limit + 1].count()
        if exact <= self.exact_count_limit:
            return exact
        self.count_is_estimate = True
        return max(planner_estimate(self._rows()), exact)

    def page(self, number: Any) -> Page[Job]:
        """As Django's, the first page with the rows already read (its own slice of the
        queryset is then never run)."""
        page: Page[Job] = super().page(number)
        if page.number == 1:
            page.object_list = self.first_rows[: self.per_page]
        return page

    def validate_number(self, number: Any) -> int:
        """As Django's, but an estimate never cuts pages off: a page past it that has
        rows is valid, and the last page links to one more when rows follow it."""
        try:
            valid = super().validate_number(number)
        except EmptyPage:
            if not self.count_is_estimate:
                raise
            valid = int(number)
            if not self._has_rows_from((valid - 1) * self.per_page):
                raise
        if self.count_is_estimate and valid >= self.num_pages:
            reached = valid * self.per_page
            self._set_count(max(self.count, reached + int(self._has_rows_from(reached))))
        return valid

    def _rows(self) -> QuerySet[Job]:
        # The changelist paginates a queryset (Paginator's type allows any sequence).
        return cast("QuerySet[Job]", self.object_list).order_by()

    def _has_rows_from(self, offset: int) -> bool:
        return self._rows()[offset : offset + 1].exists()

    def _set_count(self, count: int) -> None:
        self.__dict__["count"] = count
        for derived in ("num_pages", "page_range"):  # cached from the count
            self.__dict__.pop(derived, None)


def planner_estimate(queryset: QuerySet[Any]) -> int:
    """The number of rows PostgreSQL's planner expects ``queryset`` to return."""
    plan: Any = json.loads(queryset.explain(format="json"))
    if isinstance(plan, str):  # depending on the driver, the JSON arrives as text
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class JobChangeList(ChangeList):
    """The changelist, without the large columns no list cell shows, and with whether
    each job is due as the database decides it (``is_due``, for the "runs at" column)."""

    def get_ordering(self, request: HttpRequest, queryset: QuerySet[Job]) -> list[Any]:
        """The ordering asked for, without the columns the list may not sort by
        (``JobAdmin.get_sortable_by()``): asked for those only, the default order."""
        asked = self.params.get(ORDER_VAR)
        if asked is not None:
            kept = [part for part in str(asked).split(".") if self._may_sort_by(part)]
            if kept:
                self.params[ORDER_VAR] = ".".join(kept)
            else:
                del self.params[ORDER_VAR]
        ordering: list[Any] = super().get_ordering(request, queryset)
        return ordering

    def _may_sort_by(self, part: str) -> bool:
        """Whether ``part`` of an ``o`` parameter (``"4"``, ``"-4"``) names a column the
        list may sort by."""
        index = part.rpartition("-")[2]
        if not index.isdigit() or int(index) >= len(self.list_display):
            return False
        return self.list_display[int(index)] in (self.sortable_by or ())

    def get_queryset(self, request: HttpRequest, *args: Any, **kwargs: Any) -> QuerySet[Job]:
        queryset: QuerySet[Job] = super().get_queryset(request, *args, **kwargs)
        if request.GET.get("status__exact") == JobStatus.WAITING.value:
            # Every waiting job has a row of the small pgqueue_job_waits: found from
            # there, not by reading the jobs table (no index holds their status).
            queryset = queryset.filter(pk__in=JobWait.objects.values("job_id"))
        deferred = queryset.defer("data", "result", "last_error", "last_traceback", "worker_ids")
        return deferred.annotate(is_due=ExpressionWrapper(due_q(), output_field=BooleanField()))

    def get_results(self, request: HttpRequest) -> None:
        """As Django's, but a list of one page shows the rows the paginator counted,
        instead of reading them again."""
        super().get_results(request)
        paginator = cast(EstimatedCountPaginator, self.paginator)
        if not self.multi_page and not self.show_all:
            self.result_list = paginator.first_rows


class JobAdmin(WorkflowCells, ErrorGroups, PeriodicPage, ChartsPage, LiveView, QueueOverview):
    """Jobs, read-only, with live progress, retry/cancel/run-now actions and an overview."""

    class Media:
        css = {"all": ["django_pgqueue/admin/jobs.css"]}
        js = ["django_pgqueue/admin/jobs.js"]

    change_list_template = f"{TEMPLATES}/change_list.html"
    change_form_template = f"{TEMPLATES}/change_form.html"
    paginator = EstimatedCountPaginator
    list_per_page = 50
    # Both would count over the whole table on every page load.
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_display = (
        "short_id",
        "job_type",
        "queue",
        "status_badge",
        "priority",
        "progress_bar",
        "attempts_display",
        "worker",
        "runs_at",
        "created",
        "started",
        "completed",
        "age",
    )
    list_display_links = ("short_id", "job_type")
    list_filter = (
        "status",
        QueueFilter,
        JobTypeFilter,
        "held",
        ("created_at", admin.DateFieldListFilter),
        WorkflowFilter,
        ErrorFilter,
    )
    # The search is ours (get_search_results); naming a field only shows the search box.
    search_fields = ("job_type",)
    search_help_text = gettext_lazy(
        "A job id, part of a job type, an exact unique key, or a payload match: key=value "
        '(order_id=42) or a JSON object ({"user": {"id": 7}}).'
    )
    actions = ("retry_jobs", "cancel_jobs", "run_jobs_now", "end_waits")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "job_type",
                    "queue",
                    "priority",
                    "unique_key",
                    "concurrency_key",
                    "held",
                    "status_badge",
                    "progress_bar",
                    "stage",
                    "cancel_requested",
                )
            },
        ),
        (gettext_lazy("Payload and result"), {"fields": ("data_pretty", "result_pretty")}),
        (
            gettext_lazy("Attempts"),
            {
                "fields": (
                    "attempts_display",
                    "timeout",
                    "snoozes",
                    "worker",
                    "worker_ids_display",
                    "lost_with_worker",
                    "trace_display",
                    "last_error_pre",
                    "traceback_pre",
                )
            },
        ),
        (
            gettext_lazy("Timing"),
            {
                "fields": (
                    "created_full",
                    "run_at_full",
                    "claimed_full",
                    "started_full",
                    "heartbeat_full",
                    "completed_full",
                    "durations",
                )
            },
        ),
        (gettext_lazy("Attempt history"), {"fields": ("attempt_history",)}),
        (gettext_lazy("Progress history"), {"fields": ("history",)}),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        fieldsets: tuple[Any, ...] = self.fieldsets
        if obj is not None and obj.steps.exists():
            fieldsets = (*fieldsets, STEPS_FIELDSET)
        if obj is not None and obj.workflow_id is not None:
            fieldsets = (*fieldsets, WORKFLOW_FIELDSET)
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> list[str]:
        return [
            str(name)
            for _name, options in self.get_fieldsets(request, obj)
            for name in options["fields"]
        ]

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_sortable_by(self, request: HttpRequest) -> Any:
        """Every column sorts a list narrowed to an active state (its partial index reads
        only those jobs); otherwise only the columns of ``idx_jobs_created``, whose order
        the index gives: sorting all jobs by another column reads every row."""
        if request.GET.get("status__exact") in SORTS_EVERY_COLUMN:
            return self.get_list_display(request)
        return INDEXED_SORTS

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            condition = search_filter(term)
        except SearchError as error:
            message = _("Nothing can match the search “%(term)s”: %(reason)s.")
            self.message_user(request, message % {"term": term, "reason": error}, messages.ERROR)
            return queryset.none(), False
        if condition is None:
            return queryset.none(), False
        return queryset.filter(condition), False

    def get_urls(self) -> list[URLPattern]:
        def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
            return self.admin_site.admin_view(refusing_writes(view))

        return [
            path("overview/", wrap(self.overview_view), name="django_pgqueue_job_overview"),
            path(
                "overview/queues/<str:queue>/<str:action>/",
                wrap(self.queue_action_view),
                name="django_pgqueue_job_queue_action",
            ),
            path("live/", wrap(self.live_view), name="django_pgqueue_job_live"),
            path("errors/", wrap(self.errors_view), name="django_pgqueue_job_errors"),
            path("charts/", wrap(self.charts_view), name="django_pgqueue_job_charts"),
            path("periodic/", wrap(self.periodic_view), name="django_pgqueue_job_periodic"),
            path(
                "periodic/<path:name>/run/",
                wrap(self.periodic_run_view),
                name="django_pgqueue_job_periodic_run",
            ),
            path(
                "periodic/<path:name>/pause/",
                wrap(self.periodic_pause_view),
                {"pause": True},
                name="django_pgqueue_job_periodic_pause",
            ),
            path(
                "periodic/<path:name>/resume/",
                wrap(self.periodic_pause_view),
                {"pause": False},
                name="django_pgqueue_job_periodic_resume",
            ),
            path(
                "workers/<path:worker_id>/",
                wrap(self.worker_view),
                name="django_pgqueue_job_worker",
            ),
            path(
                "errors/retry/",
                wrap(self.errors_retry_view),
                name="django_pgqueue_job_errors_retry",
            ),
            path(
                "workflow/<uuid:workflow_id>/",
                wrap(self.workflow_view),
                name="django_pgqueue_job_workflow",
            ),
            path(
                "<path:object_id>/actions/<str:action>/",
                wrap(self.object_action_view),
                name="django_pgqueue_job_action",
            ),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        job = self.get_object(request, object_id)
        extra: dict[str, Any] = {"pgqueue_actions": self.job_actions(request, job) if job else []}
        if job is not None and self.has_retry_permission(request):
            extra["pgqueue_rerun_steps"] = rerun_choices(job)
            extra["pgqueue_rerun_url"] = reverse(
                f"{self.admin_site.name}:django_pgqueue_job_action", args=[job.pk, "rerun-from"]
            )
        if job is not None:
            # str(job) includes the status, which the live refresh keeps current elsewhere.
            extra["subtitle"] = f"{job.job_type} {job.pk}"
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})
