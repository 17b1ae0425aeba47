"""A stand-in for a CRM's HTTP API, so the example runs offline.

``push_contact`` succeeds unless the caller asks it to simulate an outage: the demo
uses that to show retries with backoff, and a job that exhausts its attempts.
"""

from __future__ import annotations

import logging
import zlib

logger = logging.getLogger("shop.crm")


class CrmUnavailable(Exception):
    """The CRM answered 503: worth retrying later."""


def push_contact(email: str, name: str, *, attempt: int, simulated_outage: int = 0) -> str:
    """Create or update a contact and return its CRM id.

    ``simulated_outage`` makes the first that many attempts fail with a 503.
    """
    if attempt <= simulated_outage:
        raise CrmUnavailable(
            f"CRM answered 503 Service Unavailable (simulated outage, attempt {attempt} "
            f"of {simulated_outage} down)"
        )
    logger.info("CRM contact upserted: %s", email)
    return f"crm-{zlib.crc32(email.encode()):08x}"


def record_sale(email: str, total_cents: int, *, attempt: int, simulated_outage: int = 0) -> str:
    """Record a sale on the customer's contact and return its CRM id; fails as
    ``push_contact`` does for the first ``simulated_outage`` attempts."""
    if attempt <= simulated_outage:
        raise CrmUnavailable(
            f"CRM answered 503 Service Unavailable (simulated outage, attempt {attempt} "
            f"of {simulated_outage} down)"
        )
    logger.info("CRM sale recorded: %s, %d cents", email, total_cents)
    return f"sale-{zlib.crc32(f'{email}:{total_cents}'.encode()):08x}"
