"""The checkout of the guide's shop on django-pgqueue (docs/how-to/from-celery.md)."""

from __future__ import annotations

from django.db import transaction

from django_pgqueue import chain

from .jobs import charge, send_receipt


def place_order(order_id: int, email: str, amount_cents: int) -> None:
    """What the checkout view does once the order is saved."""
    with transaction.atomic():
        # ... the order's rows are written here ...
        # No on_commit: the jobs are rows of this transaction, committed with the order
        # or not at all.
        chain(
            charge.step({"order_id": order_id, "amount_cents": amount_cents}),
            send_receipt.step({"order_id": order_id, "email": email}),
        ).enqueue(queue="checkout", priority=5)
