"""The Django admin for jobs: live progress, retry/cancel/run-now actions, queue overview.

Django's admin autodiscovery imports this package, which registers ``JobAdmin``. The
parts live in their own modules: ``changelist`` (the ModelAdmin, its list and page),
``filters``, ``cells`` and ``formatting`` (what the cells show), ``actions``, ``live``
(the live endpoint) and ``overview`` (the queue overview page).
"""

from django.contrib import admin

from ..models import Job
from .changelist import EstimatedCountPaginator, JobAdmin, JobChangeList, planner_estimate
from .filters import JobTypeFilter, QueueFilter, search_filter
from .formatting import display_datetime, short_datetime, short_duration
from .live import HISTORY_SHOWN, LIVE_FIELDS, LIVE_MAX_IDS

admin.site.register(Job, JobAdmin)

__all__ = [
    "HISTORY_SHOWN",
    "LIVE_FIELDS",
    "LIVE_MAX_IDS",
    "EstimatedCountPaginator",
    "JobAdmin",
    "JobChangeList",
    "JobTypeFilter",
    "QueueFilter",
    "display_datetime",
    "planner_estimate",
    "search_filter",
    "short_datetime",
    "short_duration",
]
