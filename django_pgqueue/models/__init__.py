"""The app's models, on the jobs database: jobs and their events, the dependencies of
workflow steps, and the tables of running the queue."""

# The states live in schema (with their sets); importable from here too, beside the model.
from ..schema import JobStatus as JobStatus
from ..schema import StepKind as StepKind
from .attempts import AttemptOutcome, JobAttempt
from .base import JobsDatabaseManager as JobsDatabaseManager
from .base import JobsDatabaseModel as JobsDatabaseModel
from .dependencies import JobDependency, JobWait
from .jobs import RETRY_PERMISSION as RETRY_PERMISSION
from .jobs import DependencyOutcome, Job, JobEvent
from .operations import (
    ConcurrencyLimit,
    PeriodicTick,
    QueueState,
    RateLimit,
    RateLimitStart,
    StoredSchedule,
    WorkerRecord,
)
from .operations import (
    LimitScope as LimitScope,
)
from .operations import (
    RateLimitScope as RateLimitScope,
)
from .rollups import HourJobs, MinuteJobs, QueueMinute
from .steps import EmittedEvent, JobStep
from .transitions import JobQuerySet
from .transitions import notify_queues as notify_queues

__all__ = [
    "AttemptOutcome",
    "ConcurrencyLimit",
    "DependencyOutcome",
    "EmittedEvent",
    "HourJobs",
    "Job",
    "JobAttempt",
    "JobDependency",
    "JobEvent",
    "JobQuerySet",
    "JobStep",
    "JobWait",
    "MinuteJobs",
    "PeriodicTick",
    "QueueMinute",
    "QueueState",
    "RateLimit",
    "RateLimitStart",
    "StepKind",
    "StoredSchedule",
    "WorkerRecord",
]
