"""The admin of concurrency limits: what the code declares, what staff override, and what
workers enforce.

Declared limits come from code and settings, and workers rewrite them when they start:
they are read-only here. Staff with the ``change_concurrencylimit`` permission set or
clear a limit's override, and with ``add_concurrencylimit`` limit a queue or job type
that declares none. Every change goes through ``limits.override_limit()``: one place
validates, serialises and logs it. A limit that only an override holds is removed by
deleting it; a declared one cannot be deleted (its next worker would write it back).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from .. import validation
from ..exceptions import InvalidArgumentError
from ..limits import override_limit
from ..models import ConcurrencyLimit, LimitScope
from .refusals import RefusedWritesMixin

if TYPE_CHECKING:
    LimitForm = forms.ModelForm[ConcurrencyLimit]
    # Any: the subclasses narrow it to their model (ModelAdmin is not generic at run time).
    LimitModelAdmin = admin.ModelAdmin[Any]
else:
    LimitForm = forms.ModelForm
    LimitModelAdmin = admin.ModelAdmin

_Limit = Any


class DeclaredLimitAdmin(RefusedWritesMixin, LimitModelAdmin):
    """What the admins of concurrency and rate limits share: a limit that the code or
    settings declare cannot be deleted (its next worker would write it back); deleting
    one that only an override holds clears the override, through the limits' API."""

    def is_declared(self, obj: _Limit) -> bool:
        """Whether the code or settings declare ``obj``."""
        raise NotImplementedError

    def clear_override(self, obj: _Limit) -> None:
        """Clear the override of ``obj``, which removes a limit nothing declares."""
        raise NotImplementedError

    def has_delete_permission(self, request: HttpRequest, obj: _Limit | None = None) -> bool:
        allowed = super().has_delete_permission(request, obj)
        return allowed and (obj is None or not self.is_declared(obj))

    def get_deleted_objects(
        self, objs: Sequence[_Limit] | QuerySet[_Limit], request: HttpRequest
    ) -> tuple[list[Any], dict[Any, Any], set[str], list[Any]]:
        """Declared limits are protected: the bulk delete action refuses a selection that
        has one, and says why. (Django would name a missing permission instead: the
        per-object ``has_delete_permission`` refuses declared limits.)"""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        if super().has_delete_permission(request):
            perms_needed = set()
        declared = [
            _("%(limit)s: declared by the code or settings; clear its override instead")
            % {"limit": f"{getattr(limit, 'scope', '')} {getattr(limit, 'name', '')}"}
            for limit in objs
            if self.is_declared(limit)
        ]
        return deleted, counts, perms_needed, [*protected, *declared]

    def delete_model(self, request: HttpRequest, obj: _Limit) -> None:
        self.clear_override(obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for limit in queryset:
            self.delete_model(request, limit)


def check_new_limit_name(form: forms.ModelForm[Any], cleaned: dict[str, Any]) -> None:
    """On a form adding a limit (concurrency or rate): the name must be a valid queue name
    or job type, as its scope says; the error goes to the form's ``name``."""
    instance = form.instance
    scope = cleaned.get("scope", getattr(instance, "scope", None))
    name = cleaned.get("name", getattr(instance, "name", None))
    if instance.pk is None and scope and name:
        check = validation.queue if scope == LimitScope.QUEUE else validation.job_type
        try:
            check(name, "name")
        except InvalidArgumentError as exc:
            form.add_error("name", exc.message)


class ConcurrencyLimitForm(LimitForm):
    """The override, required where nothing is declared (delete the limit instead)."""

    class Meta:
        model = ConcurrencyLimit
        fields = ("scope", "name", "override")

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        check_new_limit_name(self, cleaned)
        if cleaned.get("override") is None and self.instance.declared is None:
            self.add_error(
                "override",
                gettext_lazy(
                    "Nothing declares this limit: give it an override, or delete the limit."
                ),
            )
        return cleaned


class ConcurrencyLimitAdmin(DeclaredLimitAdmin):
    form = ConcurrencyLimitForm
    list_display = ("scope", "name", "declared", "override", "max_running", "updated_at")
    list_display_links = ("scope", "name")
    list_filter = ("scope",)
    search_fields = ("name",)
    ordering = ("scope", "name")

    def get_readonly_fields(
        self, request: HttpRequest, obj: ConcurrencyLimit | None = None
    ) -> tuple[str, ...]:
        computed = ("declared", "max_running", "updated_at")
        return ("scope", "name", *computed) if obj is not None else computed

    def is_declared(self, obj: ConcurrencyLimit) -> bool:
        return obj.declared is not None

    def save_model(
        self, request: HttpRequest, obj: ConcurrencyLimit, form: Any, change: bool
    ) -> None:
        state = override_limit(obj.scope, obj.name, obj.override, using=obj._state.db)
        assert state is not None  # the form requires an override where nothing is declared
        saved = ConcurrencyLimit.objects.get(scope=state.scope, name=state.name)
        obj.pk, obj.declared, obj.updated_at = saved.pk, saved.declared, saved.updated_at

    def clear_override(self, obj: ConcurrencyLimit) -> None:
        override_limit(obj.scope, obj.name, None, using=obj._state.db)
