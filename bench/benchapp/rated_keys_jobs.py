"""W11's job type: a no-op under a rate of 10 jobs a second for each ``data["key"]``;
see ``jobs.py``."""

from __future__ import annotations

from typing import Any

from django_pgqueue import job


@job("bench.rated_keys", rate_limit="10/s", rate_key="key")
def rated_keys(job: Any) -> None:
    """Do nothing, at most 10 starts of each ``data["key"]`` in any second."""
