"""The Django Tasks backend as django-pgqueue sees it: the job rows it writes, the
worker running them (retries, atomicity, timeouts), options, checks and the registry
hook. The framework-level behaviours are in ``test_tasks_conformance.py``."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from django_pgqueue import InvalidJobError, chain, chord, emit_event, job, registry
from django_pgqueue.backends import PRIORITY_OFFSET, PgQueueBackend, resolve_task_job, task_job
from django_pgqueue.exceptions import JobRegistrationError, StepError
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.tasks_compat import (
    InvalidTask,
    InvalidTaskBackend,
    TaskContext,
    TaskResultStatus,
    default_task_backend,
    task,
    task_backends,
    task_finished,
)
from django_pgqueue.worker import Worker
from tests.testapp import tasks as test_tasks
from tests.testapp.models import Execution, Order
from tests.workers import WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = "django_pgqueue.backends.PgQueueBackend"


def configure(settings: Any, queues: list[str] | None = None, **options: Any) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "tasks-other"] if queues is None else queues,
            "OPTIONS": options,
        }
    }


def run_due(worker_id: str = "w") -> Worker:
    worker = Worker(burst=True, concurrency=1, worker_id=worker_id)
    worker.run()
    return worker


def run_until_finished(result: Any, timeout: float = 10) -> Any:
    """Run burst workers until the task finished, waiting out retry backoffs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run_due()
        result.refresh()
        if result.is_finished:
            return result
        time.sleep(0.05)
    raise AssertionError(f"task {result.id} did not finish within {timeout}s")


def plain_function() -> None:
    pass


#: A Task kept under another name than its function's: a worker could not import it.
renamed_task = task()(plain_function)

#: A module-level lambda is valid for Django, but "<lambda>" cannot be imported.
module_lambda = lambda: None  # noqa: E731


# -- the job a task becomes ------------------------------------------------------------


def test_enqueue_writes_one_job_named_by_the_task_path(django_assert_num_queries):
    with django_assert_num_queries(1):
        result = test_tasks.add.enqueue(1, b=2)

    job = Job.objects.get()
    assert str(job.id) == result.id
    assert job.job_type == "task:tests.testapp.tasks.add"
    assert job.status == JobStatus.PENDING
    assert job.queue == "default"
    assert job.priority == 100
    assert job.data == {"args": [1], "kwargs": {"b": 2}, "backend": "default"}
    assert job.max_attempts == 3  # PGQUEUE['DEFAULT_MAX_ATTEMPTS']
    assert job.run_at <= timezone.now()


@pytest.mark.parametrize(("django_priority", "ours"), [(-100, 0), (-1, 99), (0, 100), (100, 200)])
def test_priority_maps_onto_ours_by_adding_100(django_priority, ours):
    test_tasks.noop.using(priority=django_priority).enqueue()
    assert Job.objects.get().priority == ours == PRIORITY_OFFSET + django_priority


def test_tasks_and_jobs_share_one_priority_order():
    from django_pgqueue import enqueue

    below = enqueue("tests.noop", priority=99)
    task_job = test_tasks.noop.enqueue()  # priority 0 -> 100
    above = enqueue("tests.noop", priority=101)
    run_due()
    order = list(Job.objects.order_by("started_at").values_list("id", flat=True))
    assert [str(job_id) for job_id in order] == [str(above.id), task_job.id, str(below.id)]


def test_queue_name_becomes_the_job_queue():
    test_tasks.noop.using(queue_name="tasks-other").enqueue()
    assert Job.objects.get().queue == "tasks-other"


def test_run_after_becomes_run_at_and_is_kept_in_data():
    when = timezone.now() + timedelta(hours=2)
    result = test_tasks.noop.using(run_after=when).enqueue()
    job = Job.objects.get()
    assert job.run_at == when
    assert job.data["run_after"] == when.isoformat()
    assert result.task.run_after == when


def test_a_timedelta_run_after_is_counted_from_enqueue():
    before = timezone.now()
    result = test_tasks.noop.using(run_after=timedelta(minutes=10)).enqueue()
    job = Job.objects.get()
    assert before + timedelta(minutes=10) <= job.run_at <= timezone.now() + timedelta(minutes=10)
    assert result.task.run_after == job.run_at
    assert test_tasks.noop.get_result(result.id) == result


def test_a_naive_run_after_without_use_tz_is_local_time(settings):
    settings.USE_TZ = False
    settings.TIME_ZONE = "Europe/Paris"
    local = datetime.now(ZoneInfo("Europe/Paris")) + timedelta(hours=1)
    naive = local.replace(tzinfo=None)
    result = test_tasks.noop.using(run_after=naive).enqueue()
    job = Job.objects.get()
    assert job.run_at == naive  # USE_TZ = False reads datetimes back naive, in local time
    assert test_tasks.noop.get_result(result.id).task.run_after == naive


def test_max_attempts_option(settings):
    configure(settings, MAX_ATTEMPTS=7)
    test_tasks.noop.enqueue()
    assert Job.objects.get().max_attempts == 7


def test_database_option_names_the_jobs_database(settings):
    configure(settings, DATABASE="default")
    result = test_tasks.noop.enqueue()
    assert task_backends["default"].database == "default"
    assert test_tasks.noop.get_result(result.id).id == result.id


def test_enqueue_is_part_of_the_callers_transaction(other_connection):
    with transaction.atomic():
        Order.objects.create(reference="A-1")
        result = test_tasks.noop.enqueue()
        seen = other_connection.execute(
            "SELECT count(*) FROM pgqueue_jobs WHERE id = %s", [result.id]
        ).fetchone()
        assert seen == (0,)
    seen = other_connection.execute(
        "SELECT count(*) FROM pgqueue_jobs WHERE id = %s", [result.id]
    ).fetchone()
    assert seen == (1,)


def test_non_json_arguments_write_nothing():
    with pytest.raises(TypeError, match="Unsupported type"):
        test_tasks.noop.enqueue(timezone.now())
    with pytest.raises(InvalidJobError, match="JSON"):
        test_tasks.noop.enqueue(math.nan)
    assert not Job.objects.exists()


def test_arguments_over_the_payload_limit_write_nothing(pgqueue_settings):
    pgqueue_settings(MAX_PAYLOAD_BYTES=100)
    with pytest.raises(InvalidJobError, match="MAX_PAYLOAD_BYTES"):
        test_tasks.noop.enqueue("x" * 200)
    assert not Job.objects.exists()


def test_a_task_not_importable_by_its_path_is_rejected_on_enqueue():
    with pytest.raises(InvalidTask, match="cannot be imported by that path"):
        renamed_task.enqueue()
    assert not Job.objects.exists()


def test_a_module_level_lambda_is_rejected():
    with pytest.raises(InvalidTask, match="cannot name a django-pgqueue job"):
        task()(module_lambda)


def test_run_after_of_another_type_is_rejected():
    with pytest.raises(InvalidTask, match="run_after must be a datetime or a timedelta"):
        test_tasks.noop.using(run_after=60)


def test_a_queue_name_we_cannot_store_is_rejected(settings):
    configure(settings, queues=[])
    with pytest.raises(InvalidTask, match="queue_name"):
        test_tasks.noop.using(queue_name="has spaces")


# -- the worker running task jobs ---------------------------------------------------------


def test_a_task_run_by_the_worker_stores_its_return_value():
    result = test_tasks.add.enqueue(40, 2)
    run_due(worker_id="w-1")

    job = Job.objects.get()
    assert job.status == JobStatus.COMPLETED
    assert job.result == 42
    assert job.worker_ids == ["w-1"]
    assert test_tasks.add.get_result(result.id).return_value == 42


def test_task_jobs_run_in_a_pgqueue_worker_process():
    result = test_tasks.add.enqueue(2, 3)
    process = WorkerProcess("--burst", "--worker-id", "proc-1")
    try:
        assert process.wait() == 0, process.output()
    finally:
        process.stop()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.worker_ids == ["proc-1"]


def test_a_failing_task_is_retried_per_the_retry_settings_then_succeeds():
    result = test_tasks.succeed_on_attempt.enqueue(3)

    run_due(worker_id="w-1")
    result.refresh()
    assert result.status == TaskResultStatus.READY  # waiting for its retry
    assert result.attempts == 1
    assert result.finished_at is None
    assert result.errors[0].exception_class is RuntimeError
    assert "attempt 1 fails" in result.errors[0].traceback

    run_until_finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.attempts == 3
    assert len(result.worker_ids) == 3
    assert "attempt 2 fails" in result.errors[0].traceback  # the latest error is kept


def test_a_task_that_snoozes_waits_without_spending_an_attempt():
    result = test_tasks.snooze_for_a_minute.enqueue()

    run_due()

    result.refresh()
    job = Job.objects.get(pk=result.id)
    assert result.status == TaskResultStatus.READY
    assert (result.attempts, result.errors) == (0, [])
    assert (job.status, job.snoozes) == (JobStatus.PENDING, 1)
    assert (job.run_at - job.claimed_at).total_seconds() >= 60


def test_a_task_runs_durable_steps_through_task_job(settings):
    configure(settings, ATOMIC=False)
    result = test_tasks.stepped_checkout.enqueue(5)

    run_due()  # attempt 1: charges, then fails
    Job.objects.filter(pk=result.id).run_now()  # its retry, without the backoff
    run_due()  # attempt 2: the charge from its checkpoint; waits for the event
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.attempts == 1
    assert Job.objects.get(pk=result.id).status == JobStatus.PENDING

    emit_event("paid:5", {"amount": 12})
    run_until_finished(result)

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"charge": "ch_5", "paid": {"amount": 12}}
    assert Execution.objects.filter(worker_id="charge").count() == 1


def test_task_job_refuses_a_context_it_is_not_running():
    context = TaskContext(task_result=test_tasks.noop.enqueue())
    with pytest.raises(StepError, match="takes the TaskContext of a task"):
        task_job(context)


def test_a_task_that_keeps_failing_fails_after_max_attempts(settings):
    configure(settings, MAX_ATTEMPTS=2)
    result = test_tasks.failing_value_error.enqueue()
    run_until_finished(result)

    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2
    job = Job.objects.get()
    assert job.status == JobStatus.FAILED
    assert job.last_error == "ValueError: This task failed due to ValueError"
    assert job.last_traceback == result.errors[0].traceback


def test_a_task_returning_a_coroutine_fails_and_never_succeeds(settings):
    configure(settings, MAX_ATTEMPTS=2)
    result = test_tasks.returns_coroutine.enqueue()
    run_until_finished(result)

    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2
    job = Job.objects.get()
    assert job.status == JobStatus.FAILED
    assert job.last_error.startswith(
        "AsyncHandlerError: the handler of job type "
        "'task:tests.testapp.tasks.returns_coroutine' returned an awaitable "
        "(coroutine _never_run) instead of doing its work. Declare the handler with async def"
    )


def test_task_finished_reports_ready_while_a_retry_is_coming(settings):
    configure(settings, MAX_ATTEMPTS=2)
    statuses = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        statuses.append(task_result.status)

    task_finished.connect(receiver)
    try:
        run_until_finished(test_tasks.failing_value_error.enqueue())
    finally:
        task_finished.disconnect(receiver)
    assert statuses == [TaskResultStatus.READY, TaskResultStatus.FAILED]


def test_an_attempt_runs_in_a_transaction_by_default():
    test_tasks.create_order_then_fail.enqueue("A-1")
    run_due()
    assert not Order.objects.exists()


def test_atomic_false_keeps_the_writes_of_a_failed_attempt(settings):
    configure(settings, ATOMIC=False, MAX_ATTEMPTS=1)
    test_tasks.create_order_then_fail.enqueue("A-1")
    run_due()
    assert Order.objects.filter(reference="A-1").exists()


def test_task_finished_receivers_write_outside_the_rolled_back_attempt(settings):
    configure(settings, MAX_ATTEMPTS=1)

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        Order.objects.create(reference=f"{task_result.status}")

    task_finished.connect(receiver)
    try:
        test_tasks.create_order_then_fail.enqueue("A-1")
        run_due()
    finally:
        task_finished.disconnect(receiver)
    assert list(Order.objects.values_list("reference", flat=True)) == ["FAILED"]


def test_timeout_option_bounds_an_attempt(settings):
    configure(settings, TIMEOUT=0.5)
    definition = resolve_task_job("task:tests.testapp.tasks.noop")
    assert definition is not None
    assert definition.timeout == 0.5


def test_a_cancelled_task_reads_as_failed_without_errors():
    result = test_tasks.noop.enqueue()
    Job.objects.get(pk=result.id).cancel()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors == []
    assert result.finished_at is not None


def test_a_task_the_worker_cannot_import_fails_its_job_with_the_real_error(make_job):
    job = make_job(
        job_type="task:tests.testapp.tasks.does_not_exist",
        data={"args": [], "kwargs": {}, "backend": "default"},
        max_attempts=1,
    )
    run_due()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.last_error.startswith("ImportError: ")
    assert 'does not define a "does_not_exist"' in job.last_error
    assert "import_string" in job.last_traceback


def test_a_task_whose_module_fails_to_import_keeps_that_error_on_its_job_and_result(make_job):
    job = make_job(
        job_type="task:tests.testapp.broken_tasks.send_report",
        data={"args": [1], "kwargs": {}, "backend": "default"},
        max_attempts=1,
    )
    run_due()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.last_error == (
        "ModuleNotFoundError: No module named 'a_dependency_that_is_not_installed'"
    )
    assert "broken_tasks.py" in job.last_traceback

    result = default_task_backend.get_result(str(job.id))

    assert result.status == TaskResultStatus.FAILED
    assert result.task.module_path == "tests.testapp.broken_tasks.send_report"
    assert result.args == [1]
    (error,) = result.errors
    assert error.exception_class_path == "builtins.ModuleNotFoundError"
    assert "a_dependency_that_is_not_installed" in error.traceback
    assert "broken_tasks.py" in error.traceback


def test_a_task_that_cannot_be_imported_is_retried_like_any_failure(make_job):
    job = make_job(
        job_type="task:no.such.module.task",
        data={"args": [], "kwargs": {}, "backend": "default"},
        max_attempts=3,
    )
    run_due()
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert job.attempts == 1
    assert job.last_error == "ModuleNotFoundError: No module named 'no'"


# -- registry, options and checks ---------------------------------------------------------


def test_the_registry_resolves_task_job_types():
    definition = registry.find_definition("task:tests.testapp.tasks.add")
    assert definition is not None
    assert definition.job_type == "task:tests.testapp.tasks.add"
    assert registry.get_definition("task:tests.testapp.tasks.add").job_type == definition.job_type
    assert "task:tests.testapp.tasks.add" not in registry.registered_job_types()


@pytest.mark.parametrize(
    ("job_type", "error"),
    [
        ("task:tests.testapp.tasks.Execution", InvalidTask),  # not a Task
        ("task:no.such.module", ModuleNotFoundError),
    ],
)
def test_a_task_job_type_that_does_not_import_runs_into_its_real_error(job_type, error):
    definition = registry.find_definition(job_type)

    assert definition is not None
    with pytest.raises(error):
        definition(Job(job_type=job_type, data={"args": [], "kwargs": {}}))


def test_job_types_starting_with_task_are_reserved(clean_registry):
    with pytest.raises(JobRegistrationError, match="reserved"):

        @job("task:mine")
        def mine(job: Job) -> None:
            pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"RETRIES": 3}, "unknown keys"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"TIMEOUT": 0}, "TIMEOUT"),
        ({"ATOMIC": "yes"}, "ATOMIC"),
        ({"DATABASE": ""}, "DATABASE"),
    ],
)
def test_invalid_options_are_reported_with_the_alias(options, message):
    with pytest.raises(InvalidTaskBackend, match=message):
        PgQueueBackend("default", {"OPTIONS": options})


def test_queue_names_we_cannot_store_are_rejected():
    with pytest.raises(InvalidTaskBackend, match="QUEUES"):
        PgQueueBackend("default", {"QUEUES": ["default", "two words"]})


def test_check_reports_an_unknown_database():
    backend = PgQueueBackend("default", {"OPTIONS": {"DATABASE": "nope"}})
    assert [message.id for message in backend.check()] == ["django_pgqueue.E102"]


def test_check_reports_a_missing_app(monkeypatch):
    from django_pgqueue import backends

    monkeypatch.setattr(backends.apps, "is_installed", lambda name: name != "django_pgqueue")
    assert [message.id for message in task_backends["default"].check()] == ["django_pgqueue.E101"]


def test_check_passes_when_configured():
    assert list(task_backends["default"].check()) == []


def test_the_admin_shows_a_task_job_by_its_dotted_path(client):
    from django.contrib import admin

    assert Job in admin.site._registry  # the app registers its admin with django.contrib.admin
    test_tasks.add.enqueue(1, 2)
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    response = client.get(reverse("admin:django_pgqueue_job_changelist"))
    assert response.status_code == 200
    assert "tests.testapp.tasks.add" in response.content.decode()


def test_tasks_run_as_steps_of_a_workflow(settings):
    configure(settings)
    backend = task_backends["default"]
    first = backend.step(test_tasks.add, 1, 2)
    second = backend.step(test_tasks.add.using(priority=10), 3, b=4)

    workflow = chain(first, second).enqueue(using=backend.database)

    head, tail = workflow.jobs
    assert (head.status, tail.status) == (JobStatus.PENDING, JobStatus.WAITING)
    assert tail.priority == PRIORITY_OFFSET + 10
    run_due()
    results = [backend.get_result(str(job.id)) for job in workflow.jobs]
    assert [(result.status, result.return_value) for result in results] == [
        (TaskResultStatus.SUCCESSFUL, 3),
        (TaskResultStatus.SUCCESSFUL, 7),
    ]
    assert results[0].finished_at <= results[1].started_at


def test_a_task_reads_the_results_of_the_tasks_it_waited_for(settings):
    configure(settings)
    backend = task_backends["default"]
    members = [backend.step(test_tasks.add, n, n) for n in range(1, 4)]

    workflow = chord(members, backend.step(test_tasks.sum_of_dependencies)).enqueue()

    run_due()
    callback = backend.get_result(str(workflow.jobs[-1].id))
    assert callback.return_value == 2 + 4 + 6
