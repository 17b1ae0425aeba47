"""The admin of rate limits: what the code declares, what staff override, what workers
enforce, and how full each window is now.

As with concurrency limits (``admin.limits``): declared rates are read-only; staff with
``change_ratelimit`` set or clear an override (written as ``"100/m"``), with
``add_ratelimit`` rate-limit a queue or job type that declares nothing, and delete only
what no code declares. Every change goes through ``rate_limits.override_rate_limit()``.
The window's state comes from the same SQL as ``rate_limit_states()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.db.models import FloatField, IntegerField, QuerySet
from django.db.models.expressions import RawSQL
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..exceptions import InvalidArgumentError
from ..models import RateLimit
from ..rate_limits import override_rate_limit, room_in_sql, started_in_window_sql
from ..rates import Rate, parse_rate
from .limits import DeclaredLimitAdmin, check_new_limit_name

if TYPE_CHECKING:
    RateLimitForm = forms.ModelForm[RateLimit]
else:
    RateLimitForm = forms.ModelForm

_TABLE = RateLimit._meta.db_table


def _rate(jobs: int | None, seconds: int | None) -> str:
    rate = Rate.from_columns(jobs, seconds)
    return "-" if rate is None else str(rate)


class RateLimitAdminForm(RateLimitForm):
    """The override as a rate (``"100/m"``); required where nothing is declared."""

    override = forms.CharField(
        required=False,
        label=gettext_lazy("Override"),
        help_text=gettext_lazy(
            'Wins over the declared rate, e.g. "100/m", "10/s", "5000/h" or "30/10s"; '
            "empty: the declared rate applies."
        ),
    )

    class Meta:
        model = RateLimit
        fields = ("scope", "name")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        instance = self.instance
        if instance.override_jobs is not None:
            self.initial["override"] = _rate(instance.override_jobs, instance.override_seconds)

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        check_new_limit_name(self, cleaned)
        instance = self.instance
        text = (cleaned.get("override") or "").strip()
        rate = None
        if text:
            try:
                rate = parse_rate(text, "override")
            except InvalidArgumentError as exc:
                self.add_error("override", exc.message)
        elif instance.declared_jobs is None:
            self.add_error(
                "override",
                gettext_lazy(
                    "Nothing declares this rate limit: give it an override, or delete it."
                ),
            )
        cleaned["override"] = rate
        return cleaned


class RateLimitAdmin(DeclaredLimitAdmin):
    form = RateLimitAdminForm
    list_display = (
        "scope",
        "name",
        "declared",
        "override",
        "enforced",
        "window",
        "room_in",
        "updated_at",
    )
    list_display_links = ("scope", "name")
    list_filter = ("scope",)
    search_fields = ("name",)
    ordering = ("scope", "name")

    def get_queryset(self, request: HttpRequest) -> QuerySet[RateLimit]:
        limits: QuerySet[RateLimit] = super().get_queryset(request)
        return limits.annotate(
            started_in_window=RawSQL(
                started_in_window_sql(_TABLE), [], output_field=IntegerField()
            ),
            seconds_to_room=RawSQL(room_in_sql(_TABLE), [], output_field=FloatField()),
        )

    def get_readonly_fields(
        self, request: HttpRequest, obj: RateLimit | None = None
    ) -> tuple[str, ...]:
        computed = ("declared", "enforced", "window", "room_in", "updated_at")
        return ("scope", "name", *computed) if obj is not None else computed

    def get_fields(self, request: HttpRequest, obj: RateLimit | None = None) -> list[Any]:
        editable = ["override"] if obj is not None else ["scope", "name", "override"]
        computed = ["declared", "enforced", "window", "room_in", "updated_at"]
        return [*editable, *(computed if obj is not None else [])]

    @admin.display(description=gettext_lazy("declared"))
    def declared(self, obj: RateLimit) -> str:
        return _rate(obj.declared_jobs, obj.declared_seconds)

    @admin.display(description=gettext_lazy("override"))
    def override(self, obj: RateLimit) -> str:
        return _rate(obj.override_jobs, obj.override_seconds)

    @admin.display(description=gettext_lazy("enforced"))
    def enforced(self, obj: RateLimit) -> str:
        return _rate(obj.max_jobs, obj.period_seconds)

    @admin.display(description=gettext_lazy("started in the window"))
    def window(self, obj: RateLimit) -> str:
        started = getattr(obj, "started_in_window", None)
        if started is None:
            return "-"
        return _("%(started)d of %(jobs)d") % {"started": started, "jobs": obj.max_jobs}

    @admin.display(description=gettext_lazy("room"))
    def room_in(self, obj: RateLimit) -> str:
        seconds = getattr(obj, "seconds_to_room", None)
        if seconds is None:
            return _("now")
        return _("in %(seconds).1f s") % {"seconds": seconds}

    def is_declared(self, obj: RateLimit) -> bool:
        return obj.declared_jobs is not None

    def save_model(self, request: HttpRequest, obj: RateLimit, form: Any, change: bool) -> None:
        state = override_rate_limit(
            obj.scope, obj.name, form.cleaned_data["override"], using=obj._state.db
        )
        assert state is not None  # the form requires an override where nothing is declared
        saved = RateLimit.objects.get(scope=state.scope, name=state.name)
        obj.pk, obj.updated_at = saved.pk, saved.updated_at

    def clear_override(self, obj: RateLimit) -> None:
        override_rate_limit(obj.scope, obj.name, None, using=obj._state.db)
