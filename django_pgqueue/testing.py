"""Assertions for your project's tests: which jobs your code enqueued.

```python
from django_pgqueue.testing import assert_enqueued, capture_jobs, refute_enqueued

def test_signing_up_sends_the_welcome_email(client):
    with capture_jobs() as jobs:
        client.post("/signup/", {"email": "ada@example.com"})

    assert [job.job_type for job in jobs] == ["emails.welcome"]
    assert_enqueued(job_type="emails.welcome", data={"email": "ada@example.com"})
    refute_enqueued(job_type="emails.reminder")
```

They read the jobs database as the test sees it, inside ``TestCase``'s transaction or
with pytest-django's ``db`` fixture alike, and only in a test run (Django's test
environment set up): a clear error otherwise, never a query against a real queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.db.models import QuerySet

from . import conf, signals
from .models import Job
from .schema import JobStatus

__all__ = ["assert_enqueued", "capture_jobs", "enqueued_jobs", "refute_enqueued"]


def enqueued_jobs(
    *,
    job_type: str | None = None,
    data: dict[str, Any] | None = None,
    queue: str | None = None,
    using: str | None = None,
) -> list[Job]:
    """The pending jobs (due or delayed) that match, oldest first.

    Args:
        job_type: The job type, exactly.
        data: Key-value pairs the payload contains (``data @> ...``: nested objects
            match by containment, other keys of the payload are ignored).
        queue: The queue, exactly.
        using: The jobs database alias (default: the one ``JobsRouter`` picks).
    """
    _require_test_environment()
    if data is not None and not isinstance(data, dict):
        raise TypeError(f"data must be a dict of what the payload contains, got {data!r}")
    jobs = _pending(using)
    if job_type is not None:
        jobs = jobs.filter(job_type=job_type)
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    if data is not None:
        jobs = jobs.filter(data__contains=data)
    return list(jobs)


def assert_enqueued(
    *,
    job_type: str | None = None,
    data: dict[str, Any] | None = None,
    queue: str | None = None,
    count: int | None = None,
    using: str | None = None,
) -> list[Job]:
    """Fail unless pending jobs match (exactly ``count`` of them, when given); return them.

    The failure lists the pending jobs there are, so that a near miss (another queue, a
    key spelled differently) shows at once. Arguments: as :func:`enqueued_jobs`.
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise TypeError(f"count must be an integer of 0 or more, got {count!r}")
    found = enqueued_jobs(job_type=job_type, data=data, queue=queue, using=using)
    if (count is None and not found) or (count is not None and len(found) != count):
        wanted = "a job" if count is None else f"{count} job(s)"
        raise AssertionError(
            f"expected {wanted} enqueued matching {_criteria(job_type, data, queue)}, "
            f"found {len(found)}.\n{_pending_list(using)}"
        )
    return found


def refute_enqueued(
    *,
    job_type: str | None = None,
    data: dict[str, Any] | None = None,
    queue: str | None = None,
    using: str | None = None,
) -> None:
    """Fail if any pending job matches. Arguments: as :func:`enqueued_jobs`."""
    found = enqueued_jobs(job_type=job_type, data=data, queue=queue, using=using)
    if found:
        raise AssertionError(
            f"expected no job enqueued matching {_criteria(job_type, data, queue)}, "
            f"found {len(found)}.\n{_pending_list(using)}"
        )


@contextmanager
def capture_jobs() -> Iterator[list[Job]]:
    """Collect the jobs enqueued inside the block, in the order they were inserted.

    Every job ``enqueue()``, ``enqueue_many()`` or the Tasks backend inserts is added to
    the list the block receives (jobs only returned because a unique key held them are
    not: nothing was inserted). Whether the transaction then commits does not matter:
    the list says what the code asked for.
    """
    _require_test_environment()
    captured: list[Job] = []

    def collect(sender: Any, job: Job, **kwargs: Any) -> None:
        captured.append(job)

    signals.job_enqueued.connect(collect, weak=False)
    try:
        yield captured
    finally:
        signals.job_enqueued.disconnect(collect)


#: Pending jobs a failure message lists at most.
LISTED = 20


def _criteria(job_type: str | None, data: dict[str, Any] | None, queue: str | None) -> str:
    given = {"job_type": job_type, "data": data, "queue": queue}
    shown = ", ".join(f"{name}={value!r}" for name, value in given.items() if value is not None)
    return shown or "anything"


def _pending(using: str | None) -> QuerySet[Job]:
    """Every pending job of the jobs database, oldest first."""
    jobs = Job.objects.using(conf.jobs_database(using)).filter(status=JobStatus.PENDING)
    return jobs.order_by("created_at", "id")


def _pending_list(using: str | None) -> str:
    pending = list(_pending(using)[: LISTED + 1])
    if not pending:
        return "No job is pending."
    lines = [f"  {job.job_type} queue={job.queue!r} data={job.data!r}" for job in pending[:LISTED]]
    more = ["  ..."] if len(pending) > LISTED else []
    return "Pending jobs:\n" + "\n".join([*lines, *more])


def _require_test_environment() -> None:
    # Django's test environment (its runner, pytest-django) gives mail an outbox.
    if not hasattr(mail, "outbox"):
        raise ImproperlyConfigured(
            "django_pgqueue.testing is for tests: Django's test environment is not set up "
            "(run it under `manage.py test`, pytest-django, or call "
            "django.test.utils.setup_test_environment())"
        )
