"""The charts page: jobs finished and failed, waiting and run times, and queue depth over
the last hour, day or week, for all queues or one queue or job type.

The figures come from the per-minute rollups that workers write (``rollups.series()``),
never from the jobs table, so the page costs the same at ten jobs or ten million. The
charts are SVG drawn here (``admin.svg``); the page reloads itself every minute.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.translation import gettext as _

from .. import conf, registry, rollups, validation
from ..exceptions import InvalidArgumentError
from .base import JobAdminBase
from .formatting import TEMPLATES, short_duration
from .svg import Line, line_chart

#: Seconds between the page's reloads.
REFRESH_SECONDS = 60


def seconds_label(value: float) -> str:
    """``0 ms``, ``7.5 ms``, ``120 ms``, ``4.2s``, ``3m 12s``."""
    if value < 0.01:
        return f"{value * 1000:.1f} ms" if value else "0 ms"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return short_duration(timedelta(seconds=value))


def count_label(value: float) -> str:
    """``0``, ``0.5``, ``25``, ``1,250``."""
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


class ChartsPage(JobAdminBase):
    """``JobAdmin.charts_view``."""

    def charts_view(self, request: HttpRequest) -> HttpResponse:
        """The charts for ``?span=hour|day|week``, ``&queue=`` and ``&job_type=``."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        span = request.GET.get("span", "hour")
        if span not in rollups.SPANS:
            return self._not_found(request, _("No chart span “%s”.") % span)
        chosen: dict[str, str | None] = {}
        for key, check in (("queue", validation.queue), ("job_type", validation.job_type)):
            value = request.GET.get(key) or None
            if value is not None:
                try:
                    check(value, key)
                except InvalidArgumentError:
                    return self._not_found(
                        request,
                        _("No %(key)s “%(value)s”.")
                        % {
                            "key": key.replace("_", " "),
                            "value": value,
                        },
                    )
            chosen[key] = value
        figures = rollups.series(span, queue=chosen["queue"], job_type=chosen["job_type"])
        queues, job_types = rollups.rolled_up_names()
        registered = registry.registered_job_types()
        site = self.admin_site.name
        here = reverse(f"{site}:django_pgqueue_job_charts")
        context = {
            **self.admin_site.each_context(request),
            "title": _("Charts"),
            "opts": self.opts,
            "span": span,
            "spans": [
                (name, label, f"{here}?{urlencode({'span': name, **_given(chosen)})}")
                for name, label in (("hour", _("Hour")), ("day", _("Day")), ("week", _("Week")))
            ],
            "queue": chosen["queue"] or "",
            "job_type": chosen["job_type"] or "",
            "queues": sorted({*queues, *_queues_of(registered)}),
            "job_types": sorted({*job_types, *registered}),
            "charts": _charts(figures, chosen["job_type"] is not None),
            "refresh": REFRESH_SECONDS,
            "changelist_url": reverse(f"{site}:django_pgqueue_job_changelist"),
            "overview_url": reverse(f"{site}:django_pgqueue_job_overview"),
        }
        return TemplateResponse(request, f"{TEMPLATES}/charts.html", context)


def _queues_of(job_types: list[str]) -> set[str]:
    """The default queue and those of ``job_types``' handlers."""
    queues = {conf.get_settings().DEFAULT_QUEUE}
    for job_type in job_types:
        definition = registry.find_definition(job_type)
        if definition is not None and definition.queue:
            queues.add(definition.queue)
    return queues


def _given(chosen: dict[str, str | None]) -> dict[str, str]:
    return {key: value for key, value in chosen.items() if value}


def _charts(figures: rollups.Series, by_job_type: bool) -> list[Any]:
    per = {
        "hour": _("per minute"),
        "day": _("per 15 minutes"),
        "week": _("per 2 hours"),
    }[figures.span]

    def when(at: datetime) -> str:
        local = timezone.localtime(at)
        return local.strftime("%a %H:%M") if figures.span == "week" else local.strftime("%H:%M")

    def chart(title: str, lines: list[Line], value: Any) -> Any:
        return line_chart(title, figures.times, lines, format_value=value, format_time=when)

    charts = [
        chart(
            _("Jobs finished, %s") % per,
            [
                Line(_("completed"), figures.completed),
                Line(_("failed"), figures.failed),
                Line(_("cancelled"), figures.cancelled),
            ],
            count_label,
        ),
        chart(
            _("Waiting time, due to start"),
            [Line(f"p{round(p * 100)}", values) for p, values in figures.wait.items()],
            seconds_label,
        ),
        chart(
            _("Run time"),
            [Line(f"p{round(p * 100)}", values) for p, values in figures.run.items()],
            seconds_label,
        ),
    ]
    if not by_job_type:
        charts.append(
            chart(
                _("Queue depth (the most sampled in each point)"),
                [
                    Line(_("due"), figures.pending),
                    Line(_("scheduled"), figures.scheduled),
                    Line(_("claimed or running"), figures.running),
                ],
                count_label,
            )
        )
    return charts
