"""Schedules stored in the database: periodic jobs added, changed and deleted at run
time, in the admin or with ``save_schedule()`` and ``delete_schedule()``.

Workers read them with the schedules of code and settings (``periodic.schedules()``) on
every pass over the schedules, and tick them the same way: each tick exactly once,
whichever worker gets there first. A stored schedule is validated here as a
``PGQUEUE["SCHEDULE"]`` entry is at start-up (``cron.build_schedule()``), and its name
may not be one that the code or settings declare.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from . import conf, jobrows, periodic
from .cron import NAME_MAX_LENGTH, build_schedule
from .exceptions import InvalidArgumentError
from .models import PeriodicTick, StoredSchedule

logger = logging.getLogger("django_pgqueue.periodic")

__all__ = ["check_schedule", "delete_schedule", "save_schedule"]


def check_schedule(name: Any, fields: dict[str, Any]) -> None:
    """Raise ``InvalidArgumentError``, whose ``field`` names a key of ``fields`` or
    ``"name"``, when ``save_schedule(name, **fields)`` would refuse them.

    What the admin's form runs before saving: the fields are those of a
    ``PGQUEUE["SCHEDULE"]`` entry (``job_type`` and ``schedule`` required), and the job
    type must have a handler in this process unless ``PGQUEUE["VALIDATE_JOB_TYPES"]`` is
    off.
    """
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX_LENGTH:
        raise InvalidArgumentError(
            "name", f"must be a string of 1 to {NAME_MAX_LENGTH} characters, got {name!r}"
        )
    if name in {schedule.name for schedule in periodic.declared_schedules()}:
        raise InvalidArgumentError(
            "name", f"the code or settings declare a schedule named {name!r}; choose another"
        )
    schedule = build_schedule(name, fields, max_payload_bytes=conf.get_settings().MAX_PAYLOAD_BYTES)
    jobrows.handler_of(schedule.job_type)


def save_schedule(
    name: str,
    job_type: str,
    schedule: str,
    *,
    timezone: str | None = None,
    data: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    unique_key: str | None = None,
    using: str | None = None,
) -> StoredSchedule:
    """Add the stored schedule ``name``, or change it; workers pick it up on their next
    pass over the schedules (within a heartbeat interval).

    A new schedule, like one declared in a deploy, records its first tick without
    enqueuing it; a changed expression or time zone starts afresh the same way. The
    other fields apply from the next tick. Logged at ``INFO``.

    ```python
    from django_pgqueue.stored_schedules import save_schedule

    save_schedule("nightly-export", "reports.export", "0 3 * * *", data={"format": "csv"})
    ```

    Args:
        name: The schedule's name, 1 to 255 characters, not one that the code or
            settings declare.
        job_type: The job type each tick enqueues (with a handler in this process,
            unless ``PGQUEUE["VALIDATE_JOB_TYPES"]`` is off).
        schedule: A cron expression, as for ``@job(schedule=...)``.
        timezone: An IANA time zone name; ``None``: ``TIME_ZONE``.
        data: The job's payload.
        queue: The job's queue; ``None``: the job type's.
        priority: The job's priority; ``None``: the job type's.
        max_attempts: The job's attempts; ``None``: the job type's.
        unique_key: A key the job holds while active: a tick is skipped while it does.
        using: Database alias. Default: ``PGQUEUE["DATABASE"]``.

    Returns:
        The stored row.

    Raises:
        InvalidArgumentError: Naming the field that is wrong; nothing is written.
    """
    fields = {
        "job_type": job_type,
        "schedule": schedule,
        "timezone": timezone,
        "data": data,
        "queue": queue,
        "priority": priority,
        "max_attempts": max_attempts,
        "unique_key": unique_key,
    }
    check_schedule(name, fields)
    valid = build_schedule(name, fields, max_payload_bytes=conf.get_settings().MAX_PAYLOAD_BYTES)
    alias = conf.jobs_database(using)
    values = {
        "job_type": valid.job_type,
        "schedule": valid.cron,
        "timezone": valid.timezone or "",
        "data": valid.data or {},
        "queue": valid.queue or "",
        "priority": valid.priority,
        "max_attempts": valid.max_attempts,
        "unique_key": valid.unique_key or "",
    }
    with transaction.atomic(using=alias):
        row, created = (
            StoredSchedule.objects.using(alias)
            .select_for_update()
            .get_or_create(name=name, defaults=values)
        )
        if created:
            # Ticks recorded under this name before (a schedule deleted since) would make
            # the new one enqueue its latest tick at once: it starts afresh instead.
            PeriodicTick.objects.using(alias).filter(name=name).delete()
        else:
            for field, value in values.items():
                setattr(row, field, value)
            row.updated_at = Now()
            row.save(using=alias)
        row.refresh_from_db(using=alias)
    logger.info(
        "stored schedule %s %s: %s (%s)",
        name,
        "added" if created else "changed",
        valid.job_type,
        valid.signature,
    )
    return row


def delete_schedule(name: str, *, using: str | None = None) -> bool:
    """Delete the stored schedule ``name`` and its recorded ticks; jobs its ticks made
    are kept. Logged at ``INFO``.

    Returns:
        Whether there was one to delete.
    """
    alias = conf.jobs_database(using)
    with transaction.atomic(using=alias):
        deleted, _ = StoredSchedule.objects.using(alias).filter(name=name).delete()
        if deleted:
            PeriodicTick.objects.using(alias).filter(name=name).delete()
    if deleted:
        logger.info("stored schedule %s deleted", name)
    return bool(deleted)
