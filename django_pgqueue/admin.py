"""The Django admin for jobs: live progress, retry/cancel/run-now actions, queue overview.

Jobs are read-only here: nobody adds, edits or deletes them by hand. Changing a job's
state goes through the ``JobQuerySet`` transitions, as actions gated by the
``django_pgqueue.retry_job`` permission on top of staff status.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections, transaction
from django.db.models import Count, Min, Q, QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from . import conf, registry, validation
from .due import due_q, not_yet_due_q
from .exceptions import InvalidArgumentError
from .models import (
    FINISHED,
    IN_FLIGHT,
    RETRY_PERMISSION,
    Job,
    JobEvent,
    JobQuerySet,
    JobStatus,
    WorkerRecord,
)
from .queues import pause_queue, paused_since, queue_limits, resume_queue

logger = logging.getLogger("django_pgqueue.admin")

#: Events shown on a job's page and returned by the live endpoint.
HISTORY_SHOWN = 50
#: Most job ids one live request may ask about.
LIVE_MAX_IDS = 200
#: Newest jobs read to offer queue and job type filter choices (never the whole table).
RECENT_JOBS_FOR_FILTERS = 10_000
RETRYABLE = (JobStatus.FAILED, JobStatus.CANCELLED)
TEMPLATES = "django_pgqueue/admin/job"


class EstimatedCountPaginator(Paginator):
    """Counts exactly up to ``exact_count_limit`` rows and estimates beyond that.

    A page of a million-row changelist then costs a bounded scan instead of a
    ``COUNT(*)`` of the table. Beyond the limit the count is the planner's estimate
    (``EXPLAIN``, which scales ``pg_class.reltuples``), and ``count_is_estimate`` is set
    so the page can say "about".
    """

    exact_count_limit = 10_000
    count_is_estimate = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list.order_by()
        exact: int = queryset[: self.exact_count_limit + 1].count()
        if exact <= self.exact_count_limit:
            return exact
        self.count_is_estimate = True
        return max(planner_estimate(queryset), exact)


def planner_estimate(queryset: QuerySet[Any]) -> int:
    """The number of rows PostgreSQL's planner expects ``queryset`` to return."""
    plan: Any = json.loads(queryset.explain(format="json"))
    if isinstance(plan, str):  # depending on the driver, the JSON arrives as text
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class JobChangeList(ChangeList):
    """The changelist, without the large columns no list cell shows."""

    def get_queryset(self, request: HttpRequest, *args: Any, **kwargs: Any) -> QuerySet[Job]:
        queryset: QuerySet[Job] = super().get_queryset(request, *args, **kwargs)
        return queryset.defer("data", "result", "last_error", "last_traceback", "worker_ids")


def recent_values(column: str) -> list[str]:
    """Distinct values of ``column`` among the newest jobs (an index scan, bounded)."""
    if column not in ("queue", "job_type"):  # interpolated below: never user input
        raise ValueError(f"not a filterable column: {column!r}")
    with connections[conf.jobs_database()].cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT {column} FROM (SELECT {column} FROM pgqueue_jobs"
            " ORDER BY created_at DESC, id DESC LIMIT %s) AS recent",
            [RECENT_JOBS_FOR_FILTERS],
        )
        return [row[0] for row in cursor.fetchall()]


class _ValuesFilter(admin.SimpleListFilter):
    """Choices from the handler registry and the newest jobs, never a DISTINCT over the
    whole table (which a million rows would make slow on every page)."""

    column = ""

    def known_values(self) -> Iterable[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = {*self.known_values(), *recent_values(self.column)}
        if self.value():
            values.add(self.value())
        return [(value, value) for value in sorted(values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        if self.value():
            return queryset.filter(**{self.column: self.value()})
        return queryset


class QueueFilter(_ValuesFilter):
    title = gettext_lazy("queue")
    parameter_name = column = "queue"

    def known_values(self) -> Iterable[str]:
        yield conf.get_settings().DEFAULT_QUEUE
        for job_type in registry.registered_job_types():
            queue = registry.get_definition(job_type).queue
            if queue:
                yield queue


class JobTypeFilter(_ValuesFilter):
    title = gettext_lazy("job type")
    parameter_name = column = "job_type"

    def known_values(self) -> Iterable[str]:
        return registry.registered_job_types()


def search_filter(term: str) -> Q | None:
    """The filter a changelist search term means; None when it can match nothing.

    - a UUID: that job;
    - ``{...}``: jobs whose ``data`` contains that JSON object;
    - ``key=value``: jobs whose ``data`` has ``key`` equal to ``value``, read as JSON
      when it parses (``42``, ``true``) and also as text; ``"42"`` is only text;
    - anything else: job types containing the term, and the job with that exact
      ``unique_key``.

    ``data`` is matched with ``@>`` (containment), which the ``jsonb_path_ops`` GIN index
    ``idx_jobs_data`` serves.
    """
    try:
        return Q(pk=uuid.UUID(term))
    except ValueError:
        pass
    if term.startswith("{"):
        try:
            wanted = json.loads(term)
        except ValueError:
            return None
        return Q(data__contains=wanted) if isinstance(wanted, dict) else None
    key, equals, raw = term.partition("=")
    key, raw = key.strip(), raw.strip()
    if equals and key:
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        condition = Q(data__contains={key: value})
        if not isinstance(value, str):  # 42 may have been sent as "42"; "42" means text
            condition |= Q(data__contains={key: raw})
        return condition
    return Q(job_type__icontains=term) | Q(unique_key=term)


def short_duration(delta: timedelta | None) -> str:
    """``4s``, ``3m 12s``, ``2h 5m``, ``3d 4h``."""
    if delta is None:
        return ""
    seconds = max(int(delta.total_seconds()), 0)
    if seconds < 60:
        return f"{delta.total_seconds():.1f}s" if seconds < 10 else f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def display_datetime(value: datetime | None) -> str:
    """``2026-12-02 15:09:42`` in the current time zone; jobs need the seconds."""
    if value is None:
        return ""
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")


def short_datetime(value: datetime | None) -> str:
    """Today's times as ``15:09:42``, other days as ``2026-12-01``: narrow list columns."""
    if value is None:
        return ""
    local = timezone.localtime(value)
    if local.date() == timezone.localdate():
        return local.strftime("%H:%M:%S")
    return local.strftime("%Y-%m-%d")


def time_state(value: datetime | None) -> dict[str, str]:
    """A time in both formats, for the live endpoint."""
    return {"short": short_datetime(value), "full": display_datetime(value)}


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
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
        ("created_at", admin.DateFieldListFilter),
    )
    # The search is ours (get_search_results); naming a field only shows the search box.
    search_fields = ("job_type",)
    search_help_text = gettext_lazy(
        "A job id, part of a job type, an exact unique key, or a payload match: key=value "
        '(order_id=42) or a JSON object ({"user": {"id": 7}}).'
    )
    actions = ("retry_jobs", "cancel_jobs", "run_jobs_now")
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
                    "worker",
                    "worker_ids_display",
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
        (gettext_lazy("Progress history"), {"fields": ("history",)}),
    )

    # -- permissions ------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs come from enqueue(), which validates them and wakes workers

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # state changes go through the actions, never through a form

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # a deleted running job would vanish under its worker; cancel it

    def has_retry_permission(self, request: HttpRequest) -> bool:
        """May retry, cancel and run jobs now (``django_pgqueue.retry_job``)."""
        return request.user.has_perm(f"{self.opts.app_label}.{RETRY_PERMISSION}")

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> list[str]:
        return [name for _name, options in self.fieldsets for name in options["fields"]]

    # -- changelist -------------------------------------------------------------------

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = search_filter(term)
        if condition is None:
            return queryset.none(), False
        return queryset.filter(condition), False

    # -- cells ------------------------------------------------------------------------

    def _live(self, job: Job, field: str, text: object) -> SafeString:
        """A cell the live refresh updates (see static/django_pgqueue/admin/jobs.js)."""
        return format_html(
            '<span data-pgqueue-job="{}" data-pgqueue-field="{}">{}</span>',
            job.pk,
            field,
            text if text not in (None, "") else self.get_empty_value_display(),
        )

    @admin.display(description=gettext_lazy("ID"), ordering="id")
    def short_id(self, job: Job) -> SafeString:
        return format_html('<code title="{}">{}</code>', job.pk, str(job.pk)[:8])

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_badge(self, job: Job) -> SafeString:
        return format_html(
            '<span class="pgqueue-status pgqueue-status-{}" data-pgqueue-job="{}" '
            'data-pgqueue-field="status" data-pgqueue-status="{}">{}</span>',
            job.status,
            job.pk,
            job.status,
            job.get_status_display(),
        )

    @admin.display(description=gettext_lazy("progress"), ordering="progress")
    def progress_bar(self, job: Job) -> str:
        return render_to_string(f"{TEMPLATES}/progress.html", {"job": job})

    @admin.display(description=gettext_lazy("current stage"))
    def stage(self, job: Job) -> SafeString:
        return self._live(job, "stage", job.current_stage)

    @admin.display(description=gettext_lazy("attempts"), ordering="attempts")
    def attempts_display(self, job: Job) -> SafeString:
        return self._live(job, "attempts", f"{job.attempts} / {job.max_attempts}")

    @admin.display(description=gettext_lazy("worker"), ordering="worker_id")
    def worker(self, job: Job) -> SafeString:
        return format_html(
            '<span class="pgqueue-worker" title="{}" data-pgqueue-job="{}" '
            'data-pgqueue-field="worker">{}</span>',
            job.worker_id or "",
            job.pk,
            job.worker_id or self.get_empty_value_display(),
        )

    def _time(self, job: Job, field: str, value: datetime | None, *, short: bool) -> SafeString:
        """A time cell; ``field`` names it for the live refresh ("" when it never changes)."""
        if value is None:
            text = self.get_empty_value_display()
        else:
            text = short_datetime(value) if short else display_datetime(value)
        return format_html(
            '<span class="pgqueue-time" title="{}" data-pgqueue-job="{}" data-pgqueue-field="{}" '
            'data-pgqueue-format="{}">{}</span>',
            display_datetime(value),
            job.pk,
            field,
            "short" if short else "full",
            text,
        )

    @admin.display(description=gettext_lazy("created at"), ordering="created_at")
    def created(self, job: Job) -> SafeString:
        return self._time(job, "", job.created_at, short=True)

    @admin.display(description=gettext_lazy("started at"), ordering="started_at")
    def started(self, job: Job) -> SafeString:
        return self._time(job, "started", job.started_at, short=True)

    @admin.display(description=gettext_lazy("completed at"), ordering="completed_at")
    def completed(self, job: Job) -> SafeString:
        return self._time(job, "completed", job.completed_at, short=True)

    @admin.display(description=gettext_lazy("created at"))
    def created_full(self, job: Job) -> SafeString:
        return self._time(job, "", job.created_at, short=False)

    @admin.display(description=gettext_lazy("run at"))
    def run_at_full(self, job: Job) -> SafeString:
        return self._time(job, "", job.run_at, short=False)

    @admin.display(description=gettext_lazy("claimed at"))
    def claimed_full(self, job: Job) -> SafeString:
        return self._time(job, "", job.claimed_at, short=False)

    @admin.display(description=gettext_lazy("started at"))
    def started_full(self, job: Job) -> SafeString:
        return self._time(job, "started", job.started_at, short=False)

    @admin.display(description=gettext_lazy("last heartbeat"))
    def heartbeat_full(self, job: Job) -> SafeString:
        return self._time(job, "", job.heartbeat_at, short=False)

    @admin.display(description=gettext_lazy("completed at"))
    def completed_full(self, job: Job) -> SafeString:
        return self._time(job, "completed", job.completed_at, short=False)

    @admin.display(description=gettext_lazy("cancel requested at"))
    def cancel_requested(self, job: Job) -> SafeString:
        return self._time(job, "", job.cancel_requested_at, short=False)

    @admin.display(description=gettext_lazy("age"), ordering="-created_at")
    def age(self, job: Job) -> SafeString:
        return format_html(
            '<span title="{}">{}</span>',
            display_datetime(job.created_at),
            short_duration(timezone.now() - job.created_at),
        )

    @admin.display(description=gettext_lazy("data"))
    def data_pretty(self, job: Job) -> SafeString:
        return _json_pre(job.data)

    @admin.display(description=gettext_lazy("result"))
    def result_pretty(self, job: Job) -> SafeString | str:
        return _json_pre(job.result) if job.result is not None else ""

    @admin.display(description=gettext_lazy("workers of each attempt"))
    def worker_ids_display(self, job: Job) -> str:
        return ", ".join(job.worker_ids)

    @admin.display(description=gettext_lazy("last error"))
    def last_error_pre(self, job: Job) -> SafeString | str:
        if not job.last_error:
            return ""
        return format_html(
            '<pre class="pgqueue-pre" data-pgqueue-job="{}" data-pgqueue-field="last_error">'
            "{}</pre>",
            job.pk,
            job.last_error,
        )

    @admin.display(description=gettext_lazy("traceback"))
    def traceback_pre(self, job: Job) -> SafeString | str:
        if not job.last_traceback:
            return ""
        return format_html('<pre class="pgqueue-pre">{}</pre>', job.last_traceback)

    @admin.display(description=gettext_lazy("durations"))
    def durations(self, job: Job) -> str:
        parts = []
        if job.claimed_at and job.run_at:
            waited = short_duration(job.claimed_at - job.run_at)
            parts.append(_("waited %s after it was due") % waited)
        if job.started_at:
            end = job.completed_at or timezone.now()
            ran = short_duration(end - job.started_at)
            parts.append(_("ran %s") % ran if job.completed_at else _("running for %s") % ran)
        return "; ".join(parts)

    @admin.display(description=gettext_lazy("events"))
    def history(self, job: Job) -> str:
        return render_to_string(
            f"{TEMPLATES}/history.html",
            {"job": job, "events": [_event_state(event) for event in recent_events(job.pk)]},
        )

    # -- actions ----------------------------------------------------------------------

    @admin.action(
        permissions=["retry"], description=gettext_lazy("Retry selected failed or cancelled jobs")
    )
    def retry_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        selected = queryset.count()
        changed = queryset.filter(status__in=RETRYABLE).retry()
        # What retry() left failed or cancelled: its unique key is held by an active job.
        held = queryset.filter(status__in=RETRYABLE).count()
        message = _(
            "Retry: %(changed)d changed, %(skipped)d skipped (not failed or cancelled)."
        ) % {"changed": changed, "skipped": selected - changed - held}
        if held:
            held_message = _("%(held)d skipped (unique key held by an active job).")
            message += " " + held_message % {"held": held}
        self._report(request, message, changed)

    @admin.action(permissions=["retry"], description=gettext_lazy("Cancel selected jobs"))
    def cancel_jobs(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        selected = queryset.count()
        with transaction.atomic(using=queryset.db):
            cancelled = queryset.filter(status=JobStatus.PENDING).cancel()
            asked = queryset.filter(status__in=IN_FLIGHT, cancel_requested_at__isnull=True).cancel()
        changed = cancelled + asked
        self._report(
            request,
            _(
                "Cancel: %(changed)d changed (%(cancelled)d pending cancelled, %(asked)d "
                "running asked to stop), %(skipped)d skipped (finished, or already asked "
                "to stop)."
            )
            % {
                "changed": changed,
                "cancelled": cancelled,
                "asked": asked,
                "skipped": selected - changed,
            },
            changed,
        )

    @admin.action(permissions=["retry"], description=gettext_lazy("Run selected delayed jobs now"))
    def run_jobs_now(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        selected = queryset.count()
        changed = queryset.run_now()
        self._report(
            request,
            _("Run now: %(changed)d changed, %(skipped)d skipped (not delayed pending jobs).")
            % {"changed": changed, "skipped": selected - changed},
            changed,
        )

    def _report(self, request: HttpRequest, message: str, changed: int) -> None:
        logger.info("admin user %s: %s", request.user.get_username(), message)
        self.message_user(request, message, messages.SUCCESS if changed else messages.WARNING)

    def job_actions(self, request: HttpRequest, job: Job) -> list[dict[str, str]]:
        """The actions the user may apply to ``job`` now: for buttons on its page."""
        if not self.has_retry_permission(request):
            return []
        applicable = {
            "retry": job.status in RETRYABLE,
            "cancel": job.status == JobStatus.PENDING
            or (job.status in IN_FLIGHT and job.cancel_requested_at is None),
            "run-now": job.status == JobStatus.PENDING and job.run_at > timezone.now(),
        }
        labels = {"retry": _("Retry"), "cancel": _("Cancel"), "run-now": _("Run now")}
        return [
            {
                "label": labels[name],
                "url": reverse(
                    f"{self.admin_site.name}:django_pgqueue_job_action", args=[job.pk, name]
                ),
            }
            for name, ok in applicable.items()
            if ok
        ]

    # -- views ------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("overview/", wrap(self.overview_view), name="django_pgqueue_job_overview"),
            path(
                "overview/queues/<str:queue>/<str:action>/",
                wrap(self.queue_action_view),
                name="django_pgqueue_job_queue_action",
            ),
            path("live/", wrap(self.live_view), name="django_pgqueue_job_live"),
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
        if job is not None:
            # str(job) includes the status, which the live refresh keeps current elsewhere.
            extra["subtitle"] = f"{job.job_type} {job.pk}"
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})

    def object_action_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """Apply one action to one job (the buttons of its page), then go back to it."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        methods: dict[str, Callable[[HttpRequest, JobQuerySet], None]] = {
            "retry": self.retry_jobs,
            "cancel": self.cancel_jobs,
            "run-now": self.run_jobs_now,
        }
        if not (self.has_view_permission(request) and self.has_retry_permission(request)):
            raise PermissionDenied
        job = self.get_object(request, object_id)
        if action not in methods or job is None:
            return HttpResponse(status=404)
        methods[action](request, self.get_queryset(request).filter(pk=job.pk))
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:django_pgqueue_job_change", args=[job.pk])
        )

    def live_view(self, request: HttpRequest) -> JsonResponse:
        """The state of the jobs named by ``?id=``, for the pages' live refresh.

        ``?history=<id>`` adds that job's recent progress events.
        """
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            ids = {uuid.UUID(value) for value in request.GET.getlist("id")}
            history = request.GET.get("history")
            history_id = uuid.UUID(history) if history else None
        except ValueError:
            return JsonResponse({"error": "id and history must be job ids (UUIDs)"}, status=400)
        if len(ids) > LIVE_MAX_IDS:
            return JsonResponse({"error": f"at most {LIVE_MAX_IDS} ids at once"}, status=400)
        jobs = self.get_queryset(request).filter(pk__in=ids).only(*LIVE_FIELDS)
        payload: dict[str, Any] = {"jobs": [_live_state(job) for job in jobs]}
        if history_id is not None:
            payload["history"] = [_event_state(event) for event in recent_events(history_id)]
        return JsonResponse(payload)

    def queue_action_view(self, request: HttpRequest, queue: str, action: str) -> HttpResponse:
        """Pause or resume one queue (the overview's buttons), then go back to the overview."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and self.has_retry_permission(request)):
            raise PermissionDenied
        try:
            validation.queue(queue)
        except InvalidArgumentError:
            return HttpResponse(status=404)
        if action == "pause":
            changed = pause_queue(queue)
            message = (
                _("Queue “%s” paused: workers claim none of its jobs until it is resumed.")
                if changed
                else _("Queue “%s” was already paused.")
            )
        elif action == "resume":
            changed = resume_queue(queue)
            message = (
                _("Queue “%s” resumed: workers claim its jobs again.")
                if changed
                else _("Queue “%s” was not paused.")
            )
        else:
            return HttpResponse(status=404)
        self._report(request, message % queue, int(changed))
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:django_pgqueue_job_overview"))

    def overview_view(self, request: HttpRequest) -> TemplateResponse:
        """Counts per queue and status, throughput, waiting time, and the workers."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = timezone.now()
        changelist = reverse(f"{self.admin_site.name}:django_pgqueue_job_changelist")
        queues = queue_stats(now)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Queue overview"),
            "opts": self.opts,
            "now": display_datetime(now),
            "statuses": JobStatus.choices,
            "queues": [
                _queue_row(row, now, changelist) | state
                for row, state in _with_queue_states(queues, self, request)
            ],
            "totals": _queue_row(_totals(queues), now, changelist),
            "workers": worker_rows(now),
            "changelist_url": changelist,
        }
        return TemplateResponse(request, f"{TEMPLATES}/overview.html", context)


#: The columns the live refresh reads.
LIVE_FIELDS = (
    "id",
    "status",
    "progress",
    "current_stage",
    "attempts",
    "max_attempts",
    "worker_id",
    "started_at",
    "completed_at",
    "last_error",
    "events_count",
)


def _live_state(job: Job) -> dict[str, Any]:
    return {
        "id": str(job.pk),
        "status": job.status,
        "status_label": job.get_status_display(),
        "finished": job.status in FINISHED,
        "progress": job.progress,
        "current_stage": job.current_stage,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "worker_id": job.worker_id,
        "started_at": time_state(job.started_at),
        "completed_at": time_state(job.completed_at),
        "last_error": job.last_error,
        "events_count": job.events_count,
    }


def recent_events(job_id: object) -> list[JobEvent]:
    """The job's newest ``HISTORY_SHOWN`` progress events, oldest first."""
    events = list(JobEvent.objects.filter(job_id=job_id).order_by("-id")[:HISTORY_SHOWN])
    return events[::-1]


def _event_state(event: JobEvent) -> dict[str, Any]:
    return {
        "created_at": display_datetime(event.created_at),
        "progress": event.progress,
        "stage": event.stage,
    }


def _json_pre(value: object) -> SafeString:
    return format_html(
        '<pre class="pgqueue-pre pgqueue-json">{}</pre>',
        json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True),
    )


_STATUS_COUNTS = {status: Count("pk", filter=Q(status=status)) for status in JobStatus.values}


def queue_stats(now: datetime) -> list[dict[str, Any]]:
    """One row per queue: jobs per status, oldest due pending job, recent throughput.

    One pass over the table (a million rows take a fraction of a second): this page is
    opened on purpose, unlike the changelist.
    """
    due = due_q() & Q(status=JobStatus.PENDING)
    return list(
        Job.objects.order_by("queue")
        .values("queue")
        .annotate(
            **_STATUS_COUNTS,
            delayed=Count("pk", filter=not_yet_due_q() & Q(status=JobStatus.PENDING)),
            oldest_due=Min("run_at", filter=due),
            completed_last_minute=Count(
                "pk",
                filter=Q(status=JobStatus.COMPLETED, completed_at__gte=now - timedelta(minutes=1)),
            ),
            completed_last_hour=Count(
                "pk",
                filter=Q(status=JobStatus.COMPLETED, completed_at__gte=now - timedelta(hours=1)),
            ),
            failed_last_hour=Count(
                "pk", filter=Q(status=JobStatus.FAILED, completed_at__gte=now - timedelta(hours=1))
            ),
        )
    )


def _with_queue_states(
    rows: list[dict[str, Any]], model_admin: JobAdmin, request: HttpRequest
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each stats row with its queue's pause state, limit and pause/resume button.

    Paused or limited queues without jobs get an empty row, so they can be resumed here.
    """
    paused, limits = paused_since(), queue_limits()
    present = {row["queue"] for row in rows}
    rows = sorted(
        [*rows, *({"queue": name} for name in {*paused, *limits} - present)],
        key=lambda row: row["queue"],
    )
    may_change = model_admin.has_retry_permission(request)
    site = model_admin.admin_site.name
    result = []
    for row in rows:
        name = row["queue"]
        action = "resume" if name in paused else "pause"
        state: dict[str, Any] = {
            "paused_at": display_datetime(paused.get(name)),
            "limit": limits.get(name),
            "queue_action": {
                "label": _("Resume") if name in paused else _("Pause"),
                "url": reverse(f"{site}:django_pgqueue_job_queue_action", args=[name, action]),
            }
            if may_change
            else None,
        }
        result.append((row, state))
    return result


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    totals: dict[str, Any] = {"queue": None}
    for row in rows:
        for key, value in row.items():
            if key == "queue" or value is None:
                continue
            if key == "oldest_due":
                totals[key] = min(value, totals.get(key) or value)
            else:
                totals[key] = totals.get(key, 0) + value
    return totals


def _queue_row(row: dict[str, Any], now: datetime, changelist: str) -> dict[str, Any]:
    """A stats row with, for each status, its count and the changelist link showing it."""
    base = {"queue": row["queue"]} if row.get("queue") else {}
    oldest = row.get("oldest_due")
    return {
        **row,
        "counts": [
            {
                "status": status,
                "count": row.get(status, 0),
                "url": f"{changelist}?{urlencode({**base, 'status__exact': status})}",
            }
            for status in JobStatus.values
        ],
        "oldest_due_wait": short_duration(now - oldest) if oldest else "",
        "url": f"{changelist}?{urlencode(base)}",
    }


def worker_rows(now: datetime, limit: int = 50) -> list[dict[str, Any]]:
    """The most recently seen workers, with their state and how many jobs they hold."""
    held = dict(
        Job.objects.filter(status__in=IN_FLIGHT)
        .order_by()
        .values_list("worker_id")
        .annotate(count=Count("pk"))
    )
    stale_after = timedelta(seconds=conf.get_settings().STALE_AFTER)
    rows = []
    for record in WorkerRecord.objects.order_by("-heartbeat_at")[:limit]:
        if record.stopped_at is not None:
            state = _("stopped")
        elif now - record.heartbeat_at > stale_after:
            state = _("not responding")
        else:
            state = _("alive")
        rows.append(
            {
                "record": record,
                "state": state,
                "held": held.get(record.worker_id, 0),
                "last_seen": short_duration(now - record.heartbeat_at),
                "heartbeat_at": display_datetime(record.heartbeat_at),
                "started_at": display_datetime(record.started_at),
                "queues": ", ".join(record.queues) if record.queues else _("all"),
            }
        )
    return rows
