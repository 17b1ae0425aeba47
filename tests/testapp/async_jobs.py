"""An async job type for worker processes started by tests (registered by
``register()``: by those tests, and by their workers when ``PGQUEUE_TEST_ASYNC_JOBS`` is
set, see jobs.py)."""

import asyncio

from django.utils import timezone

from django_pgqueue import Backoff, job

from .models import Execution


async def durable_async(job):
    """``tests.durable`` as an async handler: await ``data['sleep']`` seconds, then
    record the execution through the async ORM."""
    started = timezone.now()
    await asyncio.sleep(job.data.get("sleep", 0))
    await Execution.objects.acreate(
        job_id=job.id,
        worker_id=job.worker_id,
        attempt=job.attempts,
        started_at=started,
        finished_at=timezone.now(),
    )


def register():
    job("tests.durable_async", max_attempts=50, retry_backoff=Backoff(base=0.05, max=0.1))(
        durable_async
    )
