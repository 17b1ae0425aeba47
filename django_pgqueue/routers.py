"""``JobsRouter``: a database router that agrees with ``PGQUEUE["DATABASE"]``.

The app never asks the router where its rows are (``conf.jobs_database`` decides), but
Django does: ``migrate`` asks ``allow_migrate`` where to create the tables, and other
apps' code may call ``router.db_for_read(Job)``. With the jobs in another database than
``default``, put this router in ``DATABASE_ROUTERS`` so that every answer is the same
(system check ``django_pgqueue.W005`` warns when the router's differs).
"""

from __future__ import annotations

from typing import Any

from django.db import models

from . import conf

__all__ = ["JobsRouter"]

APP_LABEL = "django_pgqueue"


class JobsRouter:
    """Reads, writes and migrations of django-pgqueue's models go to the jobs database;
    other models are left to the next router (``None``).

    A
    [database router](https://docs.djangoproject.com/en/stable/topics/db/multi-db/#automatic-database-routing)
    for ``DATABASE_ROUTERS`` when ``PGQUEUE["DATABASE"]`` is not ``"default"``. For the
    models of the ``django_pgqueue`` app, ``db_for_read()`` and ``db_for_write()`` return
    ``PGQUEUE["DATABASE"]``, ``allow_relation()`` allows relations between them and
    ``allow_migrate()`` allows their migrations only on that database; for every other
    model each returns ``None`` (the next router decides). See
    [Keep the jobs in their own database](../how-to/jobs-database.md) and system check
    [W005](system-checks.md#w005).
    """

    def db_for_read(self, model: type[models.Model], **hints: Any) -> str | None:
        return conf.jobs_database() if model._meta.app_label == APP_LABEL else None

    def db_for_write(self, model: type[models.Model], **hints: Any) -> str | None:
        return conf.jobs_database() if model._meta.app_label == APP_LABEL else None

    def allow_relation(self, obj1: models.Model, obj2: models.Model, **hints: Any) -> bool | None:
        # The app's models relate only to each other, all in one database.
        if obj1._meta.app_label == APP_LABEL and obj2._meta.app_label == APP_LABEL:
            return True
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        # The tables (and the SQL functions of the RunSQL migrations) only where the
        # jobs are; other apps' migrations are the next router's business.
        return db == conf.jobs_database() if app_label == APP_LABEL else None
