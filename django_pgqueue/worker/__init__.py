"""The worker runtime: claiming loop, slots, heartbeats, notifications, shutdown."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import Worker, default_worker_id

__all__ = ["Worker", "default_worker_id"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: a child process (worker/child.py) imports this package
    # before Django is set up, and the runner imports the models.
    if name in __all__:
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
