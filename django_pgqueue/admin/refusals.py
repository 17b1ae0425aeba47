"""Changes the jobs database refuses, shown as a message instead of a server error.

A dashboard may reach the jobs database as a role that may only read it (the production
how-to's ``pgqueue_reader``), or through a read-only replica. Every page of the admin
reads fine there; a change (a retry, a pause, a limit saved) is refused by PostgreSQL.
``refusing_writes()`` turns that refusal into an error message on the page the change
came from, with nothing written: the change's transaction rolled back with the error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from django.contrib import messages
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _

#: The errors of a database that may not be written: a role without the privilege, a
#: hot standby or a read-only transaction.
REFUSALS = (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction)

View = TypeVar("View", bound=Callable[..., HttpResponse])


def refusal(error: BaseException) -> BaseException | None:
    """The PostgreSQL refusal ``error`` is, or wraps (Django's ``DatabaseError`` keeps
    psycopg's as its cause); None when it is another error."""
    for candidate in (error, error.__cause__):
        if isinstance(candidate, REFUSALS):
            return candidate
    return None


def refusing_writes(view: View) -> View:
    """``view``, answering a change (a POST) that the jobs database refuses with an error
    message and a redirect to the page the change came from (else to the same URL)."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except (DatabaseError, psycopg.Error) as error:
            refused = refusal(error)
            if refused is None or request.method != "POST":  # changes come by POST
                raise
            messages.error(request, refused_message(refused))
            return HttpResponseRedirect(_back(request))

    return wrapper  # type: ignore[return-value]


def refused_message(refused: BaseException) -> str:
    """What the user is told: PostgreSQL's reason, and what it means here."""
    lines = str(refused).strip().splitlines()
    reason = lines[0] if lines else type(refused).__name__
    message: str = _(
        "The jobs database refused the change (%(reason)s): nothing was changed. This "
        "admin reaches the jobs database as a role that may only read it, or through a "
        "read-only replica; make the change where the admin may write."
    ) % {"reason": reason}
    return message


def _back(request: HttpRequest) -> str:
    referer: str = request.META.get("HTTP_REFERER", "")
    allowed = {request.get_host()}
    if referer and url_has_allowed_host_and_scheme(referer, allowed, request.is_secure()):
        return referer
    return request.get_full_path()


class RefusedWritesMixin:
    """For a ModelAdmin: its add, change and delete pages and its actions answer a
    refused change with a message (``refusing_writes()``)."""

    def changeform_view(self, *args: Any, **kwargs: Any) -> HttpResponse:
        view: Callable[..., HttpResponse] = super().changeform_view  # type: ignore[misc]
        return refusing_writes(view)(*args, **kwargs)

    def delete_view(self, *args: Any, **kwargs: Any) -> HttpResponse:
        view: Callable[..., HttpResponse] = super().delete_view  # type: ignore[misc]
        return refusing_writes(view)(*args, **kwargs)

    def changelist_view(self, *args: Any, **kwargs: Any) -> HttpResponse:
        view: Callable[..., HttpResponse] = super().changelist_view  # type: ignore[misc]
        return refusing_writes(view)(*args, **kwargs)
