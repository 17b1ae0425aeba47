"""The fields every log record about a job carries, for structured logging.

Passed as ``extra``, they become attributes of the ``LogRecord``: a JSON formatter
(python-json-logger, structlog's standard-library integration) emits them as keys,
while the default formatter shows the message alone, which names the job already.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import Job

#: The names of the fields, in the order a formatter might list them.
JOB_FIELDS = ("job_id", "job_type", "queue", "attempt", "worker_id")


def job_fields(job: Job) -> dict[str, Any]:
    """``extra`` for a record about ``job``: its id (as text), type, queue, attempt
    number (``attempts``, 0 before its first run) and the worker holding it (or None)."""
    return fields(job.id, job.job_type, job.queue, job.attempts, job.worker_id)


def fields(
    job_id: uuid.UUID,
    job_type: str | None,
    queue: str | None,
    attempt: int | None,
    worker_id: str | None,
) -> dict[str, Any]:
    """``extra`` for a record about a job known by these values (``None``: unknown)."""
    return dict(zip(JOB_FIELDS, (str(job_id), job_type, queue, attempt, worker_id), strict=True))
