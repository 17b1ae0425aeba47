"""Settings for the test suite: a real PostgreSQL from ``DATABASE_URL``."""

import copy
import json
import os

import django
import environ

env = environ.Env()

if "DATABASE_URL" not in env:
    raise SystemExit(
        "DATABASE_URL is not set. Run the tests with `make test` (it starts a throwaway "
        "PostgreSQL), or point DATABASE_URL at a PostgreSQL 13+ server you can create "
        "databases on."
    )

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

DATABASES = {"default": env.db_url("DATABASE_URL")}
DATABASES["default"]["TEST"] = {"NAME": env.str("PGQUEUE_TEST_DB_NAME", "test_pgqueue")}
# Django's server-side binding with prepared statements (the benchmark's W1 "prepared"
# run): CI runs the suite on the system PostgreSQL with them.
if env.bool("PGQUEUE_TEST_PREPARED", default=False):
    DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5}
# A second alias on the same server, with a test database of its own, for the tests of
# PGQUEUE["DATABASE"] = "jobs" (tests/test_jobs_database.py). Tests reach it only when
# they ask for it (``django_db(databases=[...])``), so the others run as before.
DATABASES["jobs"] = copy.deepcopy(DATABASES["default"])
DATABASES["jobs"]["TEST"] = {"NAME": DATABASES["default"]["TEST"]["NAME"] + "_jobs"}
# Processes started by tests/test_roles.py reach the jobs through another role.
if "PGQUEUE_TEST_JOBS_URL" in env:
    DATABASES["jobs"] = env.db_url("PGQUEUE_TEST_JOBS_URL")
# Worker processes standing for a project whose exit is slow (atexit functions that flush
# telemetry, for one): tests/test_worker_processes.py.
if "PGQUEUE_TEST_SLOW_EXIT" in env:
    import atexit
    import time

    atexit.register(time.sleep, env.float("PGQUEUE_TEST_SLOW_EXIT"))
# Worker processes of tests/faults/test_failover.py: a primary and its standby
# ("host:port,host:port"), the one that takes writes found by libpq.
if "PGQUEUE_TEST_HOSTS" in env:
    pairs = [item.rsplit(":", 1) for item in env.list("PGQUEUE_TEST_HOSTS")]
    hosts, ports = zip(*pairs, strict=True)
    DATABASES["default"]["HOST"] = ",".join(hosts)
    DATABASES["default"]["PORT"] = ",".join(ports)
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "target_session_attrs": "read-write",
        "connect_timeout": 2,
    }
# Worker processes of tests/faults/ behind PgBouncer: a direct alias to LISTEN on.
if "PGQUEUE_TEST_DIRECT_URL" in env:
    DATABASES["direct"] = env.db_url("PGQUEUE_TEST_DIRECT_URL")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # The live server of the browser tests serves the admin's static files through it.
    "django.contrib.staticfiles",
    "django_pgqueue",
    "tests.testapp",
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")  # the Django Tasks backport (its checks, signals)

# Django Tasks run on django-pgqueue (tests/test_tasks_*.py; tasks in tests/testapp/tasks.py).
TASKS = {
    "default": {
        "BACKEND": "django_pgqueue.backends.PgQueueBackend",
        "QUEUES": ["default", "tasks-other"],
    }
}

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

PGQUEUE = {
    # Fast retries, heartbeats and recovery keep worker tests short.
    "RETRY_BACKOFF_BASE": 0.05,
    "RETRY_BACKOFF_MAX": 0.2,
    "POLL_INTERVAL": 0.5,
    "HEARTBEAT_INTERVAL": 0.5,
    "STALE_AFTER": 3,
    "RECOVER_INTERVAL": 1,
    "SHUTDOWN_GRACE": 5,
    # Worker processes started by tests may be given other values through the environment.
    **json.loads(os.environ.get("PGQUEUE_TEST_SETTINGS", "{}")),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_pgqueue": {"handlers": ["console"], "level": "INFO"}},
}
