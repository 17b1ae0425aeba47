"""A stand-in for a payment provider's client: the external service the guide's shop
calls from its jobs."""

from __future__ import annotations


class GatewayBusy(Exception):
    """The provider asks to be called again later."""


def charge_card(order_id: int, amount_cents: int) -> str:
    """Charge the order's card; the provider's charge id."""
    return f"ch_{order_id}_{amount_cents}"
