"""W12's job type: a no-op handler declared ``isolation="process"``. Registered only by
W12's harness and workers (``BENCH_PROCESS_JOBS``): with it, every worker would start
child processes, and the other workloads would measure that too."""

from __future__ import annotations

from typing import Any

from django_pgqueue import job


@job("bench.noop_isolated", isolation="process")
def noop_isolated(job: Any) -> None:
    """Do nothing, in a child process of the worker."""
