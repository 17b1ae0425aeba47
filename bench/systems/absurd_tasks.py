"""The benchmark's tasks for django-absurd (imported in that peer's virtualenv)."""

from __future__ import annotations

from typing import Any

from django.tasks import task
from django_absurd import absurd_params

from bench import common


@task()
def noop(i: int, probe: bool = False) -> None:
    if probe:
        common.probe(i)


@task(takes_context=True)
@absurd_params(max_attempts=3, retry_strategy={"kind": "fixed", "base_seconds": 0})
def cpu_flaky(context: Any, i: int) -> None:
    """W6: a millisecond of CPU; every tenth task fails its first attempt, retried at
    once (a fixed retry strategy of no delay)."""
    common.burn_cpu()
    if context.attempt == 1 and common.fails_first_attempt(i):
        raise common.FlakyJobError(i)
