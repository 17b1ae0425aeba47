"""W7's job type: an ``async def`` handler awaiting simulated I/O. Registered only by
W7's harness and workers (``BENCH_ASYNC_JOBS``): with it, every worker would start its
event loop, and the other workloads would measure that too."""

from __future__ import annotations

import asyncio
from typing import Any

from bench import common
from django_pgqueue import job


@job("bench.io_wait")
async def io_wait(job: Any) -> None:
    await asyncio.sleep(common.IO_WAIT_SECONDS)
