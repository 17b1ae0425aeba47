"""System checks: misconfiguration is reported by ``manage.py check`` with the fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import connections, router

from .exceptions import SettingsError

MIN_POSTGRES_VERSION = 140000


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from . import conf

    try:
        alias = conf.jobs_database()
    except SettingsError as exc:
        return [Error(str(exc), id="django_pgqueue.E001")]
    if alias not in settings.DATABASES:
        return [
            Error(
                f"PGQUEUE['DATABASE'] is {alias!r}, which is not in DATABASES",
                hint=f"Use one of {sorted(settings.DATABASES)}.",
                id="django_pgqueue.E002",
            )
        ]
    vendor = connections[alias].vendor
    if vendor != "postgresql":
        return [
            Error(
                f"django-pgqueue needs PostgreSQL, but database {alias!r} uses {vendor!r}",
                hint="Point that alias at PostgreSQL 14+ (ENGINE "
                "'django.db.backends.postgresql'), or set PGQUEUE['DATABASE'] to an alias "
                "that is.",
                id="django_pgqueue.E003",
            )
        ]
    return []


@register(Tags.compatibility)
def check_routing(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """With the jobs outside ``default``, the database router agrees on where they are.

    The app itself never asks the router, but ``migrate`` does (where to create the
    tables), and so may other code. Only checked off ``default``: there a router that
    sends reads elsewhere (a replica) is harmless and common.
    """
    from . import conf

    try:
        alias = conf.jobs_database()
    except SettingsError:
        return []  # reported by check_settings
    if alias == "default" or alias not in settings.DATABASES:
        return []
    if connections[alias].vendor != "postgresql":
        return []  # reported by check_settings
    misrouted = [
        f"{way} of {model._meta.label} to {db!r}"
        # Job first: the model a reader knows, whatever order the models load in.
        for model in sorted(
            apps.get_app_config("django_pgqueue").get_models(),
            key=lambda model: model._meta.model_name != "job",
        )
        for way, db in (
            ("reads", router.db_for_read(model)),
            ("writes", router.db_for_write(model)),
        )
        if db != alias
    ]
    if not misrouted:
        return []
    more = f" (and {len(misrouted) - 1} more)" if len(misrouted) > 1 else ""
    return [
        Warning(
            f"PGQUEUE['DATABASE'] is {alias!r}, but the database router sends {misrouted[0]}{more}",
            hint="Add 'django_pgqueue.routers.JobsRouter' to DATABASE_ROUTERS (before any "
            "router that routes every model), or make your router send the models of "
            f"django_pgqueue to {alias!r}: migrate creates their tables where the router "
            "allows.",
            id="django_pgqueue.W005",
        )
    ]


@register(Tags.database)
def check_server_version(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    from . import conf

    try:
        alias = conf.jobs_database()
    except SettingsError:
        return []  # reported by check_settings
    if not databases or alias not in databases:
        return []
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    # pg_version is on the PostgreSQL backend's wrapper (vendor checked above), which
    # connections[] types as the base class.
    version = connection.pg_version  # type: ignore[attr-defined]
    if version < MIN_POSTGRES_VERSION:
        return [
            Error(
                f"django-pgqueue needs PostgreSQL 14 or newer; database {alias!r} runs "
                f"{version // 10000}.{version % 10000}",
                hint="Upgrade the server: claim_job_batch relies on gen_random_uuid() "
                "and plan_cache_mode.",
                id="django_pgqueue.E004",
            )
        ]
    return []


@register(Tags.compatibility)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Periodic jobs: every ``SCHEDULE`` entry names a job type with a handler, and no
    entry shares its name with an ``@job(schedule=...)``."""
    from . import conf, registry

    try:
        settings_ = conf.get_settings()
    except SettingsError:
        return []  # reported by check_settings
    errors: list[CheckMessage] = []
    for name, schedule in settings_.SCHEDULE.items():
        decorated = registry.find_definition(name)
        if decorated is not None and decorated.schedule is not None:
            errors.append(
                Error(
                    f"PGQUEUE['SCHEDULE'][{name!r}] has the name of the schedule that "
                    f"@job({name!r}, schedule=...) declares",
                    hint="Rename the SCHEDULE entry: schedule names must be unique.",
                    id="django_pgqueue.E202",
                )
            )
        if settings_.VALIDATE_JOB_TYPES and registry.find_definition(schedule.job_type) is None:
            errors.append(
                Error(
                    f"PGQUEUE['SCHEDULE'][{name!r}] enqueues job type "
                    f"{schedule.job_type!r}, which has no handler",
                    hint="Define it with @django_pgqueue.job in an installed app's jobs.py, "
                    "or correct the entry's job_type.",
                    id="django_pgqueue.E201",
                )
            )
    return errors


@register(Tags.compatibility)
def check_job_type_limits(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every ``JOB_TYPE_LIMITS`` and ``JOB_TYPE_RATE_LIMITS`` entry names a job type with
    a handler (a typo limits nothing)."""
    from . import conf, registry

    try:
        settings_ = conf.get_settings()
    except SettingsError:
        return []  # reported by check_settings
    if not settings_.VALIDATE_JOB_TYPES:
        return []
    return [
        Warning(
            f"PGQUEUE[{key!r}] limits job type {job_type!r}, which has no handler",
            hint="Correct the name, or make sure the module that registers the handler is "
            "imported (an installed app's jobs.py). A limit on a job type no worker runs "
            "limits nothing.",
            id="django_pgqueue.W301",
        )
        for key in ("JOB_TYPE_LIMITS", "JOB_TYPE_RATE_LIMITS")
        for job_type in getattr(settings_, key)
        if registry.find_definition(job_type) is None
    ]


@register(Tags.compatibility)
def check_unique_windows(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """No ``@job(unique_for=...)`` outlives the retention of finished jobs: a pruned job
    no longer holds its key, so the window would end early."""
    from . import conf, registry

    try:
        settings_ = conf.get_settings()
    except SettingsError:
        return []  # reported by check_settings
    warnings: list[CheckMessage] = []
    for job_type in registry.registered_job_types():
        definition = registry.find_definition(job_type)
        window = None if definition is None else definition.unique_for
        if window is None:
            continue
        for name in ("RETENTION", "FAILED_RETENTION"):
            retention = getattr(settings_, name)
            if retention is not None and retention < window:
                warnings.append(
                    Warning(
                        f"job type {job_type!r} has unique_for={window:g}s, longer than "
                        f"PGQUEUE[{name!r}] ({retention:g}s): its finished jobs are "
                        "pruned before their window ends, and free their key early",
                        hint=f"Make PGQUEUE[{name!r}] at least as long as the window, or "
                        "shorten unique_for.",
                        id="django_pgqueue.W302",
                    )
                )
    return warnings


@register(Tags.compatibility)
def check_handlers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every registered handler is one a worker can run (not a generator, and
    taking the job), also when it was swapped after ``@job`` checked it."""
    from . import registry

    errors: list[CheckMessage] = []
    for job_type in registry.registered_job_types():
        definition = registry.find_definition(job_type)
        problem = None if definition is None else registry.why_it_cannot_run(definition.func)
        if problem is not None:
            errors.append(
                Error(
                    f"the handler of job type {job_type!r} {problem.partition('. ')[0]}",
                    hint=problem.partition(". ")[2] or None,
                    id="django_pgqueue.E401",
                )
            )
    return errors
