"""W11's job type: a no-op under a rate of ``W11_RATE`` jobs a second for each
``data["key"]``; see ``jobs.py``."""

from __future__ import annotations

from typing import Any

from bench.common import W11_RATE
from django_pgqueue import job


@job("bench.rated_keys", rate_limit=f"{W11_RATE}/s", rate_key="key")
def rated_keys(job: Any) -> None:
    """Do nothing, at most ``W11_RATE`` starts of each ``data["key"]`` in any second."""
