"""The options of a job, declared once for every entry point that takes them.

``enqueue()``, ``JobDefinition.enqueue()`` and the specs of ``enqueue_many()`` take
:class:`EnqueueOptions`; ``@job`` takes :class:`JobOptions`. Both start from
:class:`JobDefaults`, the options a job type's registration sets as the defaults of
its enqueues. Type checkers see the keys and their types through ``Unpack``; at run
time :func:`check_keys` refuses a key that is not declared.
"""

# No "from __future__ import annotations": TypedDict must see Required at run time.

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Required, TypedDict

from .backoff import Backoff

#: How long to wait before retry number ``attempt``: a ``Backoff``, or a callable.
RetryBackoff = Backoff | Callable[[int], float]
#: A default unique key: the key itself, or ``callable(data) -> key`` (``None``: no key).
UniqueKey = str | Callable[[dict[str, Any]], str | None]


class JobDefaults(TypedDict, total=False):
    """What ``@job`` sets as the defaults of a type's enqueues, and enqueue per job.

    ``None`` (or leaving a key out) takes the job type's default, then ``PGQUEUE``'s.
    """

    #: The queue: 1 to 100 characters, letters, digits and ``_ . : -``.
    queue: str | None
    #: From 0 to 1000; higher runs first.
    priority: int | None
    #: Runs at most this many times (1 to 1000).
    max_attempts: int | None


class EnqueueOptions(JobDefaults, total=False):
    """The options of one job, for ``enqueue()`` and ``JobDefinition.enqueue()``."""

    #: Not claimed before this timezone-aware time.
    run_at: datetime | None
    #: Not claimed before this long (seconds or a ``timedelta``) after the database's
    #: ``now()``; give ``run_at`` or ``delay``, not both.
    delay: float | timedelta | None
    #: At most one pending, claimed or running job has this key.
    unique_key: str | None


class JobSpec(EnqueueOptions, total=False):
    """One job for :func:`~django_pgqueue.enqueue_many`: ``enqueue()``'s arguments as keys."""

    job_type: Required[str]
    data: dict[str, Any] | None


class JobOptions(JobDefaults, total=False):
    """The options of ``@job``, besides the job type's name."""

    #: Seconds (or a ``timedelta``) one run may take.
    timeout: float | timedelta | None
    #: ``Backoff`` or ``callable(attempt) -> seconds``; default: ``PGQUEUE``'s backoff.
    retry_backoff: RetryBackoff | None
    #: Run each attempt in ``transaction.atomic`` (default ``True``).
    atomic: bool
    #: The default ``unique_key`` of the type's enqueues: a string or a callable.
    unique_key: UniqueKey | None
    #: A cron expression: workers enqueue the job on every tick.
    schedule: str | None
    #: At most this many jobs of the type claimed or running at once, cluster-wide.
    concurrency: int | None


ENQUEUE_KEYS: frozenset[str] = EnqueueOptions.__optional_keys__
SPEC_KEYS: frozenset[str] = JobSpec.__required_keys__ | JobSpec.__optional_keys__
JOB_KEYS: frozenset[str] = JobOptions.__optional_keys__


def check_keys(options: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    """Raise ``TypeError`` naming the keys of ``options`` that ``where`` does not take,
    as Python does for an unexpected keyword argument."""
    if not allowed.issuperset(options):
        unknown = sorted(set(options) - allowed)
        raise TypeError(
            f"{where} got unexpected keyword arguments {unknown}; it takes {sorted(allowed)}"
        )
