"""django-pgqueue: a production job queue on the PostgreSQL you already run.

The public API is what this module exports; everything else is internal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import exceptions
from .backoff import Backoff
from .enqueue import aenqueue, aenqueue_many, enqueue, enqueue_many
from .events import aemit_event, emit_event
from .exceptions import (
    DuplicateJobError,
    EventTimeout,
    FailJob,
    InvalidJobError,
    JobCancelled,
    JobSuspended,
    PgQueueError,
    RetryJob,
    Snooze,
)
from .options import Dependency, JobSpec, Step
from .registry import job
from .workflows.canvas import Workflow, batch, chain, chord, group

if TYPE_CHECKING:
    from .models import Job
    from .queues import pause_queue, resume_queue
    from .schema import JobStatus, OnDependencyFailure

__all__ = [
    "Backoff",
    "Dependency",
    "DuplicateJobError",
    "EventTimeout",
    "FailJob",
    "InvalidJobError",
    "Job",
    "JobCancelled",
    "JobSpec",
    "JobStatus",
    "JobSuspended",
    "OnDependencyFailure",
    "PgQueueError",
    "RetryJob",
    "Snooze",
    "Step",
    "Workflow",
    "aemit_event",
    "aenqueue",
    "aenqueue_many",
    "batch",
    "chain",
    "chord",
    "emit_event",
    "enqueue",
    "enqueue_many",
    "exceptions",
    "group",
    "job",
    "pause_queue",
    "resume_queue",
]

__version__ = "0.1.0.dev0"

_LAZY = {
    "Job": ("models", "Job"),
    "JobStatus": ("schema", "JobStatus"),
    "OnDependencyFailure": ("schema", "OnDependencyFailure"),
    "pause_queue": ("queues", "pause_queue"),
    "resume_queue": ("queues", "resume_queue"),
}


def __getattr__(name: str) -> Any:
    # Models can only be imported once the app registry is ready; importing them lazily
    # keeps ``import django_pgqueue`` (and ``@job`` in an app's jobs.py) safe at any time.
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        from importlib import import_module

        return getattr(import_module(f".{module_name}", __name__), attribute)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
