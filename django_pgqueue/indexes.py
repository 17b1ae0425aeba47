"""Index classes that need no ``django.contrib.postgres`` in ``INSTALLED_APPS``."""

from __future__ import annotations

from typing import Any

from django.db import models


class GinIndex(models.Index):
    """A GIN index (``CREATE INDEX ... USING gin``).

    ``django.contrib.postgres.indexes.GinIndex`` requires ``django.contrib.postgres`` in
    ``INSTALLED_APPS`` from Django 6 on; installing django-pgqueue should need only
    ``django_pgqueue`` there.
    """

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        return super().create_sql(model, schema_editor, using=" USING gin", **kwargs)
