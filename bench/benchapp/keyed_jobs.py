"""W9's job type: at most one job of each key at once; see ``jobs.py``."""

from __future__ import annotations

from typing import Any

from django_pgqueue import job


@job("bench.keyed", concurrency=1, concurrency_key="key")
def keyed(job: Any) -> None:
    """Do nothing, under a limit of one job at a time per ``data["key"]``."""
