"""The changelist's list filters and search, each bounded on a table of millions of jobs."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.db import connections
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext, gettext_lazy

from .. import conf, registry, rollups
from ..models import Job
from ..models.jobs import EVERY_JOB_BY_STATE

#: Newest jobs read to offer queue and job type filter choices (never the whole table).
RECENT_JOBS_FOR_FILTERS = 10_000


def recent_values(column: str) -> list[str]:
    """Distinct values of ``column`` among the newest jobs (an index scan, bounded)."""
    if column not in ("queue", "job_type"):  # interpolated below: never user input
        raise ValueError(f"not a filterable column: {column!r}")
    with connections[conf.jobs_database()].cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT {column} FROM (SELECT {column} FROM pgqueue_jobs"
            " ORDER BY created_at DESC, id DESC LIMIT %s) AS recent",
            [RECENT_JOBS_FOR_FILTERS],
        )
        return [row[0] for row in cursor.fetchall()]


def known_job_types() -> set[str]:
    """The job types a search finds by part of their name: those registered in this
    process, those of the newest jobs, and those the rollups hold (jobs finished within
    ``ROLLUP_RETENTION``). Matching them here, not with ``ILIKE`` over the table, keeps a
    search from reading every row."""
    return {
        *registry.registered_job_types(),
        *recent_values("job_type"),
        *rollups.rolled_up_names()[1],
    }


class _ValuesFilter(admin.SimpleListFilter):
    """Choices from the handler registry and the newest jobs, never a DISTINCT over the
    whole table (which a million rows would make slow on every page)."""

    column = ""

    def known_values(self) -> Iterable[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = {*self.known_values(), *recent_values(self.column)}
        chosen = self.value()
        if chosen and NUL not in chosen:
            values.add(chosen)
        return [(value, value) for value in sorted(values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        if NUL in (self.value() or ""):  # no queue or job type holds one
            return queryset.none()
        if self.value():
            # Every job, spelled so that a value few jobs have is found through the
            # partial indexes of each state instead of by reading the table.
            return queryset.filter(Q(**{self.column: self.value()}) & EVERY_JOB_BY_STATE)
        return queryset


class QueueFilter(_ValuesFilter):
    title = gettext_lazy("queue")
    parameter_name = column = "queue"

    def known_values(self) -> Iterable[str]:
        yield conf.get_settings().DEFAULT_QUEUE
        for job_type in registry.registered_job_types():
            queue = registry.get_definition(job_type).queue
            if queue:
                yield queue


class JobTypeFilter(_ValuesFilter):
    title = gettext_lazy("job type")
    parameter_name = column = "job_type"

    def known_values(self) -> Iterable[str]:
        return registry.registered_job_types()


#: The one character PostgreSQL's text and jsonb cannot hold.
NUL = "\x00"


class SearchError(Exception):
    """A search term that cannot match any job, with the reason to show staff."""


def _reject_constant(name: str) -> Any:
    raise SearchError(
        gettext("%(value)s is not a JSON value PostgreSQL can store") % {"value": name}
    )


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise SearchError(
            gettext("%(value)s is beyond the JSON numbers PostgreSQL can store") % {"value": text}
        )
    return value


def _refuse_unstorable_text(value: Any) -> None:
    """Raise ``SearchError`` if a string in ``value`` (keys too) holds what PostgreSQL
    cannot store: a NUL character, or a lone surrogate (``"\\ud800"`` in JSON)."""
    if isinstance(value, str):
        texts: Iterable[Any] = [value]
    elif isinstance(value, dict):
        texts = [*value.keys(), *value.values()]
    elif isinstance(value, list):
        texts = value
    else:
        return
    for text in texts:
        if not isinstance(text, str):
            _refuse_unstorable_text(text)
        elif NUL in text:
            raise SearchError(gettext("PostgreSQL cannot store a NUL character (\\u0000)"))
        elif not text.isascii():
            try:
                text.encode()
            except UnicodeEncodeError:
                raise SearchError(
                    gettext("PostgreSQL cannot store a lone surrogate (such as \\ud800)")
                ) from None


def _json_value(text: str) -> Any:
    """``text`` as a JSON value jsonb can hold: ``ValueError`` when it is not JSON,
    ``SearchError`` when it is JSON that jsonb refuses (NaN, Infinity, a number out of
    range, a NUL character, a lone surrogate)."""
    value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    _refuse_unstorable_text(value)
    return value


def search_filter(term: str) -> Q | None:
    """The filter a changelist search term means; None when it can match nothing.

    - a UUID: that job;
    - ``{...}``: jobs whose ``data`` contains that JSON object;
    - ``key=value``: jobs whose ``data`` has ``key`` equal to ``value``, read as JSON
      when it parses (``42``, ``true``) and also as text; ``"42"`` is only text;
    - anything else: jobs of the known job types (``known_job_types()``) whose name
      contains the term, whatever its case, and the job with that exact ``unique_key``.

    ``data`` is matched with ``@>`` (containment), which the ``jsonb_path_ops`` GIN index
    ``idx_jobs_data`` serves. A term PostgreSQL could not compare (a NUL character, or
    JSON with NaN, Infinity, a number out of range or a lone surrogate) raises
    ``SearchError``.
    """
    try:
        return Q(pk=uuid.UUID(term))
    except ValueError:
        pass
    _refuse_unstorable_text(term)
    if term.startswith("{"):
        try:
            wanted = _json_value(term)
        except ValueError:
            return None
        return Q(data__contains=wanted) if isinstance(wanted, dict) else None
    key, equals, raw = term.partition("=")
    key, raw = key.strip(), raw.strip()
    if equals and key:
        try:
            value = _json_value(raw)
        except ValueError:
            value = raw
        condition = Q(data__contains={key: value})
        if not isinstance(value, str):  # 42 may have been sent as "42"; "42" means text
            condition |= Q(data__contains={key: raw})
        return condition
    folded = term.casefold()
    matching = sorted(name for name in known_job_types() if folded in name.casefold())
    condition = Q(unique_key=term)
    return condition | Q(job_type__in=matching) if matching else condition
