"""The Django admin for jobs: live progress, retry/cancel/run-now actions, queue overview,
and the concurrency and rate limits.

Django's admin autodiscovery imports this package, which registers ``JobAdmin``,
``ConcurrencyLimitAdmin``, ``RateLimitAdmin`` and ``StoredScheduleAdmin``. The parts
live in their own modules: ``changelist`` (the ModelAdmin, its list and page),
``filters``, ``cells`` and ``formatting`` (what the cells show), ``actions``, ``live``
(the live endpoint), ``overview`` (the queue overview page), ``limits`` and
``rate_limits`` (declared and overridden limits), ``periodic`` (every schedule) and
``schedules`` (those stored in the database).
"""

from django.contrib import admin

from ..models import ConcurrencyLimit, Job, RateLimit, StoredSchedule
from .changelist import EstimatedCountPaginator, JobAdmin, JobChangeList, planner_estimate
from .filters import JobTypeFilter, QueueFilter, search_filter
from .formatting import display_datetime, short_datetime, short_duration
from .limits import ConcurrencyLimitAdmin
from .live import HISTORY_SHOWN, LIVE_FIELDS, LIVE_MAX_IDS
from .rate_limits import RateLimitAdmin
from .schedules import StoredScheduleAdmin

admin.site.register(Job, JobAdmin)
admin.site.register(ConcurrencyLimit, ConcurrencyLimitAdmin)
admin.site.register(RateLimit, RateLimitAdmin)
admin.site.register(StoredSchedule, StoredScheduleAdmin)

__all__ = [
    "HISTORY_SHOWN",
    "LIVE_FIELDS",
    "LIVE_MAX_IDS",
    "ConcurrencyLimitAdmin",
    "EstimatedCountPaginator",
    "JobAdmin",
    "JobChangeList",
    "JobTypeFilter",
    "QueueFilter",
    "RateLimitAdmin",
    "StoredScheduleAdmin",
    "display_datetime",
    "planner_estimate",
    "search_filter",
    "short_datetime",
    "short_duration",
]
