"""The @job decorator and the registry of handlers."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from django_pgqueue import Backoff, InvalidJobError, job, registry
from django_pgqueue.exceptions import JobRegistrationError, UnknownJobTypeError
from django_pgqueue.registry import JobDefinition

pytestmark = pytest.mark.usefixtures("clean_registry")

ROOT = Path(__file__).resolve().parent.parent


# Handlers are module-level functions, as in an app's jobs.py: registered under
# "<module>.<name>", which must be a valid job type.
def send_welcome(job):
    """Send the welcome email."""
    return ("welcomed", job)


def send_welcome_again(job):
    return ("welcomed again", job)


def test_bare_decorator_registers_the_function_under_its_dotted_path():
    definition = job(send_welcome)

    assert isinstance(definition, JobDefinition)
    assert definition.job_type == "tests.test_registry.send_welcome"
    assert registry.get_definition("tests.test_registry.send_welcome") is definition


def test_decorator_with_empty_parentheses_behaves_like_the_bare_one():
    definition = job()(send_welcome)

    assert definition.job_type == "tests.test_registry.send_welcome"


def test_decorator_with_a_name_registers_under_that_name():
    definition = job("emails.send_welcome")(send_welcome)

    assert definition.job_type == "emails.send_welcome"
    assert registry.get_definition("emails.send_welcome") is definition
    assert registry.find_definition("tests.test_registry.send_welcome") is None


def test_registration_without_options_leaves_them_to_enqueue_and_the_settings():
    definition = job(send_welcome)

    assert (definition.queue, definition.priority, definition.max_attempts) == (None, None, None)
    assert (definition.timeout, definition.retry_backoff, definition.atomic) == (None, None, True)


def test_decorator_options_are_kept_on_the_definition():
    backoff = Backoff(base=1, max=60, jitter=False)

    definition = job(
        "emails.welcome",
        queue="emails",
        priority=150,
        max_attempts=5,
        timeout=timedelta(minutes=2),
        retry_backoff=backoff,
        atomic=False,
    )(send_welcome)

    assert (definition.queue, definition.priority, definition.max_attempts) == ("emails", 150, 5)
    assert (definition.timeout, definition.retry_backoff, definition.atomic) == (
        120.0,
        backoff,
        False,
    )


def test_decorated_handler_is_still_the_function():
    definition = job(send_welcome)

    assert definition("a job") == ("welcomed", "a job")
    assert definition.__name__ == "send_welcome"
    assert definition.__doc__ == "Send the welcome email."
    assert definition.__wrapped__ is send_welcome


def test_registering_another_function_under_a_taken_name_raises():
    first = job("emails.welcome")(send_welcome)

    with pytest.raises(JobRegistrationError) as excinfo:
        job("emails.welcome")(send_welcome_again)

    message = str(excinfo.value)
    assert "tests.test_registry.send_welcome" in message
    assert "tests.test_registry.send_welcome_again" in message
    assert registry.get_definition("emails.welcome") is first


def test_registering_the_same_function_again_replaces_it_as_a_module_reload_does():
    job("emails.welcome", priority=1)(send_welcome)

    again = job("emails.welcome", priority=2)(send_welcome)

    assert registry.get_definition("emails.welcome") is again


@pytest.mark.parametrize(
    ("arguments", "options", "field"),
    [
        (("has space",), {}, "job_type"),
        (("x'; DROP TABLE pgqueue_jobs; --",), {}, "job_type"),
        (("x" * 201,), {}, "job_type"),
        ((), {"queue": "bad queue"}, "queue"),
        ((), {"queue": ""}, "queue"),
        ((), {"priority": 5000}, "priority"),
        ((), {"priority": True}, "priority"),
        ((), {"max_attempts": 0}, "max_attempts"),
        ((), {"timeout": 0}, "timeout"),
        ((), {"timeout": -5}, "timeout"),
        ((), {"timeout": "1m"}, "timeout"),
    ],
)
def test_invalid_options_are_rejected_when_decorating(arguments, options, field):
    with pytest.raises(InvalidJobError) as excinfo:
        job(*arguments, **options)

    assert excinfo.value.field == field
    assert registry.find_definition("tests.test_registry.send_welcome") is None


def test_retry_backoff_that_is_neither_a_backoff_nor_callable_is_rejected():
    with pytest.raises(JobRegistrationError, match="retry_backoff"):
        job(retry_backoff=5)


def test_decorating_something_that_is_not_callable_is_rejected():
    with pytest.raises(JobRegistrationError, match="must decorate a function"):
        job("emails.welcome")("not a function")

    assert registry.find_definition("emails.welcome") is None


def test_bare_decorator_on_a_nested_function_asks_for_a_name():
    def nested(job):
        return None

    with pytest.raises(InvalidJobError, match="not a valid job type"):
        job(nested)


def test_unknown_job_type_lookup_lists_the_registered_ones():
    with pytest.raises(UnknownJobTypeError) as excinfo:
        registry.get_definition("emails.nope")

    assert isinstance(excinfo.value, LookupError)
    assert "tests.record" in str(excinfo.value)


def test_unregister_removes_the_job_type():
    job("emails.welcome")(send_welcome)

    registry.unregister("emails.welcome")

    assert "emails.welcome" not in registry.registered_job_types()
    job("emails.welcome")(send_welcome_again)  # the name is free again


def test_retry_delay_uses_the_registered_backoff():
    fixed = job("emails.fixed", retry_backoff=Backoff(base=2, factor=3, jitter=False))(send_welcome)
    custom = job("emails.custom", retry_backoff=lambda attempt: attempt * 10)(send_welcome_again)

    assert [fixed.retry_delay(attempt) for attempt in (1, 2, 3)] == [2, 6, 18]
    assert custom.retry_delay(4) == 40.0


def test_retry_delay_defaults_to_the_backoff_in_the_settings(pgqueue_settings):
    pgqueue_settings(RETRY_BACKOFF_BASE=4, RETRY_BACKOFF_MAX=10)
    definition = job(send_welcome)

    assert 2 <= definition.retry_delay(1) <= 4  # jittered down to half at most
    assert 5 <= definition.retry_delay(10) <= 10  # capped at RETRY_BACKOFF_MAX


@pytest.mark.django_db
def test_definition_enqueue_creates_a_job_of_its_type_with_its_defaults():
    definition = job("emails.welcome", queue="emails", priority=42, max_attempts=7)(send_welcome)

    queued = definition.enqueue({"user": 1})
    overridden = definition.enqueue(queue="urgent", priority=900, delay=60)

    assert (queued.job_type, queued.data, queued.queue, queued.priority, queued.max_attempts) == (
        "emails.welcome",
        {"user": 1},
        "emails",
        42,
        7,
    )
    assert (overridden.queue, overridden.priority) == ("urgent", 900)
    assert overridden.run_at > queued.run_at


def test_handlers_in_installed_apps_jobs_modules_are_autodiscovered():
    # A fresh interpreter that only sets Django up: nothing imports tests.testapp.jobs
    # except the app's autodiscovery.
    script = (
        "import django; django.setup(); "
        "from django_pgqueue import registry; "
        "definition = registry.get_definition('tests.record'); "
        "print(definition.func.__module__, definition.priority)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["tests.testapp.jobs", "150"]


# -- handlers a worker could not run ----------------------------------------------------


async def async_handler(job):
    raise AssertionError("never awaited")


def generator_handler(job):
    yield job


async def async_generator_handler(job):
    yield job


def handler_without_the_job():
    pass


class AsyncCallable:
    async def __call__(self, job):
        pass


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        pytest.param(generator_handler, "is a generator function", id="generator"),
        pytest.param(async_generator_handler, "is a generator function", id="async-generator"),
        pytest.param(handler_without_the_job, "must take the job", id="no-argument"),
    ],
)
def test_a_handler_a_worker_could_not_run_is_rejected_when_decorating(handler, message):
    with pytest.raises(JobRegistrationError, match=message):
        job("tests.registry.cannot_run")(handler)

    assert registry.find_definition("tests.registry.cannot_run") is None


@pytest.mark.parametrize(
    "handler",
    [pytest.param(async_handler, id="async-def"), pytest.param(AsyncCallable(), id="async-call")],
)
def test_an_async_handler_registers_as_async_and_outside_a_transaction(handler):
    definition = job("tests.registry.async")(handler)

    assert definition.is_async
    assert definition.atomic is False
    assert registry.find_definition("tests.registry.async") is definition


def test_a_sync_handler_is_not_async_and_atomic_by_default():
    definition = job("tests.registry.sync")(send_welcome)

    assert not definition.is_async
    assert definition.atomic is True


def test_effectively_once_follows_atomic_by_default():
    assert job("tests.registry.once")(send_welcome).effectively_once is True
    assert job("tests.registry.not_atomic", atomic=False)(send_welcome).effectively_once is False
    assert job("tests.registry.async_once")(async_handler).effectively_once is False
    batched = job("tests.registry.batched", effectively_once=False)(send_welcome)
    assert (batched.atomic, batched.effectively_once) == (True, False)


@pytest.mark.parametrize(
    ("options", "handler", "message"),
    [
        ({"effectively_once": "yes"}, send_welcome, "effectively_once must be True or False"),
        ({"effectively_once": True, "atomic": False}, send_welcome, "needs atomic=True"),
        ({"effectively_once": True}, async_handler, "an async handler does not run in"),
    ],
)
def test_effectively_once_where_it_cannot_hold_is_refused(options, handler, message):
    with pytest.raises(JobRegistrationError, match=message):
        job("tests.registry.refused", **options)(handler)

    assert registry.find_definition("tests.registry.refused") is None


def test_atomic_true_on_an_async_handler_is_refused_saying_what_to_do():
    with pytest.raises(JobRegistrationError) as excinfo:
        job("tests.registry.async_atomic", atomic=True)(async_handler)

    message = str(excinfo.value)
    assert "'tests.registry.async_atomic': atomic=True cannot apply to an async handler" in message
    assert "sync_to_async" in message
    assert registry.find_definition("tests.registry.async_atomic") is None


def test_handlers_with_a_default_or_keyword_arguments_are_accepted():
    def with_default(job, retries=3):
        pass

    def with_varargs(*args, **kwargs):
        pass

    assert job("tests.registry.default")(with_default).func is with_default
    assert job("tests.registry.varargs")(with_varargs).func is with_varargs


def test_the_system_check_reports_a_handler_swapped_for_a_generator():
    from django_pgqueue.checks import check_handlers

    definition = job("tests.registry.swapped")(send_welcome)
    assert check_handlers() == []
    definition.func = generator_handler

    (error,) = check_handlers()

    assert error.id == "django_pgqueue.E401"
    assert "'tests.registry.swapped' is a generator function" in error.msg
    assert "Use return instead of yield" in error.hint


def test_an_unknown_option_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"@job\(\) got unexpected keyword arguments \['retries'\]"):
        job("tests.registry.typo", retries=3)


def test_the_options_are_declared_once_for_every_entry_point():
    from django_pgqueue.options import EnqueueOptions, JobDefaults, JobOptions, JobSpec

    shared = JobDefaults.__optional_keys__
    assert shared == {"queue", "priority", "max_attempts"}
    assert shared <= EnqueueOptions.__optional_keys__
    assert shared <= JobOptions.__optional_keys__
    assert EnqueueOptions.__optional_keys__ <= JobSpec.__optional_keys__
    assert JobSpec.__required_keys__ == {"job_type"}
