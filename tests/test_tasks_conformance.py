"""Conformance of the Tasks backend: the behaviours Django's own ``tests/tasks/`` checks.

Django's suite is tied to its Dummy and Immediate backends, so its checks are ported
here against the public Tasks API only (``task``, ``Task.enqueue``, ``get_result``,
``TaskResult``, the signals). The one backend-specific part is the ``run_tasks``
fixture, which runs every due task to its end (for django-pgqueue: a burst worker).

As Django's backends run a task once, the backend here is configured with
``MAX_ATTEMPTS: 1``; retries are checked in ``test_tasks_backend.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from django_pgqueue.models import Job
from django_pgqueue.tasks_compat import (
    DEFAULT_TASK_QUEUE_NAME,
    FRAMEWORK,
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    default_task_backend,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_pgqueue.worker import Worker
from tests.testapp import tasks as test_tasks

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_pgqueue.backends.PgQueueBackend"
WORKER_ID = "conformance-worker"


@pytest.fixture(autouse=True)
def tasks_settings(settings: Any) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "queue_1"],
            "OPTIONS": {"MAX_ATTEMPTS": 1},
        },
        "open": {"BACKEND": BACKEND, "QUEUES": [], "OPTIONS": {"MAX_ATTEMPTS": 1}},
        "missing": {"BACKEND": "does.not.exist"},
    }
    settings.USE_TZ = True


@pytest.fixture
def run_tasks() -> Callable[[], None]:
    """Run every due task to its end (the only backend-specific helper)."""

    def run() -> None:
        Worker(burst=True, concurrency=1, worker_id=WORKER_ID).run()

    return run


@pytest.fixture
def signals() -> Iterator[list[tuple[str, Any]]]:
    """Every task signal sent during the test, as ``(name, task_result)``."""
    received: list[tuple[str, Any]] = []
    receivers = {}
    for name, signal in (
        ("enqueued", task_enqueued),
        ("started", task_started),
        ("finished", task_finished),
    ):

        def receiver(sender: Any, task_result: Any, _name: str = name, **kwargs: Any) -> None:
            received.append((_name, task_result))

        signal.connect(receiver)
        receivers[signal] = receiver
    yield received
    for signal, receiver in receivers.items():
        signal.disconnect(receiver)


# -- backend and task definition ---------------------------------------------------------


def test_the_default_backend_is_pgqueue():
    from django_pgqueue.backends import PgQueueBackend

    assert isinstance(task_backends["default"], PgQueueBackend)
    assert task_backends["default"].alias == "default"
    assert default_task_backend.options == {"MAX_ATTEMPTS": 1}


def test_backend_declares_the_features_it_supports():
    backend = task_backends["default"]
    assert backend.supports_defer is True
    assert backend.supports_async_task is True
    assert backend.supports_get_result is True
    assert backend.supports_priority is True


def test_task_decorator_with_and_without_parentheses_makes_tasks():
    assert isinstance(test_tasks.noop, Task)
    assert isinstance(test_tasks.noop_async, Task)
    assert isinstance(test_tasks.noop_from_bare_decorator, Task)


def test_name_and_module_path():
    assert test_tasks.noop.name == "noop"
    assert test_tasks.noop.module_path == "tests.testapp.tasks.noop"
    assert import_string(test_tasks.noop.module_path) is test_tasks.noop


def test_a_builtin_is_not_a_valid_task():
    with pytest.raises(InvalidTask, match="Task function must be defined at a module level"):
        task()(any)


def test_a_nested_function_is_not_a_valid_task():
    def nested() -> None:
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task()(nested)


def test_takes_context_needs_a_first_argument_named_context():
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        task(takes_context=True)(test_tasks.calculate_meaning_of_life.func)


def test_run_after_cannot_be_given_to_the_decorator():
    with pytest.raises(TypeError):
        task(run_after=timezone.now())(test_tasks.calculate_meaning_of_life.func)


@pytest.mark.parametrize("priority", [TASK_MIN_PRIORITY - 1, TASK_MAX_PRIORITY + 1, 3.1])
def test_priority_must_be_a_whole_number_from_minus_100_to_100(priority):
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        test_tasks.noop.using(priority=priority)


@pytest.mark.parametrize("priority", [TASK_MIN_PRIORITY, 0, TASK_MAX_PRIORITY])
def test_priorities_at_the_bounds_are_valid(priority):
    assert test_tasks.noop.using(priority=priority).priority == priority


def test_using_returns_a_new_task_and_leaves_the_original_alone():
    now = timezone.now()
    changed = test_tasks.noop.using(priority=10).using(run_after=now, queue_name="queue_1")
    assert (changed.priority, changed.run_after, changed.queue_name) == (10, now, "queue_1")
    assert test_tasks.noop.priority == 0
    assert test_tasks.noop.run_after is None
    assert test_tasks.noop.queue_name == DEFAULT_TASK_QUEUE_NAME
    assert test_tasks.noop.using() == test_tasks.noop
    assert test_tasks.noop.using() is not test_tasks.noop


def test_a_naive_run_after_is_rejected_when_use_tz_is_on():
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        test_tasks.noop.using(run_after=datetime.now())


def test_a_naive_run_after_is_accepted_when_use_tz_is_off(settings):
    settings.USE_TZ = False
    naive = datetime.now() + timedelta(hours=1)
    assert test_tasks.noop.using(run_after=naive).run_after == naive


def test_run_after_accepts_a_timedelta():
    # Django's documentation allows it; its validation calls is_aware() on it and fails.
    assert test_tasks.noop.using(run_after=timedelta(minutes=5)).run_after == timedelta(minutes=5)


def test_queue_name_must_be_one_of_the_backend_queues():
    with pytest.raises(InvalidTask, match="Queue 'queue-2' is not valid for backend"):
        test_tasks.noop.using(queue_name="queue-2")


def test_empty_queues_accept_any_queue_name():
    assert test_tasks.noop.using(queue_name="queue-2", backend="open").queue_name == "queue-2"


def test_queue_name_is_validated_again_on_enqueue(settings):
    other_queue = test_tasks.noop.using(queue_name="queue_1")
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["queue-1"]}}
    with pytest.raises(InvalidTask, match="Queue 'queue_1' is not valid for backend"):
        other_queue.enqueue()
    with pytest.raises(InvalidTask, match="Queue 'queue_1' is not valid for backend"):
        async_to_sync(other_queue.aenqueue)()
    assert not Job.objects.exists()


def test_an_unknown_backend_alias_is_rejected():
    with pytest.raises(InvalidTaskBackend, match="The connection 'unknown' doesn't exist"):
        test_tasks.noop.using(backend="unknown")


def test_a_backend_that_cannot_be_imported_is_rejected():
    with pytest.raises(InvalidTaskBackend, match=r"Could not find backend 'does\.not\.exist'"):
        test_tasks.noop.using(backend="missing")


def test_no_backend_configured(settings):
    settings.TASKS = {}
    with pytest.raises(InvalidTaskBackend):
        test_tasks.noop.enqueue()


# -- enqueue -------------------------------------------------------------------------------


def test_enqueue_returns_a_ready_result():
    result = test_tasks.noop.enqueue(1, two=3)

    assert result.status == TaskResultStatus.READY
    assert result.is_finished is False
    assert result.task == test_tasks.noop
    assert (result.args, result.kwargs) == ([1], {"two": 3})
    assert result.started_at is None
    assert result.finished_at is None
    assert result.last_attempted_at is None
    assert result.enqueued_at is not None
    assert result.errors == []
    assert result.worker_ids == []
    assert result.attempts == 0
    assert result.backend == "default"
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018


def test_result_ids_are_strings_of_at_most_64_characters():
    result = test_tasks.noop.enqueue()
    assert isinstance(result.id, str)
    assert 0 < len(result.id) <= 64


def test_aenqueue_returns_a_ready_result():
    result = async_to_sync(test_tasks.noop.aenqueue)()

    assert result.status == TaskResultStatus.READY
    assert result.task == test_tasks.noop
    assert (result.args, result.kwargs) == ([], {})


def test_enqueue_sends_task_enqueued(signals):
    result = test_tasks.noop.enqueue()
    assert signals == [("enqueued", result)]


@pytest.mark.parametrize("argument", [datetime(2025, 1, 1), object(), {1, 2}])
def test_arguments_that_are_not_json_raise_type_error_and_write_nothing(argument):
    with pytest.raises(TypeError, match="Unsupported type"):
        test_tasks.noop.enqueue(argument)
    with pytest.raises(TypeError, match="Unsupported type"):
        test_tasks.noop.enqueue(key=argument)
    with pytest.raises(TypeError, match="Unsupported type"):
        async_to_sync(test_tasks.noop.aenqueue)(argument)
    assert not Job.objects.exists()


def test_tuples_become_lists():
    result = test_tasks.noop.enqueue((1, 2), key=(3,))
    assert (result.args, result.kwargs) == ([[1, 2]], {"key": [3]})


def test_enqueue_inside_a_rolled_back_transaction_leaves_no_task():
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        result = test_tasks.noop.enqueue()
        assert test_tasks.noop.get_result(result.id).status == TaskResultStatus.READY
        raise Rollback
    with pytest.raises(TaskResultDoesNotExist):
        test_tasks.noop.get_result(result.id)


# -- results -------------------------------------------------------------------------------


def test_get_result_returns_the_enqueued_result():
    result = default_task_backend.enqueue(test_tasks.noop, (), {})
    assert test_tasks.noop.get_result(result.id) == result
    assert default_task_backend.get_result(result.id) == result


def test_get_result_of_a_deferred_prioritised_task_in_another_queue():
    deferred = test_tasks.noop.using(
        priority=7, queue_name="queue_1", run_after=timezone.now() + timedelta(hours=1)
    )
    result = deferred.enqueue("x")
    assert test_tasks.noop.get_result(result.id) == result
    assert result.task == deferred


def test_aget_result_returns_the_enqueued_result():
    result = async_to_sync(default_task_backend.aenqueue)(test_tasks.noop, (), {})
    assert async_to_sync(test_tasks.noop.aget_result)(result.id) == result
    assert async_to_sync(default_task_backend.aget_result)(result.id) == result


@pytest.mark.parametrize("result_id", ["123", "5f1d7c8e-0000-4000-8000-000000000000", ""])
def test_an_unknown_result_id_raises_task_result_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        test_tasks.noop.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(test_tasks.noop.aget_result)(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)


def test_get_result_of_another_task_raises_task_result_mismatch():
    result = default_task_backend.enqueue(test_tasks.noop_async, (), {})
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        test_tasks.noop.get_result(result.id)
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        async_to_sync(test_tasks.noop.aget_result)(result.id)


def test_refresh_of_an_unchanged_result_changes_nothing():
    result = test_tasks.noop.enqueue()
    before = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == before
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == before


def test_refresh_reads_what_the_worker_did(run_tasks):
    result = test_tasks.calculate_meaning_of_life.enqueue()
    run_tasks()
    assert result.status == TaskResultStatus.READY
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


@pytest.mark.skipif(
    FRAMEWORK != "django.tasks" or django.VERSION < (6, 1),
    reason="only Django 6.1's Task can be pickled (not 6.0's, nor the backport's)",
)
def test_a_result_pickles():
    result = test_tasks.noop.enqueue()
    assert pickle.loads(pickle.dumps(result)) == result


# -- running -------------------------------------------------------------------------------


@pytest.mark.parametrize("task_", [test_tasks.noop, test_tasks.noop_async], ids=["sync", "async"])
def test_a_task_runs_to_success(run_tasks, task_):
    enqueued = task_.enqueue(1, two=3)
    run_tasks()
    result = task_.get_result(enqueued.id)

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished is True
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at
    assert result.return_value is None
    assert result.task == task_
    assert (result.args, result.kwargs) == ([1], {"two": 3})
    assert result.attempts == 1
    assert result.worker_ids == [WORKER_ID]
    assert result.errors == []


def test_return_value_is_read_back(run_tasks):
    result = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, [], {})
    run_tasks()
    result.refresh()
    assert result.return_value == 42


def test_return_value_of_an_async_task(run_tasks):
    result = test_tasks.add_async.enqueue(40, 2)
    run_tasks()
    assert test_tasks.add_async.get_result(result.id).return_value == 42


def test_return_values_are_json_normalised(run_tasks):
    result = test_tasks.echo.enqueue(1, "two", [3.5], flag=True, nothing=None)
    run_tasks()
    assert test_tasks.echo.get_result(result.id).return_value == {
        "args": [1, "two", [3.5]],
        "kwargs": {"flag": True, "nothing": None},
    }


@pytest.mark.parametrize(
    ("task_", "exception", "message"),
    [
        (test_tasks.failing_value_error, ValueError, "This task failed due to ValueError"),
        (test_tasks.failing_system_exit, SystemExit, "This task failed due to SystemExit"),
    ],
    ids=["ValueError", "SystemExit"],
)
def test_an_exception_fails_the_task_with_its_class_and_traceback(
    run_tasks, task_, exception, message
):
    enqueued = task_.enqueue()
    run_tasks()
    result = task_.get_result(enqueued.id)

    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished is True
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at >= result.started_at >= result.enqueued_at
    assert len(result.errors) == 1
    assert result.errors[0].exception_class is exception
    assert result.errors[0].traceback.endswith(f"{exception.__name__}: {message}\n")
    assert result.task == task_
    assert (result.args, result.kwargs) == ([], {})


def test_an_exception_class_outside_builtins_is_recorded_by_its_dotted_path(run_tasks):
    enqueued = test_tasks.failing_custom.enqueue()
    run_tasks()
    error = test_tasks.failing_custom.get_result(enqueued.id).errors[0]
    assert error.exception_class_path == "tests.testapp.tasks.TaskFailure"
    assert error.exception_class is test_tasks.TaskFailure


def test_a_complex_exception(run_tasks):
    enqueued = test_tasks.complex_exception.enqueue()
    run_tasks()
    result = test_tasks.complex_exception.get_result(enqueued.id)

    assert result.status == TaskResultStatus.FAILED
    assert result._return_value is None
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback


def test_a_return_value_that_is_not_json_fails_the_task(run_tasks):
    enqueued = test_tasks.returns_datetime.enqueue()
    run_tasks()
    result = test_tasks.returns_datetime.get_result(enqueued.id)

    assert result.status == TaskResultStatus.FAILED
    assert result._return_value is None
    assert issubclass(result.errors[0].exception_class, TypeError)
    assert "Unsupported type" in result.errors[0].traceback


def test_a_task_taking_context_gets_its_result_id(run_tasks):
    enqueued = test_tasks.get_task_id.enqueue()
    run_tasks()
    assert test_tasks.get_task_id.get_result(enqueued.id).return_value == enqueued.id


def test_task_context_attempt_counts_from_one(run_tasks):
    enqueued = test_tasks.check_context.enqueue(1)
    run_tasks()
    result = test_tasks.check_context.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {
        "attempt": 1,
        "id": enqueued.id,
        "status": TaskResultStatus.RUNNING,
        "worker_ids": [WORKER_ID],
    }


def test_status_goes_ready_running_successful_with_signals(run_tasks, signals):
    enqueued = test_tasks.calculate_meaning_of_life.enqueue()
    run_tasks()

    assert [(name, result.status) for name, result in signals] == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]
    assert {result.id for _, result in signals} == {enqueued.id}
    started, finished = signals[1][1], signals[2][1]
    assert started.started_at is not None
    assert started.worker_ids == [WORKER_ID]
    assert finished.return_value == 42
    assert finished.finished_at >= finished.started_at


def test_status_goes_ready_running_failed_with_signals(run_tasks, signals):
    enqueued = test_tasks.failing_value_error.enqueue()
    run_tasks()

    assert [(name, result.status) for name, result in signals] == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.FAILED),
    ]
    failed = signals[2][1]
    assert failed.id == enqueued.id
    assert failed.errors[0].exception_class is ValueError
    assert failed.finished_at is not None


def test_running_and_finishing_are_logged_by_the_framework(run_tasks, caplog):
    logger_name = "django.tasks" if FRAMEWORK == "django.tasks" else "django_tasks"
    with caplog.at_level(logging.DEBUG, logger=logger_name):
        ok = test_tasks.noop.enqueue()
        failed = test_tasks.failing_value_error.enqueue()
        run_tasks()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == logger_name]
    assert any(ok.id in text and "enqueued" in text for _, text in lines)
    assert any(ok.id in text and "state=RUNNING" in text for _, text in lines)
    assert any(ok.id in text and "state=SUCCESSFUL" in text for _, text in lines)
    assert any(
        level == logging.ERROR and failed.id in text and "state=FAILED" in text
        for level, text in lines
    )


def test_higher_priority_tasks_run_first(run_tasks):
    from tests.testapp.models import Execution

    test_tasks.record.using(priority=-50).enqueue("low")
    test_tasks.record.enqueue("default")
    test_tasks.record.using(priority=50).enqueue("high")
    test_tasks.record.using(priority=TASK_MAX_PRIORITY).enqueue("highest")
    test_tasks.record.using(priority=TASK_MIN_PRIORITY).enqueue("lowest")
    run_tasks()
    assert list(Execution.objects.order_by("id").values_list("worker_id", flat=True)) == [
        "highest",
        "high",
        "default",
        "low",
        "lowest",
    ]


@pytest.mark.parametrize(
    "run_after",
    [lambda: timezone.now() + timedelta(seconds=2), lambda: timedelta(seconds=2)],
    ids=["datetime", "timedelta"],
)
def test_a_deferred_task_waits_for_run_after(run_tasks, run_after):
    enqueued = test_tasks.noop.using(run_after=run_after()).enqueue()
    assert isinstance(enqueued.task.run_after, datetime)
    run_tasks()
    assert test_tasks.noop.get_result(enqueued.id).status == TaskResultStatus.READY

    deadline = enqueued.task.run_after
    time.sleep(max((deadline - timezone.now()).total_seconds(), 0) + 0.05)
    run_tasks()
    result = test_tasks.noop.get_result(enqueued.id)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.started_at >= deadline
