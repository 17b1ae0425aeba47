"""Django settings for the django-tasks-db runs (used in that peer's own virtualenv).

The database comes from ``BENCH_DATABASE_URL``, set by the harness.
"""

from __future__ import annotations

import importlib.util
import os

from bench.common import django_database

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": django_database(os.environ.get("BENCH_DATABASE_URL", ""))}

# Django 6 has django.tasks built in; on 5.2 the django-tasks backport provides it.
_BACKPORT = importlib.util.find_spec("django.tasks") is None
INSTALLED_APPS = [*(["django_tasks"] if _BACKPORT else []), "django_tasks_db"]

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_tasks_db": {"handlers": ["console"], "level": "ERROR"},
        "django_tasks": {"handlers": ["console"], "level": "ERROR"},
        "django.tasks": {"handlers": ["console"], "level": "ERROR"},
    },
}
