"""The benchmark's tasks for django-tasks-db (imported in that peer's virtualenv)."""

from __future__ import annotations

import importlib.util

from bench import common

if importlib.util.find_spec("django.tasks") is not None:
    from django.tasks import task
else:
    from django_tasks import task


@task()
def noop(i: int, probe: bool = False) -> None:
    if probe:
        common.probe(i)
