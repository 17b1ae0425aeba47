"""``manage.py pgqueue_schedule``: list periodic jobs; enqueue due ticks; forget old ones."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_pgqueue import conf
from django_pgqueue.exceptions import PgQueueError
from django_pgqueue.periodic import (
    database_now,
    enqueue_due_ticks,
    pause_schedule,
    resume_schedule,
    schedules,
)

_STORED = (
    "SELECT name, schedule, last_tick, last_job_id, paused_at FROM pgqueue_periodic ORDER BY name"
)
_FORGET = "DELETE FROM pgqueue_periodic WHERE NOT (name = ANY(%s)) RETURNING name"


def _time(value: datetime) -> str:
    """``2030-01-07 12:05:00 UTC``: ticks are whole seconds."""
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


class Command(BaseCommand):
    help = (
        "List the periodic jobs declared with @job(schedule=...) and PGQUEUE['SCHEDULE'] "
        "or stored in the database, with their last and next ticks. Workers enqueue due "
        "ticks by themselves; --run-due does it once, for example from cron when no "
        "worker runs. --pause and --resume stop and restart a schedule's ticks."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--run-due",
            action="store_true",
            help="Enqueue the due tick of every schedule (each tick is enqueued once, "
            "whoever else does the same), then list the schedules.",
        )
        parser.add_argument(
            "--forget-undeclared",
            action="store_true",
            help="Delete the recorded ticks of schedules no longer declared, so that "
            "declaring one of them again counts as a new schedule.",
        )

        parser.add_argument(
            "--pause",
            metavar="NAME",
            action="append",
            default=[],
            help="Pause the schedule NAME: no worker enqueues its ticks until it is "
            "resumed. Repeatable.",
        )
        parser.add_argument(
            "--resume",
            metavar="NAME",
            action="append",
            default=[],
            help="Resume the schedule NAME from its next tick. Repeatable.",
        )

    def _pause_and_resume(self, pause: list[str], resume: list[str]) -> None:
        for names, change, done, already in (
            (pause, pause_schedule, "paused", "was already paused"),
            (resume, resume_schedule, "resumed", "was not paused"),
        ):
            for name in names:
                try:
                    changed = change(name)
                except LookupError as exc:
                    raise CommandError(str(exc)) from None
                self.stdout.write(f"{name} {done if changed else already}")

    def _run_due(self) -> None:
        # Schedules that cannot be enqueued are logged: show them even when LOGGING
        # configures no handler.
        logger = logging.getLogger("django_pgqueue.periodic")
        handler = None if logger.hasHandlers() else logging.StreamHandler(self.stderr)
        if handler is not None:
            logger.addHandler(handler)
        try:
            for job in enqueue_due_ticks():
                self.stdout.write(f"enqueued {job.job_type} for {_time(job.run_at)}: job {job.id}")
        finally:
            if handler is not None:
                logger.removeHandler(handler)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            declared = schedules()
            self._pause_and_resume(options["pause"], options["resume"])
            if options["run_due"]:
                self._run_due()
        except PgQueueError as exc:
            raise CommandError(str(exc)) from exc
        alias = conf.jobs_database()
        with connections[alias].cursor() as cursor:
            if options["forget_undeclared"]:
                cursor.execute(_FORGET, [[schedule.name for schedule in declared]])
                for (name,) in cursor.fetchall():
                    self.stdout.write(f"forgot {name}")
            cursor.execute(_STORED)
            stored = {row[0]: row[1:] for row in cursor.fetchall()}
        now = database_now(alias)
        for schedule in declared:
            signature, last_tick, last_job_id, paused_at = stored.get(
                schedule.name, (None, None, None, None)
            )
            if signature is not None and signature != schedule.signature:
                last = f"(was {signature}; starts afresh)"
            elif last_tick is None:
                last = "never (starts at the first run)"
            else:
                last = _time(last_tick)
                last += f" job {last_job_id}" if last_job_id else " (recorded, not enqueued)"
            upcoming = (
                f"none, paused since {_time(paused_at)}"
                if paused_at
                else _time(schedule.next_tick(now))
            )
            origin = "  (stored)" if schedule.stored else ""
            self.stdout.write(
                f"{schedule.name}  {schedule.signature}  job_type={schedule.job_type}{origin}\n"
                f"    last tick: {last}\n"
                f"    next tick: {upcoming}"
            )
        undeclared = sorted(set(stored) - {schedule.name for schedule in declared})
        for name in undeclared:
            self.stdout.write(
                f"{name}  {stored[name][0]}  (no longer declared; --forget-undeclared deletes it)"
            )
        if not declared and not undeclared:
            self.stdout.write("no periodic jobs are declared")
