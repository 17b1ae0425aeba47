"""Read the SQL files that migrations install (``django_pgqueue/sql/*.sql``)."""

from __future__ import annotations

from importlib import resources


def read_sql(name: str) -> str:
    """Return the text of ``django_pgqueue/sql/<name>``."""
    return resources.files("django_pgqueue").joinpath("sql", name).read_text(encoding="utf-8")
