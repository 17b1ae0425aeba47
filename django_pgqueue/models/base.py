"""The base of the app's models: rows of the jobs database, whatever the router says."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from django.db import models

from .. import conf

_M = TypeVar("_M", bound=models.Model)


class JobsDatabaseManager(models.Manager[_M]):
    """Querysets on the jobs database (``conf.jobs_database()``), not the router's choice.

    A caller's ``using()`` or ``db_manager()`` wins, and so does the database of the
    instance a related manager starts from (``job.events``), as in Django's own routing.
    """

    def get_queryset(self) -> models.QuerySet[_M]:
        queryset = super().get_queryset()
        # _db is the alias a caller chose with db_manager() (Django's docs on managers
        # and multiple databases name it); the queryset already has it.
        return queryset if self._db is not None else queryset.using(self.db)

    @property
    def db(self) -> str:
        if self._db is not None:
            return self._db
        # Related managers carry their instance as a hint, as Django's own db does.
        # (BaseManager.__init__ sets _hints; django-stubs does not declare it.)
        state = getattr(self._hints.get("instance"), "_state", None)  # type: ignore[attr-defined]
        return conf.jobs_database(getattr(state, "db", None))


class JobsDatabaseModel(models.Model):
    """A model of the jobs database: an instance is saved, deleted and reloaded where it
    was loaded from, a new one in ``conf.jobs_database()``; the router is not asked."""

    objects = JobsDatabaseManager()

    class Meta:
        abstract = True

    def save(self, *args: Any, using: str | None = None, **kwargs: Any) -> None:
        super().save(*args, using=conf.jobs_database(using or self._state.db), **kwargs)

    def delete(self, using: str | None = None, keep_parents: bool = False) -> tuple[int, Any]:
        return super().delete(
            using=conf.jobs_database(using or self._state.db), keep_parents=keep_parents
        )

    def refresh_from_db(
        self,
        using: str | None = None,
        fields: Iterable[str] | None = None,
        from_queryset: models.QuerySet[Any] | None = None,
    ) -> None:
        if from_queryset is None:
            using = conf.jobs_database(using or self._state.db)
        super().refresh_from_db(using=using, fields=fields, from_queryset=from_queryset)
