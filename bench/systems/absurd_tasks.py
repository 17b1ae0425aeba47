"""The benchmark's tasks for django-absurd (imported in that peer's virtualenv)."""

from __future__ import annotations

from django.tasks import task

from bench import common


@task()
def noop(i: int, probe: bool = False) -> None:
    if probe:
        common.probe(i)
