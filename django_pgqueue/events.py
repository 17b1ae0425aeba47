"""Emitting events: ``emit_event(name, payload)`` ends the waits of ``job.wait_for_event()``.

The emit runs in the caller's transaction on the jobs database: the event is stored and
its waiting jobs are made due only if that transaction commits, like an ``enqueue()``.
An event is kept once emitted (``PGQUEUE["EVENT_RETENTION"]``, seven days by default),
so a job that reaches its wait after the emit still receives it; emitting the name
again replaces the payload. The SQL is ``pgqueue_emit_event()`` (sql/events_v1.sql).
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from . import conf, validation

_EMIT = "SELECT pgqueue_emit_event(%s, %s::jsonb, %s)"


def emit_event(name: str, payload: Any = None, *, using: str | None = None) -> int:
    """Emit the event ``name`` with a JSON ``payload``: every job waiting for it
    (``job.wait_for_event(name)``) resumes with the payload, and a job that starts
    waiting for it later receives it at once.

    ```python
    from django.db import transaction
    from django_pgqueue import emit_event

    with transaction.atomic():
        parcel.packed = True
        parcel.save()
        emit_event(f"packed:{parcel.order_id}", {"weight": parcel.weight})
    ```

    Call it inside ``transaction.atomic`` next to the writes it reports: the event is
    delivered only if the transaction commits, and a rollback leaves no trace of it.
    In autocommit it is delivered at once.

    Args:
        name: The event's name: 1 to 200 characters, no NUL. Put the object it is about
            in the name (``"packed:42"``): every waiter of the name receives it.
        payload: Any JSON value (``None`` by default), within
            ``PGQUEUE["MAX_PAYLOAD_BYTES"]``; it replaces the payload of an earlier emit
            of the name.
        using: The jobs database alias (default: the one ``JobsRouter`` picks).

    Returns:
        How many waiting jobs it woke (delivered once the transaction commits).

    Raises:
        InvalidArgumentError: For an invalid name, or a payload that is not JSON or is
            too large; nothing is stored.
    """
    name = validation.event_name(name)
    settings = conf.get_settings()
    text = validation.json_value(payload, "payload", max_bytes=settings.MAX_PAYLOAD_BYTES)
    channel = settings.NOTIFY_CHANNEL if settings.NOTIFY else None
    with connections[conf.jobs_database(using)].cursor() as cursor:
        cursor.execute(_EMIT, [name, text, channel])
        (woken,) = cursor.fetchone()
    return int(woken)


async def aemit_event(name: str, payload: Any = None, *, using: str | None = None) -> int:
    """``emit_event()`` for async code: the same arguments, result and errors; it runs
    in Django's thread for async ORM calls, in that thread's transaction."""
    return await sync_to_async(emit_event)(name, payload, using=using)
