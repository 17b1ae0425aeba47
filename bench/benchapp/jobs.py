"""The benchmark's job types; discovered by django_pgqueue's autodiscovery of ``jobs``."""

from __future__ import annotations

import os
from typing import Any

from bench import common
from django_pgqueue import Backoff, job
from django_pgqueue.options import JOB_KEYS

# The peers retry at once too: W6 measures the queue, not a backoff policy. Floats, as an
# int delay among float ones fails the worker's batched FINISH (psycopg: mixed list types).
NO_BACKOFF = Backoff(base=0.0, max=0.0, jitter=False)


@job("bench.noop")
def noop(job: Any) -> None:
    """Do nothing; when asked to, report the start time to the latency probe."""
    if "probe" in job.data:
        common.probe(job.data["i"])


#: W13 with ``BENCH_W13_BATCHED=1``: the completion goes with the worker's batch
#: (``effectively_once=False``), where the package has the option (not a baseline's).
_W13_OPTIONS = (
    {"effectively_once": False}
    if os.environ.get("BENCH_W13_BATCHED") and "effectively_once" in JOB_KEYS
    else {}
)


@job("bench.writes_row", **_W13_OPTIONS)
def writes_row(job: Any) -> None:
    """Insert one row in the handler's transaction (``atomic=True``, the default): the
    work a job of a Django app does, committed with the job's completion (W13)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {common.W13_TABLE} (job_id) VALUES (%s)", [job.id])


@job("bench.cpu_flaky", max_attempts=3, retry_backoff=NO_BACKOFF)
def cpu_flaky(job: Any) -> None:
    """Burn 1 ms of CPU; every tenth job (by ``data["i"]``) fails its first attempt."""
    common.burn_cpu()
    if job.attempts == 1 and common.fails_first_attempt(job.data["i"]):
        raise common.FlakyJobError(job.data["i"])


# W9's job type declares a per-key limit, which would put every other workload's claims
# on the limited path: only W9's harness and workers register it.
if os.environ.get("BENCH_KEYED_JOBS"):
    from . import keyed_jobs  # noqa: F401
# The same for W10's rate-limited job type (the variable holds its rate, jobs a second).
if os.environ.get("BENCH_RATED_JOBS"):
    from . import rated_jobs  # noqa: F401
if os.environ.get("BENCH_RATED_KEYS"):
    from . import rated_keys_jobs  # noqa: F401
if os.environ.get("BENCH_ASYNC_JOBS"):
    from . import async_jobs  # noqa: F401
if os.environ.get("BENCH_PROCESS_JOBS"):
    from . import process_jobs  # noqa: F401


@job("bench.waits", atomic=False)
def waits(job: Any) -> Any:
    """Wait for the event ``e:<i>`` (bench/durable.py), without a timeout."""
    return job.wait_for_event(f"e:{job.data['i']}", timeout=None)


@job("bench.sleeps", atomic=False)
def sleeps(job: Any) -> None:
    """Sleep two days (bench/durable.py)."""
    job.sleep("nap", 2 * 86400)


def _nothing() -> None:
    return None


@job("bench.ten_steps", atomic=False)
def ten_steps(job: Any) -> None:
    """Ten durable no-op steps (bench/durable.py), set beside ten no-op jobs."""
    for number in range(10):
        job.step(f"s{number}", _nothing)
