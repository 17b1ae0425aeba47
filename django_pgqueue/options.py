"""The options of a job, declared once for every entry point that takes them.

``enqueue()``, ``JobDefinition.enqueue()`` and the specs of ``enqueue_many()`` take
[`EnqueueOptions`][django_pgqueue.options.EnqueueOptions]; ``@job`` takes
[`JobOptions`][django_pgqueue.options.JobOptions]. Both start from
[`JobDefaults`][django_pgqueue.options.JobDefaults], the options a job type's
registration sets as the defaults of its enqueues. Type checkers see the keys and their
types through ``Unpack``; at run time a key that is not declared raises ``TypeError``.
"""

# No "from __future__ import annotations": TypedDict must see Required at run time.

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Required, TypedDict, Union, Unpack

from .backoff import Backoff

if TYPE_CHECKING:
    from .models import Job

#: How long to wait before retry number ``attempt``: a ``Backoff``, or a callable.
RetryBackoff = Backoff | Callable[[int], float]
#: A default unique key: the key itself, or ``callable(data) -> key`` (``None``: no key).
UniqueKey = str | Callable[[dict[str, Any]], str | None]
#: The key of a per-key limit: a path into the payload (``"tenant_id"``,
#: ``"customer.id"``), or ``callable(data) -> str``.
ConcurrencyKey = str | Callable[[dict[str, Any]], str]


#: What a job does when a job it depends on fails for good or is cancelled (see
#: [`OnDependencyFailure`][django_pgqueue.OnDependencyFailure]).
DependencyFailure = Literal["cancel", "run", "run_only"]


@dataclass(frozen=True, slots=True)
class Dependency:
    """One job to wait for, with its own failure policy: an item of ``depends_on``.

    ```python
    enqueue("report", depends_on=[fetch, Dependency(enrich, on_failure="run")])
    ```

    Also ``django_pgqueue.Dependency``. ``job`` is what ``depends_on`` takes directly: a
    ``Job``, its id (a ``UUID`` or its text), or in ``enqueue_many`` the index of
    another spec. ``on_failure``: ``"cancel"`` or ``"run"``; ``None`` takes the
    dependent job's ``on_dependency_failure``.
    """

    job: "Job | uuid.UUID | str | int"
    on_failure: DependencyFailure | None = None


#: An item of ``depends_on``: a ``Job``, a job id, the index of a spec of the same
#: ``enqueue_many`` call, or a [`Dependency`][django_pgqueue.Dependency].
DependencyRef = Union["Job", uuid.UUID, str, int, Dependency]


#: What ``enqueue`` and ``enqueue_many`` do when an active job holds a unique key:
#: return it, raise ``DuplicateJobError``, or replace a pending one's payload and run time.
OnDuplicate = Literal["return", "raise", "replace"]


class JobDefaults(TypedDict, total=False):
    """What ``@job`` sets as the defaults of a type's enqueues, and enqueue per job.

    ``None`` (or leaving a key out) takes the job type's default, then ``PGQUEUE``'s.
    Arguments given to ``enqueue()`` win over the defaults of ``@job``.
    """

    queue: str | None
    """The queue: 1 to 100 characters, letters, digits and ``_ . : -``, not starting with
    ``.``, ``:`` or ``-``. Default: the job type's ``queue``, else
    ``PGQUEUE["DEFAULT_QUEUE"]``."""
    priority: int | None
    """An integer from 0 to 1000; higher runs first. Default: the job type's
    ``priority``, else ``PGQUEUE["DEFAULT_PRIORITY"]``."""
    max_attempts: int | None
    """Attempts allowed before the job ends ``failed``: an integer from 1 to 1000.
    Default: the job type's ``max_attempts``, else ``PGQUEUE["DEFAULT_MAX_ATTEMPTS"]``."""


class EnqueueOptions(JobDefaults, total=False):
    """The options of one job, for ``enqueue()`` and ``JobDefinition.enqueue()``."""

    run_at: datetime | None
    """A timezone-aware ``datetime`` before which the job is not claimed, stored in UTC
    (any offset Python allows is accepted, also those PostgreSQL refuses). Once in UTC it
    must lie between 0001-01-02 and 9999-12-30 (``validation.EARLIEST_TIME``,
    ``validation.LATEST_TIME``), so that it can be read back and shown in any time zone;
    a naive ``datetime`` is rejected."""
    delay: float | timedelta | None
    """Seconds (a non-negative number, at most 1,000 years: ``MAX_DELAY_SECONDS``) or a
    ``timedelta``: the job is due that long after PostgreSQL's ``now()``, the start of the
    current transaction, to the microsecond. Give ``run_at`` or ``delay``, not both; with
    neither, the job is due at once."""
    unique_key: str | None
    """At most one ``pending``, ``claimed`` or ``running`` job has this key. Text of 1 to
    255 characters (``django_pgqueue.schema.UNIQUE_KEY_MAX_LENGTH``), without NUL
    characters or lone surrogates. Keys are global across job types and queues. Default:
    the job type's ``unique_key`` (a string, or what its callable returns for ``data``),
    else no key. See [Avoid duplicate jobs](../how-to/unique-jobs.md)."""
    unique_for: float | timedelta | None
    """A window, in seconds or as a ``timedelta`` (positive, at most 1,000 years): a job
    with the same ``unique_key`` enqueued this recently also holds the key once it has
    finished, unless it was cancelled. Needs a ``unique_key``. Default: the job type's
    ``unique_for``, else none (only active jobs hold the key). See
    [Unique over a window](../how-to/unique-jobs.md#unique-over-a-window)."""
    timeout: float | timedelta | None
    """Limit on each attempt of this job, in seconds or as a ``timedelta``; must be
    positive. Overrides the job type's ``@job(timeout=...)``. ``None``: the type's. See
    [Set timeouts](../how-to/timeouts.md#per-job)."""
    depends_on: Iterable[DependencyRef] | DependencyRef | None
    """Jobs this one waits for: it is ``waiting`` until every one of them has completed,
    then ``pending`` (due from then on, or at its ``run_at`` if later). Items: ``Job``s,
    job ids, in ``enqueue_many`` indexes of other specs, or
    [`Dependency`][django_pgqueue.Dependency]s. The jobs must exist in the same jobs
    database; they are locked until the enqueuing transaction ends. Cannot be combined
    with a ``unique_key``. ``None`` or empty: no dependencies. See
    [Workflows](../how-to/workflows.md)."""
    on_dependency_failure: DependencyFailure | None
    """What happens when a job it depends on fails for good or is cancelled:
    ``"cancel"`` (the default) cancels this job and what depends on it, ``"run"`` runs it
    anyway once the others are done, ``"run_only"`` runs it once all are done only if
    one failed or was cancelled (else it is cancelled as not needed). Needs
    ``depends_on``."""


class JobSpec(EnqueueOptions, total=False):
    """One job for ``enqueue_many()``: ``enqueue()``'s arguments as keys.

    For type checkers (also exported as ``django_pgqueue.JobSpec``); plain dicts work
    too. ``job_type`` is required, every other key is optional and defaults as in
    [`enqueue()`][django_pgqueue.enqueue.enqueue].
    """

    job_type: Required[str]
    """The job type, as ``enqueue()``'s ``job_type``."""
    data: dict[str, Any] | None
    """The payload, as ``enqueue()``'s ``data``."""


class JobOptions(JobDefaults, total=False):
    """The options of ``@job``, besides the job type's name.

    ``queue``, ``priority`` and ``max_attempts`` (from
    [`JobDefaults`][django_pgqueue.options.JobDefaults]) are the defaults of the type's
    enqueues.
    """

    timeout: float | timedelta | None
    """Limit on one attempt, in seconds or as a ``timedelta``; must be positive.
    ``None``: no limit. See [Set timeouts](../how-to/timeouts.md)."""
    isolation: Literal["thread", "process"]
    """Where a worker runs the handler: ``"thread"`` (the default), a thread of the worker
    process; or ``"process"``, a child process of the worker, which a timeout or a
    cancellation kills for real, and which is replaced after a crash. Not for ``async
    def`` handlers. See [Isolate jobs in processes](../how-to/process-isolation.md)."""
    retry_backoff: RetryBackoff | None
    """Delay before a retry: a [`Backoff`][django_pgqueue.Backoff], or a callable that
    receives the number of the attempt that failed (1-based) and returns seconds.
    ``None``: the backoff from ``PGQUEUE["RETRY_BACKOFF_BASE"]`` and
    ``["RETRY_BACKOFF_MAX"]``."""
    atomic: bool
    """When ``True`` (the default) the handler runs inside ``transaction.atomic`` on the
    worker's database (``PGQUEUE["DATABASE"]`` unless the worker was given another): its
    writes are committed only if it returns. ``False``: it runs in autocommit mode and
    manages transactions itself. An ``async def`` handler always runs outside a
    transaction (its default is ``False``, and ``True`` is refused): see
    [Run async handlers](../how-to/async-handlers.md#transactions)."""
    effectively_once: bool
    """For an ``atomic`` handler: when ``True`` (the default) the worker writes the job's
    completion in the handler's transaction, once the handler has returned and if it
    used the database, so that its writes and the completion commit together, once
    ([effectively once](../explanation/guarantees.md#delivery-semantics)). ``False``:
    the completion goes with the worker's next batch of outcomes, one statement for many
    jobs, and a worker that dies between the handler's commit and that batch has the job
    run again (at least once). For tiny handlers that write, where that statement is a
    tenth or more of the work: see
    [Performance](../explanation/performance.md#completion-in-transaction). ``True`` is
    refused without ``atomic``."""
    unique_key: UniqueKey | None
    """The default ``unique_key`` of ``enqueue()`` for this type: a string (at most one
    active job of the type, when every enqueue uses it), or a callable that receives the
    job's ``data`` (``{}`` when none) and returns the key or ``None`` for no key. The
    callable runs at every enqueue without an explicit key; if it raises or returns
    another type, the enqueue raises ``InvalidJobError`` (``field`` ``"unique_key"``). See
    [Avoid duplicate jobs](../how-to/unique-jobs.md#give-a-job-type-a-default-key)."""
    unique_for: float | timedelta | None
    """The default ``unique_for`` of ``enqueue()`` for this type, for its enqueues that
    have a unique key (given, or the type's ``unique_key``)."""
    schedule: str | None
    """A cron expression (``"0 3 * * *"``; 6 fields with seconds last; or ``@hourly``,
    ``@daily``, ...): workers enqueue this job type on every tick, once per tick, under a
    schedule named after the job type, evaluated in Django's ``TIME_ZONE``. Whitespace is
    normalised. See [Run jobs on a schedule](../how-to/periodic-jobs.md)."""
    concurrency: int | None
    """At most this many jobs of this type claimed or running at once, across all
    workers: an integer from 1 to 1,000,000, or ``None`` (the default) for no limit.
    [`PGQUEUE["JOB_TYPE_LIMITS"]`](settings.md#limits) wins over it for the same job
    type. Workers write it to ``pgqueue_limits`` when they start. See
    [Limit how many jobs run at once](../how-to/concurrency-limits.md). With
    ``concurrency_key``, the limit applies to each key instead."""
    concurrency_key: ConcurrencyKey | None
    """Apply ``concurrency`` to each key of this job type: at most ``concurrency`` jobs of
    one key claimed or running at once, and keys at their limit never delay the others.
    A string is a path into the payload (``"tenant_id"``, or ``"customer.id"`` for a
    nested field) whose value, a string or an integer, is the key; a callable receives
    the job's ``data`` and returns the key as a string. Computed at every enqueue: a
    missing field, a callable that raises or returns anything but a non-empty string of
    at most 255 characters raises ``InvalidJobError`` (``field`` ``"concurrency_key"``).
    Needs ``concurrency``. See
    [Limit jobs per key](../how-to/per-key-concurrency.md)."""
    rate_limit: str | None
    """At most so many jobs of this type started in any window of a period, across all
    workers: ``"100/m"``, ``"10/s"``, ``"5000/h"``, ``"30/10s"`` (units ``s``, ``m``,
    ``h``, ``d``; 1 to 1,000,000 jobs; a period from a second to 7 days). A job over the
    limit stays pending, its attempts untouched, and starts as soon as the window has
    room. [`PGQUEUE["JOB_TYPE_RATE_LIMITS"]`](settings.md#rate-limits) wins over it for
    the same job type. A malformed rate raises ``InvalidArgumentError``
    (``field`` ``"rate_limit"``) at registration. With ``rate_key``, the rate applies to
    each key instead. See [Rate-limit jobs](../how-to/rate-limits.md)."""
    rate_key: ConcurrencyKey | None
    """Apply ``rate_limit`` to each key of this job type (a tenant, an account): a payload
    path or a callable, as ``concurrency_key`` takes, computed at every enqueue (errors
    name ``field`` ``"rate_key"``). Needs ``rate_limit``. A job type has one key: with
    both ``concurrency_key`` and ``rate_key``, they must be the same. See
    [Rate-limit each key](../how-to/rate-limits.md#rate-limit-each-key)."""


__all__ = ["Dependency", "EnqueueOptions", "JobDefaults", "JobOptions", "JobSpec", "Step"]


class Step:
    """A job to enqueue later, as a step of [`chain()`][django_pgqueue.chain],
    [`group()`][django_pgqueue.group] or [`chord()`][django_pgqueue.chord].

    ```python
    Step("photos.resize", {"photo": 7}, queue="images")
    resize.step({"photo": 7}, queue="images")  # the same, from the @job definition
    ```

    Also ``django_pgqueue.Step``. ``options`` are ``enqueue()``'s
    [`EnqueueOptions`][django_pgqueue.options.EnqueueOptions] (an undeclared keyword
    raises ``TypeError``); they win over the options given to the workflow's
    ``enqueue()``. ``depends_on`` may name jobs that exist already, besides the steps
    before it. Nothing is validated or written until the workflow is enqueued.
    """

    __slots__ = ("data", "job_type", "options")

    def __init__(
        self, job_type: str, data: dict[str, Any] | None = None, **options: Unpack[EnqueueOptions]
    ) -> None:
        if options:
            check_keys(options, ENQUEUE_KEYS, "Step()")
        self.job_type = job_type
        self.data = data
        self.options: dict[str, Any] = dict(options)

    def __repr__(self) -> str:
        options = "".join(f", {key}={value!r}" for key, value in self.options.items())
        return f"Step({self.job_type!r}, {self.data!r}{options})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Step):
            return NotImplemented
        return (self.job_type, self.data, self.options) == (
            other.job_type,
            other.data,
            other.options,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable payload: not hashable


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
