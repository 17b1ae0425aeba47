"""django_pgqueue.tasks_compat imports with every spelling of the backport's names."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import django
import pytest

import django_pgqueue

pytestmark = pytest.mark.skipif(
    django.VERSION >= (6, 0), reason="the django-tasks backport is used on Django 5.2 only"
)

COMPAT = Path(django_pgqueue.__file__).with_name("tasks_compat.py")


def fresh_compat() -> types.ModuleType:
    """tasks_compat run anew, beside the one the app imported (which stays untouched)."""
    spec = importlib.util.spec_from_file_location("tasks_compat_under_test", COMPAT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_installed_backports_exceptions_have_djangos_names():
    import django_tasks.exceptions as installed

    compat = fresh_compat()

    assert issubclass(compat.InvalidTask, installed.TaskException)
    assert compat.InvalidTask.__name__ in {"InvalidTask", "InvalidTaskError"}
    assert compat.InvalidTaskBackend.__name__ in {"InvalidTaskBackend", "InvalidTaskBackendError"}


def test_a_backport_with_djangos_exception_names_imports(monkeypatch):
    # The backport's code after 0.12 renamed InvalidTaskError and InvalidTaskBackendError
    # to Django's names, and has no alias for the old ones.
    import django_tasks.exceptions as installed

    class InvalidTask(installed.TaskException):
        pass

    class InvalidTaskBackend(django.core.exceptions.ImproperlyConfigured):
        pass

    renamed = types.ModuleType("django_tasks.exceptions")
    renamed.TaskException = installed.TaskException
    renamed.TaskResultDoesNotExist = installed.TaskResultDoesNotExist
    renamed.TaskResultMismatch = installed.TaskResultMismatch
    renamed.InvalidTask = InvalidTask
    renamed.InvalidTaskBackend = InvalidTaskBackend
    monkeypatch.setitem(sys.modules, "django_tasks.exceptions", renamed)

    compat = fresh_compat()

    assert compat.InvalidTask is InvalidTask
    assert compat.InvalidTaskBackend is InvalidTaskBackend
