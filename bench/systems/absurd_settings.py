"""Django settings for the django-absurd runs (used in that peer's own virtualenv).

The database comes from ``BENCH_DATABASE_URL``, set by the harness.
"""

from __future__ import annotations

import os

from bench.common import django_database

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": django_database(os.environ.get("BENCH_DATABASE_URL", ""))}
INSTALLED_APPS = ["django_absurd"]
TASKS = {"default": {"BACKEND": "django_absurd.backends.AbsurdBackend"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_absurd": {"handlers": ["console"], "level": "ERROR", "propagate": False},
        "absurd_sdk": {"handlers": ["console"], "level": "ERROR", "propagate": False},
        "django.tasks": {"handlers": ["console"], "level": "ERROR"},
    },
}
