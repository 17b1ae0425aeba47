"""The admin of schedules stored in the database: staff with the model's permissions
add, change and delete periodic jobs, as with django-celery-beat.

Every write goes through ``stored_schedules``: the form runs ``check_schedule()`` (the
checks of a ``PGQUEUE["SCHEDULE"]`` entry, and a name the code and settings leave free),
saving runs ``save_schedule()`` and deleting ``delete_schedule()``, which also drop the
schedule's recorded ticks. Django's admin log records each change. The periodic jobs
page (``admin.periodic``) lists these schedules with the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext as _

from .. import registry
from ..exceptions import InvalidArgumentError
from ..models import StoredSchedule
from ..stored_schedules import check_schedule, delete_schedule, save_schedule
from .refusals import RefusedWritesMixin

if TYPE_CHECKING:
    ScheduleForm = forms.ModelForm[StoredSchedule]
    ScheduleModelAdmin = admin.ModelAdmin[StoredSchedule]
else:
    ScheduleForm = forms.ModelForm
    ScheduleModelAdmin = admin.ModelAdmin

#: The fields the form edits, in ``save_schedule()``'s order.
FIELDS = (
    "name",
    "job_type",
    "schedule",
    "timezone",
    "data",
    "queue",
    "priority",
    "max_attempts",
    "unique_key",
)


class StoredScheduleForm(ScheduleForm):
    """A stored schedule, checked as ``save_schedule()`` checks it; each error goes to
    its field. The job type is picked from those registered in this process."""

    class Meta:
        model = StoredSchedule
        fields = FIELDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "job_type" in self.fields:
            known = registry.registered_job_types()
            current = self.instance.job_type
            choices = sorted({*known, current} - {""})
            self.fields["job_type"] = forms.ChoiceField(
                label=_("Job type"),
                choices=[("", "---------"), *((name, name) for name in choices)],
            )

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if self.errors:
            return cleaned
        name = cleaned.get("name", self.instance.name)
        fields = schedule_fields(cleaned)
        try:
            check_schedule(name, fields)
        except InvalidArgumentError as exc:
            field = exc.field if exc.field in self.fields else None
            self.add_error(field, exc.message)
        return cleaned


def schedule_fields(cleaned: dict[str, Any]) -> dict[str, Any]:
    """A form's cleaned data as ``save_schedule()``'s keywords: blanks are defaults."""
    return {
        "job_type": cleaned.get("job_type"),
        "schedule": cleaned.get("schedule"),
        "timezone": cleaned.get("timezone") or None,
        "data": cleaned.get("data") or None,
        "queue": cleaned.get("queue") or None,
        "priority": cleaned.get("priority"),
        "max_attempts": cleaned.get("max_attempts"),
        "unique_key": cleaned.get("unique_key") or None,
    }


class StoredScheduleAdmin(RefusedWritesMixin, ScheduleModelAdmin):
    form = StoredScheduleForm
    list_display = ("name", "job_type", "schedule_and_zone", "queue", "updated_at")
    search_fields = ("name", "job_type")
    ordering = ("name",)

    def get_readonly_fields(
        self, request: HttpRequest, obj: StoredSchedule | None = None
    ) -> tuple[str, ...]:
        """The name is fixed once added: it keys the schedule's recorded ticks."""
        return ("name", "created_at", "updated_at") if obj is not None else ()

    @admin.display(description=_("Schedule"), ordering="schedule")
    def schedule_and_zone(self, obj: StoredSchedule) -> str:
        return format_html(
            "<code>{}</code> ({})", obj.schedule, obj.timezone or _("site time zone")
        )

    def save_model(
        self, request: HttpRequest, obj: StoredSchedule, form: Any, change: bool
    ) -> None:
        saved = save_schedule(obj.name, **schedule_fields(form.cleaned_data), using=obj._state.db)
        obj.pk, obj.created_at, obj.updated_at = saved.pk, saved.created_at, saved.updated_at

    def delete_model(self, request: HttpRequest, obj: StoredSchedule) -> None:
        delete_schedule(obj.name, using=obj._state.db)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for schedule in queryset:
            self.delete_model(request, schedule)
