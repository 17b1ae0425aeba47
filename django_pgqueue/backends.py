"""The Django Tasks backend: ``@task`` functions run as django-pgqueue jobs.

``TASKS = {"default": {"BACKEND": "django_pgqueue.backends.PgQueueBackend"}}`` makes
``my_task.enqueue(...)`` insert one job, on the caller's connection (so inside
``transaction.atomic`` it exists only if the transaction commits), which
``pgqueue_worker`` runs like any other. A task job has the job type
``"task:<the task's dotted path>"`` and the data
``{"args": [...], "kwargs": {...}, "backend": "<alias>"}`` (plus ``"run_after"`` when it
was deferred). Works with ``django.tasks`` (Django 6.0+) and with the ``django_tasks``
backport (Django 5.2).
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import dataclasses
import json
import logging
import re
import traceback
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from . import conf, schema, validation, waiting
from . import exceptions as pgqueue_exceptions
from .enqueue import enqueue as enqueue_job
from .exceptions import (
    CancelledJobError,
    FailJob,
    InvalidArgumentError,
    JobCancelled,
    JobFailedError,
    JobNotFoundError,
    JobSuspended,
    StepError,
    TaskReturnValueError,
)
from .options import Step
from .registry import JobDefinition
from .schema import TASK_JOB_PREFIX, JobStatus
from .tasks_compat import (
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from .worker.execution import refuse_awaitable

if TYPE_CHECKING:
    from .models import Job

__all__ = ["PgQueueBackend", "task_job"]

logger = logging.getLogger("django_pgqueue.tasks")

#: Our priority is ``PRIORITY_OFFSET + task.priority``: Django's -100..100 (default 0)
#: becomes 0..200 (default 100, the default of ``enqueue()`` too). Higher runs first in both.
PRIORITY_OFFSET = 100

#: How each job status reads as a task status. Cancelled jobs read as FAILED (they did
#: not succeed and will not run); a pending job waiting for a retry reads as READY.
STATUS_MAP: Mapping[str, str] = {
    JobStatus.WAITING: TaskResultStatus.READY,
    JobStatus.PENDING: TaskResultStatus.READY,
    JobStatus.CLAIMED: TaskResultStatus.RUNNING,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}

_OPTIONS = ("ATOMIC", "DATABASE", "MAX_ATTEMPTS", "TIMEOUT")


class PgQueueBackend(BaseTaskBackend):
    """Stores tasks as django-pgqueue jobs; ``manage.py pgqueue_worker`` runs them.

    Configured in ``TASKS``, with the ``OPTIONS`` ``DATABASE``, ``MAX_ATTEMPTS``,
    ``TIMEOUT`` and ``ATOMIC`` described [below](#options); code uses it through
    Django's Tasks API (``task.enqueue()``, ``get_result()``), which it implements.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        where = f"TASKS[{alias!r}]"
        if not isinstance(self.options, Mapping):
            raise InvalidTaskBackend(f"{where}['OPTIONS'] must be a dict")
        unknown = sorted(set(self.options) - set(_OPTIONS))
        if unknown:
            raise InvalidTaskBackend(
                f"{where}['OPTIONS'] has unknown keys {unknown}; valid keys are {list(_OPTIONS)}"
            )
        database = self.options.get("DATABASE")
        atomic = self.options.get("ATOMIC", True)
        if database is not None and (not isinstance(database, str) or not database):
            raise InvalidTaskBackend(f"{where}['OPTIONS']['DATABASE'] must be a database alias")
        if not isinstance(atomic, bool):
            raise InvalidTaskBackend(f"{where}['OPTIONS']['ATOMIC'] must be True or False")
        try:
            max_attempts = self.options.get("MAX_ATTEMPTS")
            self.max_attempts: int | None = (
                None
                if max_attempts is None
                else validation.max_attempts(max_attempts, f"{where}['OPTIONS']['MAX_ATTEMPTS']")
            )
            timeout = self.options.get("TIMEOUT")
            self.timeout: float | None = (
                None
                if timeout is None
                else validation.seconds(timeout, f"{where}['OPTIONS']['TIMEOUT']", allow_zero=False)
            )
            for queue in sorted(self.queues):
                validation.queue(queue, f"{where}['QUEUES']")
        except InvalidArgumentError as exc:
            raise InvalidTaskBackend(str(exc)) from None
        self._database: str | None = database
        self.atomic: bool = atomic

    @property
    def database(self) -> str:
        """The database alias of the jobs table."""
        return conf.jobs_database(self._database)

    def validate_task(self, task: Task[..., Any]) -> None:
        """Django's checks, a ``timedelta`` ``run_after``, and our limits on names."""
        run_after = task.run_after
        if isinstance(run_after, timedelta):
            # Django's own check calls timezone.is_aware() on it, which fails on a timedelta.
            super().validate_task(_WithoutRunAfter(task))
        elif run_after is not None and not isinstance(run_after, datetime):
            raise InvalidTask(
                f"run_after must be a datetime or a timedelta, got {type(run_after).__name__}."
            )
        else:
            super().validate_task(task)
        try:
            validation.job_type(TASK_JOB_PREFIX + task.module_path, "task")
        except InvalidArgumentError:
            raise InvalidTask(
                f"Task path {task.module_path!r} cannot name a django-pgqueue job: it must be "
                f"at most {schema.JOB_TYPE_MAX_LENGTH - len(TASK_JOB_PREFIX)} ASCII characters "
                "(letters, digits, '_' and '.')."
            ) from None
        try:
            validation.queue(task.queue_name, "queue_name")
        except InvalidArgumentError as exc:
            raise InvalidTask(str(exc)) from None

    def enqueue(
        self, task: Task[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult[Any]:
        """Insert the job for ``task(*args, **kwargs)`` and return its READY result.

        Arguments must be JSON (``TypeError`` otherwise, before anything is written).
        Inside ``transaction.atomic`` the job exists only if the transaction commits.
        """
        task, job_type, data, options = self._job(task, args, kwargs)
        job = enqueue_job(job_type, data, using=self.database, **options)
        result = _result_of(job, self.alias, task=task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def step(self, task: Task[..., Any], *args: Any, **kwargs: Any) -> Step:
        """``task(*args, **kwargs)`` as a step of a [workflow](../how-to/workflows.md).

        The Django Tasks API has no dependencies between tasks; this gives a task the
        place of a job in ``chain()``, ``group()`` and ``chord()``, with the job type,
        payload, queue, priority and run time ``enqueue()`` would give it:

        ```python
        backend = task_backends["default"]
        chain(backend.step(fetch, url), backend.step(parse)).enqueue(using=backend.database)
        ```

        Enqueue the workflow on this backend's database (``using=backend.database``
        when it is not ``PGQUEUE["DATABASE"]``). ``task_enqueued`` is not sent for
        steps; read their results with ``backend.get_result(str(job.id))``.
        """
        _task, job_type, data, options = self._job(task, args, kwargs)
        return Step(job_type, data, **options)

    def _job(
        self, task: Task[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[Task[..., Any], str, dict[str, Any], dict[str, Any]]:
        """The job of ``task(*args, **kwargs)``: the task (with a ``timedelta``
        ``run_after`` made a datetime), the job type, the payload and the options."""
        self.validate_task(task)
        _check_importable(task)
        data: dict[str, Any] = {
            "args": normalize_json(args),
            "kwargs": normalize_json(kwargs),
            "backend": self.alias,
        }
        run_after = task.run_after
        if isinstance(run_after, timedelta):
            run_after = timezone.now() + run_after
            task = _copy_task(task, run_after=run_after)
        if run_after is not None:
            data["run_after"] = run_after.isoformat()
            if timezone.is_naive(run_after):  # only accepted with USE_TZ = False
                run_after = timezone.make_aware(run_after)
        options = {
            "queue": task.queue_name,
            "priority": PRIORITY_OFFSET + int(task.priority),
            "run_at": run_after,
            "max_attempts": self.max_attempts,
        }
        return task, TASK_JOB_PREFIX + task.module_path, data, options

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The task's current result, read from its job; ``TaskResultDoesNotExist`` if none."""
        from .models import Job

        job_id = _job_id(result_id)
        job = (
            Job.objects.using(self.database)
            .filter(pk=job_id, job_type__startswith=TASK_JOB_PREFIX)
            .first()
        )
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        return _result_of(job, self.alias)

    def wait_for_result(
        self,
        result: TaskResult[Any] | str,
        timeout: float | timedelta | None = None,
        *,
        poll_interval: float | timedelta = waiting.DEFAULT_POLL_INTERVAL,
    ) -> TaskResult[Any]:
        """Block until the task has finished, and return its result, read afresh.

        Waits as [`Job.wait()`][django_pgqueue.models.Job.wait] does: woken by a
        notification when the task's job finishes, and reading its status every
        ``poll_interval`` seconds besides (so it also works behind PgBouncer), on a
        connection of its own. A retry in between does not end the wait: it ends when
        the task succeeded (``SUCCESSFUL``) or will not run again (``FAILED``, which a
        cancelled job reads as). The ``result`` given is not changed.

        ```python
        result = send_report.enqueue(report_id)
        ...  # after the transaction that enqueued it committed
        result = default_task_backend.wait_for_result(result, timeout=30)
        if result.status == TaskResultStatus.SUCCESSFUL:
            print(result.return_value)
        ```

        Args:
            result: A ``TaskResult`` of this backend, or its ``id``.
            timeout: Seconds (or a ``timedelta``) to wait at most, positive; ``None``:
                no limit.
            poll_interval: Seconds between reads of the status, positive.

        Raises:
            WaitTimeoutError: ``timeout`` passed first (also a ``TimeoutError``); the
                task goes on.
            TaskResultDoesNotExist: No task has that id here, or (its message says so)
                its job is not committed yet: wait after the transaction that enqueued it.
            InvalidArgumentError: For a bad ``timeout`` or ``poll_interval``.
        """
        result_id = _result_id(result)
        wait = waiting.waiting(_job_id(result_id), self.database, timeout, poll_interval)
        current = self.get_result(result_id)
        if current.is_finished:
            return current
        in_transaction = connections[self.database].in_atomic_block
        with _finished_either_way():
            waiting.wait_for(wait, in_transaction=in_transaction)
        return self.get_result(result_id)

    async def await_for_result(
        self,
        result: TaskResult[Any] | str,
        timeout: float | timedelta | None = None,
        *,
        poll_interval: float | timedelta = waiting.DEFAULT_POLL_INTERVAL,
    ) -> TaskResult[Any]:
        """[`wait_for_result()`][django_pgqueue.backends.PgQueueBackend.wait_for_result]
        for async code, with the same arguments, result and errors.

        It waits on an async connection of its own, so no thread is held while it
        waits; the result is read before and after the wait through ``aget_result()``.
        """
        result_id = _result_id(result)
        wait = waiting.waiting(_job_id(result_id), self.database, timeout, poll_interval)
        current = await self.aget_result(result_id)
        if current.is_finished:
            return current
        with _finished_either_way():
            await waiting.await_finish(wait, in_transaction=False)
        return await self.aget_result(result_id)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        yield from super().check(**kwargs)
        if not apps.is_installed("django_pgqueue"):
            yield checks.Error(
                f"TASKS[{self.alias!r}] uses PgQueueBackend, but django_pgqueue is not installed",
                hint="Add 'django_pgqueue' to INSTALLED_APPS and run manage.py migrate.",
                id="django_pgqueue.E101",
            )
        if self._database is not None and self._database not in settings.DATABASES:
            yield checks.Error(
                f"TASKS[{self.alias!r}]['OPTIONS']['DATABASE'] is {self._database!r}, which "
                "is not in DATABASES",
                hint=f"Use one of {sorted(settings.DATABASES)}.",
                id="django_pgqueue.E102",
            )


def _result_id(result: TaskResult[Any] | str) -> str:
    return result.id if isinstance(result, TaskResult) else str(result)


def _job_id(result_id: str) -> uuid.UUID:
    """The id of the job of a task result; ``TaskResultDoesNotExist`` if it is none."""
    try:
        return uuid.UUID(str(result_id))
    except ValueError:
        raise TaskResultDoesNotExist(result_id) from None


@contextlib.contextmanager
def _finished_either_way() -> Iterator[None]:
    """A wait for a task's result: its failure or cancellation is read from the result
    afterwards, not raised; a job that vanished is a result that does not exist."""
    try:
        yield
    except (JobFailedError, CancelledJobError):
        pass
    except JobNotFoundError as exc:
        raise TaskResultDoesNotExist(str(exc)) from exc


class _WithoutRunAfter:
    """A read-only view of a task with no ``run_after``, for Django's validation."""

    run_after = None

    def __init__(self, task: Task[..., Any]) -> None:
        self._task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)


def _copy_task(task: Task[..., Any], **changes: Any) -> Task[..., Any]:
    """``task`` with ``changes``, like ``task.using()`` but without validating it again:
    a stored task stays readable after ``QUEUES`` or a backend changed."""
    copy = object.__new__(type(task))
    for field in dataclasses.fields(task):
        value = changes[field.name] if field.name in changes else getattr(task, field.name)
        object.__setattr__(copy, field.name, value)
    return copy


def _check_importable(task: Task[..., Any]) -> None:
    # The worker finds the task by its dotted path: a Task kept under another name, or
    # defined in a function, could be enqueued but never run.
    try:
        found = import_string(task.module_path)
    except ImportError:
        found = None
    if getattr(found, "func", None) is not task.func:
        raise InvalidTask(
            f"Task {task.module_path!r} cannot be imported by that path, so a worker could "
            "not run it: apply @task to a module-level function and keep the result under "
            "the function's own name."
        )


def _import_task(path: str) -> Task[..., Any]:
    task = import_string(path)
    if not isinstance(task, Task):
        raise InvalidTask(f"{path!r} is not a Task (decorate the function with @task).")
    return task


def _task_of(job: Job, alias: str, task: Task[..., Any] | None = None) -> Task[..., Any]:
    """The task a job was enqueued with, rebuilt from its columns and data."""
    if task is None:
        path = job.job_type.removeprefix(TASK_JOB_PREFIX)
        try:
            task = _import_task(path)
        except Exception:
            # The result must stay readable: its errors say why the task did not run.
            task = _stand_in_task(path)
    run_after = job.data.get("run_after")
    return _copy_task(
        task,
        priority=max(TASK_MIN_PRIORITY, min(TASK_MAX_PRIORITY, job.priority - PRIORITY_OFFSET)),
        queue_name=job.queue,
        run_after=None if run_after is None else datetime.fromisoformat(run_after),
        backend=job.data.get("backend", alias),
    )


def _stand_in_task(path: str) -> Task[..., Any]:
    """A Task named ``path`` for the result of a task that does not import here.

    Built without validation, like ``_copy_task``: Django would refuse a task whose
    function cannot be imported, which is what this one stands for. Calling it raises.
    """

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise ImportError(f"the task {path!r} cannot be imported in this process")

    module, _, name = path.rpartition(".")
    unavailable.__module__, unavailable.__name__, unavailable.__qualname__ = module, name, name
    task = object.__new__(Task)
    for field in dataclasses.fields(Task):
        if field.name == "func":
            value: Any = unavailable
        elif field.default is not dataclasses.MISSING:
            value = field.default
        else:
            value = None
        object.__setattr__(task, field.name, value)
    return task


def _result_of(job: Job, alias: str, *, task: Task[..., Any] | None = None) -> TaskResult[Any]:
    """The ``TaskResult`` a job stands for; ``task`` is the enqueued task, if known."""
    data = job.data
    status = TaskResultStatus(STATUS_MAP[job.status])
    result: TaskResult[Any] = TaskResult(
        task=task if task is not None else _task_of(job, alias),
        id=str(job.id),
        status=status,
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.completed_at,
        last_attempted_at=job.started_at,
        args=data.get("args", []),
        kwargs=data.get("kwargs", {}),
        backend=data.get("backend", alias),
        errors=_errors_of(job),
        worker_ids=list(job.worker_ids),
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.result)
    return result


def _errors_of(job: Job) -> list[TaskError]:
    # A job keeps only its latest error, so at most one TaskError is known.
    if not job.last_error:
        return []
    return [
        TaskError(
            exception_class_path=_exception_class_path(job),
            traceback=job.last_traceback,
        )
    ]


def _exception_class_path(job: Job) -> str:
    """The dotted path of the class of a job's last error.

    The worker stores ``"ClassName: message"`` and the formatted traceback, whose last
    exception line reads ``module.ClassName: message`` (just ``ClassName`` for builtins).
    """
    name, sep, _ = job.last_error.partition(":")
    if not sep or not name.isidentifier():
        # A failure the worker recorded itself, such as a cancellation before the start.
        if job.status == JobStatus.CANCELLED:
            return f"{JobCancelled.__module__}.{JobCancelled.__qualname__}"
        return f"{pgqueue_exceptions.PgQueueError.__module__}.PgQueueError"
    line = re.compile(rf"^((?:[A-Za-z_]\w*\.)*){re.escape(name)}(?::|$)")
    for text in reversed(job.last_traceback.splitlines()):
        match = line.match(text)
        if match and match.group(1):
            return match.group(1) + name
        if match:
            break
    if hasattr(builtins, name):
        return f"builtins.{name}"
    if hasattr(pgqueue_exceptions, name):
        return f"{pgqueue_exceptions.__name__}.{name}"
    return name


# -- the worker side ---------------------------------------------------------------------


def resolve_task_job(job_type: str) -> JobDefinition | None:
    """The definition that runs task jobs of ``job_type`` (``"task:<dotted path>"``).

    A path that does not import here (a missing module, a module that fails to import,
    a name that is not a Task) still gets a definition: running it raises that real
    error, so the job's attempt fails with it and its traceback, is retried like any
    failure (the next attempt may reach a worker that has the code), and the
    ``TaskResult`` shows it. Never raises: the worker calls it for every job it starts.
    """
    path = job_type.removeprefix(TASK_JOB_PREFIX)
    try:
        task = _import_task(path)
    except Exception:
        logger.warning("cannot import the task of job type %r", job_type, exc_info=True)
        return _task_definition(job_type, timeout=None)
    timeout = None
    with contextlib.suppress(Exception):  # a broken TASKS entry must not stop the worker
        backend = task_backends[task.backend]
        if isinstance(backend, PgQueueBackend):
            timeout = backend.timeout
    return _task_definition(job_type, timeout=timeout)


def _task_definition(job_type: str, *, timeout: float | None) -> JobDefinition:
    return JobDefinition(
        run_task_job,
        job_type=job_type,
        queue=None,
        priority=None,
        max_attempts=None,
        timeout=timeout,
        retry_backoff=None,
        # run_task_job opens the transaction itself, so that task_finished is sent
        # outside it (a receiver's writes survive a failed attempt's rollback).
        atomic=False,
    )


#: The job whose task this thread (or task of the event loop) is running.
_running_job: contextvars.ContextVar[Job | None] = contextvars.ContextVar(
    "pgqueue_running_task_job", default=None
)


def task_job(context: TaskContext) -> Job:
    """The ``Job`` that runs a task, from its context: for [durable steps](../how-to/steps.md)
    (``job.step()``, ``job.sleep()``, ``job.wait_for_event()``) in a ``@task`` function.

    ```python
    from django.tasks import task
    from django_pgqueue.backends import task_job

    @task(takes_context=True)
    def checkout(context, order_id):
        job = task_job(context)
        charge = job.step("charge", payments.charge, order_id)
        job.step("receipt", mail.send_receipt, order_id, charge["id"])
    ```

    The Tasks API has no steps of its own, and its ``TaskContext`` carries only the
    task's result: this gives the job behind it. Give the backend
    ``"OPTIONS": {"ATOMIC": False}`` for tasks made of steps, as ``@job(atomic=False)``
    for handlers (see [Durable steps](../how-to/steps.md#jobs-made-of-steps-should-not-be-atomic)).

    Raises:
        StepError: ``context`` is not the context of a task this worker is running with
            django-pgqueue's backend.
    """
    job = _running_job.get()
    if job is None or str(job.id) != str(context.task_result.id):
        raise StepError(
            "task_job() takes the TaskContext of a task that django-pgqueue's backend is "
            "running now (a @task(takes_context=True) function, called by a worker)"
        )
    return job


def run_task_job(job: Job) -> Any:
    """Run a task job's task in the worker and return its JSON return value.

    Sends ``task_started`` before and ``task_finished`` after each attempt; the status
    in ``task_finished`` is SUCCESSFUL, FAILED (no attempt left), or READY (a retry is
    scheduled). Raises what the task raised, so the worker retries or fails the job.
    """
    task = _import_task(job.job_type.removeprefix(TASK_JOB_PREFIX))
    alias = job.data.get("backend", task.backend)
    backend = task_backends[alias]
    atomic = backend.atomic if isinstance(backend, PgQueueBackend) else True
    sender = type(backend)
    result = _result_of(job, alias, task=_task_of(job, alias, task))
    task_started.send(sender=sender, task_result=result)
    context = (TaskContext(task_result=result),) if task.takes_context else ()
    running = _running_job.set(job)
    try:
        with transaction.atomic(using=job._state.db) if atomic else contextlib.nullcontext():
            # task.call() runs an async def task itself; a coroutine returned by a
            # plain function would otherwise fail as a value that is not JSON, unclosed.
            returned = refuse_awaitable(task.call(*context, *result.args, **result.kwargs), job)
            value = _json_return_value(returned)
    except JobSuspended:
        raise  # a sleep or a wait: not finished, nothing to send
    except BaseException as exc:
        final = _is_last_attempt(job, exc)
        failed = dataclasses.replace(
            result,
            status=TaskResultStatus.FAILED if final else TaskResultStatus.READY,
            finished_at=timezone.now() if final else None,
            errors=[
                TaskError(
                    exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
                    traceback="".join(traceback.format_exception(exc)),
                )
            ],
        )
        # Sent robustly: a failing receiver must not replace the task's own error.
        task_finished.send_robust(sender=sender, task_result=failed)
        raise
    finally:
        _running_job.reset(running)
    succeeded = dataclasses.replace(
        result, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now()
    )
    object.__setattr__(succeeded, "_return_value", value)
    # The task's work is committed: a failing receiver must not make it run again.
    task_finished.send_robust(sender=sender, task_result=succeeded)
    return value


def _json_return_value(value: Any) -> Any:
    try:
        normalized = normalize_json(value)
        json.dumps(normalized, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TaskReturnValueError(
            f"the task returned a value that is not JSON ({exc}); return ids and plain "
            "values, not model instances or dates"
        ) from exc
    return normalized


def _is_last_attempt(job: Job, exc: BaseException) -> bool:
    # Mirrors the worker's decision, so task_finished tells FAILED from a coming retry.
    if isinstance(exc, FailJob | JobCancelled):
        return True
    with contextlib.suppress(Exception):
        if job.is_cancel_requested():
            return True
    return job.attempts >= job.max_attempts
