"""The ``@job`` decorator and the registry mapping job types to handlers."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Unpack, overload

from asgiref.sync import iscoroutinefunction

# The one intended cycle: enqueue reads @job defaults. Imported by its full name:
# mypy reads ``from . import enqueue`` as the function that __init__ exports.
import django_pgqueue.enqueue as enqueueing

from . import conf, validation
from .backoff import Backoff, default_backoff
from .cron import validate_cron
from .exceptions import JobRegistrationError, SettingsError, UnknownJobTypeError
from .options import (
    JOB_KEYS,
    ConcurrencyKey,
    EnqueueOptions,
    JobOptions,
    OnDuplicate,
    RetryBackoff,
    Step,
    UniqueKey,
    check_keys,
)
from .rates import Rate, parse_rate

if TYPE_CHECKING:
    from .models import Job

Handler = Callable[["Job"], Any]
JobDecorator = Callable[[Handler], "JobDefinition"]


class JobDefinition:
    """A registered handler with its defaults. Calling it calls the handler.

    What [`@job`][django_pgqueue.job] returns in place of the function. Calling it,
    ``definition(job)``, calls the handler directly, in the current thread, without a
    transaction: useful in tests.

    Attributes:
        func: The decorated function.
        job_type: The registered name.
        queue: The default given to ``@job``, or ``None``.
        priority: The default given to ``@job``, or ``None``.
        max_attempts: The default given to ``@job``, or ``None``.
        timeout: The timeout in seconds (a ``float``), or ``None``.
        retry_backoff: As given to ``@job``, or ``None``.
        atomic: Whether the worker runs the handler in a transaction (``False`` for an
            async handler).
        effectively_once: Whether the worker writes the job's completion in the
            handler's transaction (``atomic`` handlers only; ``False`` otherwise).
        is_async: Whether the handler is an ``async def`` function, which workers run on
            their event loop.
        isolation: ``"thread"`` or ``"process"``, as given to ``@job``.
        unique_key: As given to ``@job`` (a string or a callable), or ``None``.
        unique_for: The window in seconds (a ``float``), or ``None``.
        schedule: As given to ``@job`` (normalised), or ``None``.
        concurrency: As given to ``@job``, or ``None``.
        concurrency_key: As given to ``@job`` (a payload path or a callable), or ``None``.
        rate_limit: The rate given to ``@job``, parsed, or ``None``.
        rate_key: As given to ``@job`` (a payload path or a callable), or ``None``.
    """

    def __init__(
        self,
        func: Handler,
        *,
        job_type: str,
        queue: str | None,
        priority: int | None,
        max_attempts: int | None,
        timeout: float | None,
        retry_backoff: RetryBackoff | None,
        atomic: bool,
        unique_key: UniqueKey | None = None,
        unique_for: float | None = None,
        schedule: str | None = None,
        concurrency: int | None = None,
        concurrency_key: ConcurrencyKey | None = None,
        rate_limit: Rate | None = None,
        rate_key: ConcurrencyKey | None = None,
        isolation: str = "thread",
        effectively_once: bool | None = None,
    ) -> None:
        self.func = func
        self.job_type = job_type
        self.queue = queue
        self.priority = priority
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.retry_backoff = retry_backoff
        self.atomic = atomic
        self.effectively_once = atomic if effectively_once is None else effectively_once
        #: Whether the handler is an ``async def`` function, run on the worker's event loop.
        self.is_async = is_async_handler(func)
        #: ``"thread"`` or ``"process"``: where a worker runs the handler.
        self.isolation = isolation
        #: Default ``unique_key`` of ``enqueue`` for this type (a string or a callable).
        self.unique_key = unique_key
        #: Default ``unique_for`` of ``enqueue`` for this type, in seconds.
        self.unique_for = unique_for
        #: Cron expression: workers enqueue this job on each tick (periodic jobs).
        self.schedule = schedule
        #: At most this many jobs of this type claimed or running at once, cluster-wide.
        self.concurrency = concurrency
        #: With it, ``concurrency`` applies to each key: a payload path or ``callable(data)``.
        self.concurrency_key = concurrency_key
        #: At most ``rate_limit.jobs`` jobs of this type started per ``rate_limit.seconds``.
        self.rate_limit = rate_limit
        #: With it, ``rate_limit`` applies to each key: a payload path or ``callable(data)``.
        self.rate_key = rate_key
        functools.update_wrapper(self, func)

    def __call__(self, job: Job) -> Any:
        return self.func(job)

    @property
    def key(self) -> ConcurrencyKey | None:
        """Where each job's key comes from, for the per-key limits of this job type:
        ``concurrency_key``, else ``rate_key`` (they are the same when both are given).
        Stored in ``Job.concurrency_key``."""
        return self.concurrency_key if self.concurrency_key is not None else self.rate_key

    @property
    def key_option(self) -> str:
        """The ``@job`` option that names the key: ``"concurrency_key"`` or ``"rate_key"``."""
        return "concurrency_key" if self.concurrency_key is not None else "rate_key"

    def __repr__(self) -> str:
        return f"<JobDefinition {self.job_type!r} -> {_qualified(self.func)}>"

    def enqueue(
        self,
        data: dict[str, Any] | None = None,
        *,
        on_duplicate: OnDuplicate = "return",
        using: str | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Job:
        """Enqueue a job of this type; see ``enqueue()``.

        [`enqueue()`][django_pgqueue.enqueue.enqueue] with this job type: the same
        arguments but ``job_type``, the same result and errors.
        """
        return enqueueing.enqueue(
            self.job_type, data, on_duplicate=on_duplicate, using=using, **options
        )

    def step(self, data: dict[str, Any] | None = None, **options: Unpack[EnqueueOptions]) -> Step:
        """A job of this type to enqueue later, as a step of a workflow.

        [`Step`][django_pgqueue.Step] with this job type: ``resize.step({"photo": 7})``
        for [`chain()`][django_pgqueue.chain], [`group()`][django_pgqueue.group] and
        [`chord()`][django_pgqueue.chord]. Nothing is written until the workflow is
        enqueued.
        """
        return Step(self.job_type, data, **options)

    def retry_delay(self, attempt: int) -> float:
        """Seconds to wait before retrying after failed attempt ``attempt``.

        From ``retry_backoff``, else the default backoff of the ``PGQUEUE`` setting.
        """
        backoff = self.retry_backoff or default_backoff()
        if isinstance(backoff, Backoff):
            return backoff.delay(attempt)
        return float(backoff(attempt))


__all__ = ["JobDefinition", "job"]

_registry: dict[str, JobDefinition] = {}
_lock = threading.Lock()

#: Resolvers of job types no ``@job`` registered, by the job-type prefix they own.
Resolver = Callable[[str], JobDefinition | None]
_resolvers: dict[str, Resolver] = {}


def register_resolver(prefix: str, resolver: Resolver) -> None:
    """Let ``resolver(job_type)`` supply the definition of job types starting with ``prefix``.

    It is asked only when no ``@job`` registered the job type, on every look-up (cache in
    the resolver if needed), and returns ``None`` for a job type it cannot handle; it must
    not raise. The prefix is reserved: ``@job`` rejects names that start with it. The
    Django Tasks backend resolves its ``task:<dotted path>`` job types this way.
    """
    with _lock:
        _resolvers[prefix] = resolver


#: Where a worker may run a handler (``@job(isolation=...)``).
ISOLATIONS = ("thread", "process")


def is_async_handler(func: Callable[..., Any]) -> bool:
    """Whether ``func`` is an ``async def`` function (or an instance whose ``__call__``
    is one): workers run such handlers on their event loop, not in a thread."""
    if iscoroutinefunction(func):
        return True
    plain = inspect.isroutine(func) or isinstance(func, functools.partial) or not callable(func)
    return not plain and iscoroutinefunction(type(func).__call__)


def why_it_cannot_run(func: Callable[..., Any]) -> str | None:
    """Why a worker could not run ``func`` as a handler, or ``None`` when it can.

    A generator function (sync or async) returns without running its body: a worker
    would record the job completed although nothing ran. A handler must also take the
    job as its one positional argument. An ``async def`` handler can run: workers run it
    on their event loop (``is_async_handler``).
    """
    plain = inspect.isroutine(func) or isinstance(func, functools.partial)
    # A callable instance runs its class's __call__.
    target = func if plain or not callable(func) else type(func).__call__
    if inspect.isasyncgenfunction(target) or inspect.isgeneratorfunction(target):
        return (
            "is a generator function: calling it runs none of its body. Use return instead of yield"
        )
    try:
        inspect.signature(func).bind(None)
    except TypeError:
        return "must take the job as its one positional argument: def handler(job): ..."
    except ValueError:
        pass  # no signature to read (some builtins): let it run
    return None


def register(definition: JobDefinition) -> JobDefinition:
    """Add ``definition``; re-registering the same function (a module reload) is allowed.

    Raises :class:`JobRegistrationError` for a handler a worker could not run (see
    :func:`why_it_cannot_run`), or a job type that is taken or reserved.
    """
    problem = why_it_cannot_run(definition.func)
    if problem is not None:
        raise JobRegistrationError(
            f"the handler {_qualified(definition.func)} of job type {definition.job_type!r} "
            f"{problem}"
        )
    reserved = next((p for p in _resolvers if definition.job_type.startswith(p)), None)
    if reserved is not None:
        raise JobRegistrationError(
            f"job type {definition.job_type!r} starts with {reserved!r}, a prefix reserved "
            "for job types resolved on demand (Django Tasks); choose another name"
        )
    with _lock:
        existing = _registry.get(definition.job_type)
        if existing is not None and _qualified(existing.func) != _qualified(definition.func):
            raise JobRegistrationError(
                f"job type {definition.job_type!r} is already registered to "
                f"{_qualified(existing.func)}; cannot also register {_qualified(definition.func)}. "
                "Pass a distinct name: @job('another.name')"
            )
        _registry[definition.job_type] = definition
    return definition


def unregister(job_type: str) -> None:
    """Remove a job type (for tests)."""
    with _lock:
        _registry.pop(job_type, None)


def get_definition(job_type: str) -> JobDefinition:
    """Return the handler registered for ``job_type`` or raise ``UnknownJobTypeError``."""
    definition = find_definition(job_type)
    if definition is None:
        known = ", ".join(sorted(_registry)) or "none"
        raise UnknownJobTypeError(
            f"no handler is registered for job type {job_type!r} (registered: {known}). "
            "Define it with @django_pgqueue.job in an installed app's jobs.py"
        )
    return definition


def find_definition(job_type: str) -> JobDefinition | None:
    """The handler of ``job_type``: a ``@job`` registration, else a resolver's, else None."""
    definition = _registry.get(job_type)
    if definition is None:
        for prefix, resolver in _resolvers.items():
            if job_type.startswith(prefix):
                return resolver(job_type)
    return definition


def registered_job_types() -> list[str]:
    return sorted(_registry)


def _qualified(func: Callable[..., Any]) -> str:
    module = getattr(func, "__module__", None) or type(func).__module__
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    return f"{module}.{name}"


def _check_concurrency(value: Any) -> None:
    try:
        conf.concurrency_limit(value, "@job(concurrency=...)")
    except SettingsError as exc:
        raise JobRegistrationError(
            f"{exc}; use None (the default) for no limit. The limit applies across all "
            "workers; a worker's own --concurrency bounds its threads"
        ) from None


def _check_key(option: str, value: Any, limit: Any) -> None:
    """``concurrency_key`` or ``rate_key``: a payload path or a callable, with its limit."""
    if isinstance(value, str):
        if not value or any(not part for part in value.split(".")):
            raise JobRegistrationError(
                f"{option} {value!r} is not a payload path: give a field name such as "
                "'tenant_id', or dotted names for nested fields ('customer.id')"
            )
    elif not callable(value):
        raise JobRegistrationError(
            f"{option} must be a payload path (a string such as 'tenant_id') or a "
            f"callable(data) -> str; got {type(value).__name__}"
        )
    if limit is not None:
        return
    if option == "concurrency_key":
        raise JobRegistrationError(
            "concurrency_key needs concurrency: how many jobs of one key may run at once, "
            "e.g. @job(concurrency=3, concurrency_key='tenant_id')"
        )
    raise JobRegistrationError(
        "rate_key needs rate_limit: how many jobs of one key may start per period, "
        "e.g. @job(rate_limit='10/s', rate_key='tenant_id')"
    )


@overload
def job(job_type: Handler, /) -> JobDefinition: ...


@overload
def job(job_type: str | None = None, /, **options: Unpack[JobOptions]) -> JobDecorator: ...


def job(
    job_type: str | Handler | None = None, /, **options: Unpack[JobOptions]
) -> JobDefinition | JobDecorator:
    """Register a handler ``handler(job: Job)``; usable as ``@job`` or ``@job("name", ...)``.

    A handler is a function that takes the [`Job`][django_pgqueue.Job] and returns a
    JSON-serialisable value or ``None``.

    ```python
    from django_pgqueue import job

    @job("orders.send_confirmation", queue="emails", max_attempts=5)
    def send_confirmation(job):
        ...
    ```

    Handlers are found through the registry, so the module that defines them must be
    imported in every process that enqueues or runs them. django-pgqueue imports the
    ``jobs`` module of every installed app when Django starts; define handlers there, or
    import their module from there.

    Args:
        job_type: Positional only. The name stored in the database. Default:
            ``"<module>.<function qualname>"``, e.g. ``"orders.jobs.send_confirmation"``.
            Naming it explicitly lets you move or rename the function without breaking
            queued jobs.
        **options: The keys of [`JobOptions`][django_pgqueue.options.JobOptions]:
            ``queue``, ``priority``, ``max_attempts`` (defaults of the type's enqueues),
            ``timeout``, ``retry_backoff``, ``atomic`` (default ``True``; an
            ``async def`` handler runs outside a transaction and refuses ``True``),
            ``effectively_once`` (default ``True`` for an atomic handler),
            ``isolation`` (``"thread"``, the default, or ``"process"``),
            ``unique_key``, ``unique_for``, ``schedule``, ``concurrency``,
            ``concurrency_key``, ``rate_limit``, ``rate_key``. An undeclared keyword raises
            ``TypeError``.

    Returns:
        A [`JobDefinition`][django_pgqueue.registry.JobDefinition] (or, called with
            arguments, a decorator that returns one).

    Raises:
        InvalidArgumentError: At decoration time, for a malformed ``rate_limit``.
        InvalidJobError: At decoration time, for an invalid ``job_type``, ``queue``,
            ``priority``, ``max_attempts``, ``timeout``, ``unique_for`` or ``schedule``
            (the message says what is wrong with the cron expression), or a string
            ``unique_key`` that is not a valid key.
        JobRegistrationError: At decoration time, when ``retry_backoff`` is neither a
            ``Backoff`` nor a callable, when ``unique_key`` is neither a string nor a
            callable, when ``concurrency`` is invalid, when ``concurrency_key`` or
            ``rate_key`` is neither a payload path nor a callable or comes without its
            limit, when both are given and differ, when
            the decorated object is not callable or a worker could not run it (a
            generator function, or one that does not take the job as its one
            positional argument), when ``atomic=True`` or ``isolation="process"`` is
            given to an ``async def`` handler, when ``effectively_once`` is not a
            boolean or is ``True`` for a handler that is not atomic, when ``isolation`` is
            neither
            ``"thread"`` nor ``"process"``, or when
            the job type is already registered to a different function
            (registering the same function again, as a module reload does, is allowed),
            or starts with ``task:``, the prefix reserved for
            [Django Tasks](tasks-backend.md#jobs).
    """
    check_keys(options, JOB_KEYS, "@job()")
    queue = options.get("queue")
    priority = options.get("priority")
    max_attempts = options.get("max_attempts")
    timeout = options.get("timeout")
    retry_backoff = options.get("retry_backoff")
    atomic = options.get("atomic")
    unique_key = options.get("unique_key")
    unique_for = options.get("unique_for")
    schedule = options.get("schedule")
    concurrency = options.get("concurrency")
    concurrency_key = options.get("concurrency_key")
    rate_limit = options.get("rate_limit")
    rate_key = options.get("rate_key")
    isolation = options.get("isolation", "thread")
    effectively_once = options.get("effectively_once")
    if effectively_once is not None and not isinstance(effectively_once, bool):
        raise JobRegistrationError(
            f"effectively_once must be True or False, got {effectively_once!r}"
        )
    if effectively_once and atomic is False:
        raise JobRegistrationError(
            "effectively_once=True needs atomic=True: the job's completion is written in "
            "the handler's transaction, and a handler with atomic=False has none"
        )
    if isolation not in ISOLATIONS:
        raise JobRegistrationError(
            f"isolation must be one of {', '.join(map(repr, ISOLATIONS))}, got {isolation!r}"
        )
    if callable(job_type):
        return job()(job_type)
    if job_type is not None:
        validation.job_type(job_type)
    if queue is not None:
        validation.queue(queue)
    if priority is not None:
        validation.priority(priority)
    if max_attempts is not None:
        validation.max_attempts(max_attempts)
    timeout_seconds = (
        None if timeout is None else validation.seconds(timeout, "timeout", allow_zero=False)
    )
    if (
        retry_backoff is not None
        and not callable(retry_backoff)
        and not isinstance(retry_backoff, Backoff)
    ):
        raise JobRegistrationError("retry_backoff must be a Backoff or a callable(attempt)")
    if isinstance(unique_key, str):
        validation.unique_key(unique_key)
    elif unique_key is not None and not callable(unique_key):
        raise JobRegistrationError(
            f"unique_key must be a string, a callable(data) -> str | None, or None; "
            f"got {type(unique_key).__name__}"
        )
    unique_for_seconds = (
        None if unique_for is None else validation.unique_window(unique_for, "unique_for")
    )
    if concurrency is not None:
        _check_concurrency(concurrency)
    if concurrency_key is not None:
        _check_key("concurrency_key", concurrency_key, concurrency)
    if rate_key is not None:
        _check_key("rate_key", rate_key, rate_limit)
        if concurrency_key is not None and concurrency_key != rate_key:
            raise JobRegistrationError(
                "a job type has one key for its per-key limits: give concurrency_key and "
                f"rate_key the same payload path or function (got {concurrency_key!r} and "
                f"{rate_key!r}), or only one of them"
            )
    if schedule is not None:
        schedule = validate_cron(schedule)
    rate = None if rate_limit is None else parse_rate(rate_limit, "rate_limit")

    def decorate(func: Handler) -> JobDefinition:
        if not callable(func):
            raise JobRegistrationError(f"@job must decorate a function, got {func!r}")
        name = job_type or f"{func.__module__}.{func.__qualname__}"
        validation.job_type(name)
        if isolation == "process" and is_async_handler(func):
            raise JobRegistrationError(
                f"job type {name!r}: isolation='process' is for sync handlers; an async "
                "handler runs on the worker's event loop. Make it a def handler, or drop "
                "isolation"
            )
        if effectively_once and is_async_handler(func):
            raise JobRegistrationError(
                f"job type {name!r}: effectively_once=True needs a transaction, which an "
                "async handler does not run in. Drop effectively_once"
            )
        if atomic and is_async_handler(func):
            raise JobRegistrationError(
                f"job type {name!r}: atomic=True cannot apply to an async handler, "
                "because a Django transaction belongs to one thread and an async "
                "handler's queries run on others. Drop atomic, and put the writes that "
                "must commit together in a sync function decorated with "
                "@transaction.atomic, called with await sync_to_async(function)(...)"
            )
        return register(
            JobDefinition(
                func,
                job_type=name,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                timeout=timeout_seconds,
                retry_backoff=retry_backoff,
                atomic=not is_async_handler(func) if atomic is None else atomic,
                unique_key=unique_key,
                unique_for=unique_for_seconds,
                schedule=schedule,
                concurrency=concurrency,
                concurrency_key=concurrency_key,
                rate_limit=rate,
                rate_key=rate_key,
                isolation=isolation,
                effectively_once=effectively_once,
            )
        )

    return decorate
