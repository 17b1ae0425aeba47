"""``manage.py pgqueue_worker``: run a worker until SIGTERM/SIGINT (or, with --burst,
until no due job is left)."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgqueue.exceptions import PgQueueError


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class Command(BaseCommand):
    help = "Run a django-pgqueue worker."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues",
            type=_csv,
            default=None,
            help="Comma-separated queues to take jobs from (default: all queues).",
        )
        parser.add_argument(
            "--job-types",
            type=_csv,
            default=None,
            help="Comma-separated job types to run (default: all job types).",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=4,
            help="Jobs run at once, each in its own thread (default: %(default)s).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=None,
            help="Most jobs claimed per query (default: the concurrency).",
        )
        parser.add_argument(
            "--poll-interval",
            type=float,
            default=None,
            help="Seconds between polls when no notification arrives "
            "(default: PGQUEUE['POLL_INTERVAL'], 1.0 unless set).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit once no due job is left, instead of waiting for more.",
        )
        parser.add_argument(
            "--worker-id",
            default=None,
            help="Identifier recorded on claimed jobs (default: host:pid:random).",
        )
        parser.add_argument(
            "--shutdown-grace",
            type=float,
            default=None,
            help="Seconds running jobs get to finish after SIGTERM/SIGINT "
            "(default: PGQUEUE['SHUTDOWN_GRACE'], 30.0 unless set).",
        )
        parser.add_argument(
            "--log-level",
            default="INFO",
            choices=["DEBUG", "INFO", "WARNING", "ERROR"],
            help="Level of the django_pgqueue loggers (default: %(default)s).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from django_pgqueue.worker import Worker

        _configure_logging(options["log_level"])
        try:
            worker = Worker(
                queues=options["queues"],
                job_types=options["job_types"],
                concurrency=options["concurrency"],
                batch_size=options["batch_size"],
                poll_interval=options["poll_interval"],
                burst=options["burst"],
                worker_id=options["worker_id"],
                shutdown_grace=options["shutdown_grace"],
            )
        except (PgQueueError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        code = worker.run()
        if code:
            raise CommandError(f"worker exited with status {code}", returncode=code)


def _configure_logging(level: str) -> None:
    logger = logging.getLogger("django_pgqueue")
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
