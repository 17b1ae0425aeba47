"""System checks: misconfiguration is reported by ``manage.py check`` with the fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.db import connections

from .exceptions import SettingsError

MIN_POSTGRES_VERSION = 130000


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from . import conf

    try:
        alias = conf.get_settings().DATABASE
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
                hint="Point that alias at PostgreSQL 13+ (ENGINE "
                "'django.db.backends.postgresql'), or set PGQUEUE['DATABASE'] to an alias "
                "that is.",
                id="django_pgqueue.E003",
            )
        ]
    return []


@register(Tags.database)
def check_server_version(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    from . import conf

    try:
        alias = conf.get_settings().DATABASE
    except SettingsError:
        return []  # reported by check_settings
    if not databases or alias not in databases:
        return []
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    version = connection.pg_version  # type: ignore[attr-defined]
    if version < MIN_POSTGRES_VERSION:
        return [
            Error(
                f"django-pgqueue needs PostgreSQL 13 or newer; database {alias!r} runs "
                f"{version // 10000}.{version % 10000}",
                hint="Upgrade the server: claim_job_batch relies on gen_random_uuid() "
                "and plan_cache_mode.",
                id="django_pgqueue.E004",
            )
        ]
    return []
