"""How the admin writes times, durations and JSON: plain helpers shared by its pages."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from ..schema import IN_FLIGHT

#: The directory of the Job admin's templates.
TEMPLATES = "django_pgqueue/admin/job"


def short_duration(delta: timedelta | None) -> str:
    """``4.2s``, ``12s``, ``3m 12s``, ``2h 5m``, ``3d 4h``; never negative (``0.0s``)."""
    if delta is None:
        return ""
    exact = max(delta.total_seconds(), 0.0)
    seconds = int(exact)
    if seconds < 60:
        return f"{exact:.1f}s" if seconds < 10 else f"{seconds}s"
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


def json_pre(value: object) -> SafeString:
    """``value`` as indented JSON in a ``<pre>``."""
    return format_html(
        '<pre class="pgqueue-pre pgqueue-json">{}</pre>',
        json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True),
    )


def status_label(job: Any) -> str:
    """The status as the badges show it: a claimed or running job asked to stop says
    so, until its worker stops it."""
    label = str(job.get_status_display())
    if job.cancel_requested_at is not None and job.status in IN_FLIGHT:
        return _("%(status)s, cancel requested") % {"status": label}
    return label
