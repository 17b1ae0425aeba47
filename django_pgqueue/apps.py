from __future__ import annotations

import importlib.util
from functools import cache
from typing import TYPE_CHECKING

import django
from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

if TYPE_CHECKING:
    from .registry import JobDefinition


class PgQueueConfig(AppConfig):
    name = "django_pgqueue"
    label = "django_pgqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import request_finished

        from . import checks  # noqa: F401  (registers the system checks)
        from .sideconn import close_side_connections

        request_finished.connect(close_side_connections, dispatch_uid="pgqueue_side_connections")

        from .registry import register_resolver
        from .schema import TASK_JOB_PREFIX

        # Django Tasks run as jobs of type "task:<dotted path>", resolved on demand.
        register_resolver(TASK_JOB_PREFIX, _resolve_task_job)

        # Like admin.autodiscover(): import every installed app's jobs module so its
        # @job handlers are registered before the first enqueue or claim.
        autodiscover_modules("jobs")


@cache
def _tasks_framework_installed() -> bool:
    return django.VERSION >= (6, 0) or importlib.util.find_spec("django_tasks") is not None


def _resolve_task_job(job_type: str) -> JobDefinition | None:
    # The backend module is imported on first use: the Tasks framework is optional.
    if not _tasks_framework_installed():
        return None
    from .backends import resolve_task_job

    return resolve_task_job(job_type)
