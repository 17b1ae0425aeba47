"""W10's job type: a no-op under a rate limit of ``BENCH_RATED_JOBS`` jobs a second; see
``jobs.py``."""

from __future__ import annotations

import os
from typing import Any

from django_pgqueue import job


@job("bench.rated", rate_limit=f"{int(os.environ['BENCH_RATED_JOBS'])}/s")
def rated(job: Any) -> None:
    """Do nothing, at most ``BENCH_RATED_JOBS`` starts in any second, cluster-wide."""
