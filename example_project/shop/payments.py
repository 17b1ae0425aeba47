"""A stand-in for a payment provider's API, so the example runs offline.

``charge`` counts each charge on the order (``Order.charges``), committed at once as a
real provider's charge would be, whatever the caller's transaction does: the demo
shows that a retried checkout charges once.
"""

from __future__ import annotations

import logging

from django.db.models import F

from .models import Order

logger = logging.getLogger("shop.payments")


def charge(order_id: int, amount_cents: int) -> dict[str, object]:
    """Charge an order's card and return the charge."""
    Order.objects.filter(pk=order_id).update(charges=F("charges") + 1)
    logger.info("charged order %s: %d cents", order_id, amount_cents)
    return {"id": f"ch_{order_id:06d}", "amount_cents": amount_cents}
