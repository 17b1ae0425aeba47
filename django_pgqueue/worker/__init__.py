"""The worker runtime: claiming loop, slots, heartbeats, notifications, shutdown."""

from .runner import Worker, default_worker_id

__all__ = ["Worker", "default_worker_id"]
