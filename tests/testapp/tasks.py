"""Django Tasks the test suite enqueues through ``django_pgqueue.backends.PgQueueBackend``."""

from datetime import datetime

from django.utils import timezone

from django_pgqueue import Snooze
from django_pgqueue.tasks_compat import TaskContext, task

from .models import Execution, Order


class TaskFailure(Exception):
    """An exception class defined outside builtins, to check its recorded dotted path."""


@task()
def noop(*args, **kwargs):
    return None


@task
def noop_from_bare_decorator(*args, **kwargs):
    return None


@task()
async def noop_async(*args, **kwargs):
    return None


@task()
def calculate_meaning_of_life():
    return 42


@task()
def add(a, b):
    return a + b


@task()
async def add_async(a, b):
    return a + b


@task()
def echo(*args, **kwargs):
    return {"args": args, "kwargs": kwargs}


@task()
def failing_value_error():
    raise ValueError("This task failed due to ValueError")


@task()
def failing_system_exit():
    raise SystemExit("This task failed due to SystemExit")


@task()
def failing_custom():
    raise TaskFailure("a custom failure")


@task()
def complex_exception():
    raise ValueError(ValueError("This task failed"))


@task()
def returns_datetime():
    return datetime(2025, 1, 1)


@task()
def create_order_then_fail(reference):
    Order.objects.create(reference=reference)
    raise RuntimeError("after the write")


@task(takes_context=True)
def get_task_id(context):
    return context.task_result.id


@task(takes_context=True)
def check_context(context, attempt):
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
    return {
        "attempt": context.attempt,
        "id": context.task_result.id,
        "status": str(context.task_result.status),
        "worker_ids": context.task_result.worker_ids,
    }


@task(takes_context=True)
def succeed_on_attempt(context, attempt):
    if context.attempt < attempt:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True)
def record(context, label):
    """Record the run (``worker_id`` holds the label), to check the order tasks ran in."""
    now = timezone.now()
    Execution.objects.create(
        job_id=context.task_result.id,
        worker_id=label,
        attempt=context.attempt,
        started_at=now,
        finished_at=now,
    )


async def _never_run():
    raise AssertionError("the coroutine's body ran")


@task()
def returns_coroutine():
    """A plain function returning a coroutine: the worker must fail it, not complete it."""
    return _never_run()


@task()
def snooze_for_a_minute():
    """Not ready yet: a Task raises ``Snooze`` as a handler does."""
    raise Snooze(60)


@task(takes_context=True)
def sum_of_dependencies(context: TaskContext):
    """Add up the results of the tasks it waited for (a step of a workflow)."""
    from django_pgqueue.models import Job

    job = Job.objects.get(pk=context.task_result.id)
    return sum(job.dependency_results().values())


@task(takes_context=True)
def stepped_checkout(context, order):
    """Durable steps in a task (``task_job``): the first attempt charges, then fails;
    the retry gets the charge from its checkpoint and waits for ``paid:<order>``."""
    from django_pgqueue.backends import task_job

    job = task_job(context)
    charge = job.step("charge", _charge, order)
    if context.attempt == 1:
        raise RuntimeError("the mail server is down")
    paid = job.wait_for_event(f"paid:{order}", timeout=60)
    return {"charge": charge, "paid": paid}


def _charge(order):
    now = timezone.now()
    Execution.objects.create(
        job_id=f"00000000-0000-0000-0000-{order:012d}",
        worker_id="charge",
        attempt=1,
        started_at=now,
        finished_at=now,
    )
    return f"ch_{order}"
