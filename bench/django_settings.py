"""Django settings for the benchmark's django-pgqueue runs.

The database comes from ``BENCH_DATABASE_URL`` (a ``postgresql://`` URL), which the
harness sets to the fresh database of the run. Settings are the package's defaults,
except logging, kept to errors so that log formatting is not what is measured, and
``PGQUEUE``, which ``BENCH_PGQUEUE`` may give as JSON (bench/steady.py's retention).
"""

from __future__ import annotations

import json
import os

from bench.common import django_database

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": django_database(os.environ.get("BENCH_DATABASE_URL", ""))}

if os.environ.get("BENCH_PGQUEUE"):
    PGQUEUE = json.loads(os.environ["BENCH_PGQUEUE"])

INSTALLED_APPS = [
    "django_pgqueue",
    "bench.benchapp",
]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_pgqueue": {"handlers": ["console"], "level": "ERROR"}},
}
