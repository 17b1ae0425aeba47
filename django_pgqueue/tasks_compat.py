"""The Django Tasks API of the running Django, under one set of names.

Django 6.0+ ships it as ``django.tasks``; on Django 5.2 the ``django-tasks`` backport
(``pip install "django-pgqueue[tasks]"``) provides it as ``django_tasks``. The two spell a
few names differently (``InvalidTask`` / ``InvalidTaskError`` up to 0.12; its later
code uses Django's names): everything here has the ``django.tasks`` name, whichever
spelling the installed backport has. Importing this module without either raises ``ImportError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import django

# mypy runs on Django 5.2 (make typecheck), whose stubs have no django.tasks: it skips this
# branch and checks the backport's. At run time TYPE_CHECKING is False.
if not TYPE_CHECKING and django.VERSION >= (6, 0):
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TaskError,
    )
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
else:
    try:
        from django_tasks import (
            DEFAULT_TASK_QUEUE_NAME,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            default_task_backend,
            task,
            task_backends,
        )
    except ImportError as exc:
        raise ImportError(
            "django-pgqueue's Django Tasks backend needs Django 6.0+ or, on Django "
            f"{django.get_version()}, the django-tasks backport: "
            'pip install "django-pgqueue[tasks]"'
        ) from exc
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskError,
    )
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch

    try:  # the backport after 0.12 took Django's names
        # The pinned backport (0.12) has only the old names, which mypy checks below.
        from django_tasks.exceptions import (  # type: ignore[attr-defined]
            InvalidTask,
            InvalidTaskBackend,
        )
    except ImportError:  # 0.12 and earlier
        from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    FRAMEWORK = "django_tasks"

__all__ = [
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "default_task_backend",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
