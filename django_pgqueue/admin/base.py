"""What every part of the Job admin relies on: its permissions and how it reports changes.

Jobs are read-only here: nobody adds, edits or deletes them by hand. Changing a job's
state goes through the ``JobQuerySet`` transitions, as actions gated by the
``django_pgqueue.retry_job`` permission on top of staff status.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.paginator import Paginator
from django.db.models import Model
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext as _

from ..models import RETRY_PERMISSION, Job
from .formatting import TEMPLATES
from .refusals import RefusedWritesMixin

logger = logging.getLogger("django_pgqueue.admin")


# ModelAdmin and Paginator are generic in django-stubs only: subscripted for mypy alone.
if TYPE_CHECKING:
    JobModelAdmin = admin.ModelAdmin[Job]
    JobPaginator = Paginator[Job]
else:
    JobModelAdmin = admin.ModelAdmin
    JobPaginator = Paginator


class JobAdminBase(RefusedWritesMixin, JobModelAdmin):
    """The permissions of the Job admin, shared by its changelist, actions and overview."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs come from enqueue(), which validates them and wakes workers

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # state changes go through the actions, never through a form

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # a deleted running job would vanish under its worker; cancel it

    def has_retry_permission(self, request: HttpRequest) -> bool:
        """May retry, cancel and run jobs now (``django_pgqueue.retry_job``)."""
        return request.user.has_perm(f"{self.opts.app_label}.{RETRY_PERMISSION}")

    def _not_found(self, request: HttpRequest, message: str) -> TemplateResponse:
        """The admin's page for a job, queue or action that does not exist (404)."""
        site = self.admin_site.name
        context = {
            **self.admin_site.each_context(request),
            "title": _("Not found"),
            "opts": self.opts,
            "message": message,
            "changelist_url": reverse(f"{site}:django_pgqueue_job_changelist"),
            "overview_url": reverse(f"{site}:django_pgqueue_job_overview"),
        }
        return TemplateResponse(request, f"{TEMPLATES}/not_found.html", context, status=404)

    def _report(self, request: HttpRequest, message: str, changed: int) -> None:
        """Log a change made by the user and tell them (a warning when nothing changed)."""
        logger.info("admin user %s: %s", request.user.get_username(), message)
        self.message_user(request, message, messages.SUCCESS if changed else messages.WARNING)

    def _audit(self, request: HttpRequest, objects: Sequence[Model], message: str) -> None:
        """Record in Django's admin log that the user did ``message`` to each of
        ``objects`` (jobs, a queue): it shows in each one's History, and in the admin
        index's recent actions."""
        user_id = request.user.pk
        if objects and user_id is not None:  # always a user: the admin is staff-only
            LogEntry.objects.log_actions(
                user_id=user_id,
                queryset=objects,
                action_flag=CHANGE,
                change_message=message,
            )
