"""``manage.py pgqueue_worker``: run a worker until SIGTERM/SIGINT (or, with --burst,
until no due job is left)."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgqueue.exceptions import PgQueueError

if TYPE_CHECKING:
    from django_pgqueue.metrics import MetricsServer


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
            help="Sync jobs run at once, each in its own thread (default: %(default)s).",
        )
        parser.add_argument(
            "--async-concurrency",
            type=int,
            default=None,
            help="Async (async def) jobs run at once on the worker's event loop "
            "(default: PGQUEUE['ASYNC_CONCURRENCY'], 100 unless set; 0 refuses to start "
            "while async handlers are registered for the job types it runs).",
        )
        parser.add_argument(
            "--process-concurrency",
            type=int,
            default=None,
            help="Process-isolated jobs (isolation='process') run at once, each in a "
            "child process (default: PGQUEUE['PROCESS_CONCURRENCY'], 2 unless set).",
        )
        parser.add_argument(
            "--pool",
            choices=["thread", "process"],
            default="thread",
            help="Where sync jobs run: 'thread' (default), or 'process' to run every one "
            "in a child process (--process-concurrency of them at once).",
        )
        parser.add_argument(
            "--max-jobs-per-child",
            type=int,
            default=None,
            help="Replace a child process after it ran so many jobs (default: never).",
        )
        parser.add_argument(
            "--max-memory-per-child",
            type=int,
            default=None,
            help="Replace a child process once its peak memory passed so many MiB, "
            "checked after each job (default: never).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=None,
            help="Most jobs claimed per query (default: concurrency + prefetch, plus "
            "async concurrency when async handlers run; at most 1000).",
        )
        parser.add_argument(
            "--prefetch",
            type=int,
            default=None,
            help="Most claimed jobs held beyond the running ones, while jobs are fast "
            "(default: PGQUEUE['PREFETCH'], 400 unless set; 0 disables prefetching).",
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
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="Serve Prometheus metrics over HTTP on this port, 1 to 65535 "
            "(default: no metrics server; needs django-pgqueue[metrics]).",
        )
        parser.add_argument(
            "--metrics-addr",
            default="0.0.0.0",
            help="Address the metrics server listens on (default: %(default)s).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from django_pgqueue.worker import Worker

        _configure_logging(options["log_level"])
        try:
            worker = Worker(
                queues=options["queues"],
                job_types=options["job_types"],
                concurrency=options["concurrency"],
                async_concurrency=options["async_concurrency"],
                process_concurrency=options["process_concurrency"],
                max_jobs_per_child=options["max_jobs_per_child"],
                max_memory_per_child=options["max_memory_per_child"],
                pool=options["pool"],
                batch_size=options["batch_size"],
                prefetch=options["prefetch"],
                poll_interval=options["poll_interval"],
                burst=options["burst"],
                worker_id=options["worker_id"],
                shutdown_grace=options["shutdown_grace"],
            )
        except (PgQueueError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        server = _start_metrics(options["metrics_port"], options["metrics_addr"])
        try:
            code = worker.run()
        finally:
            if server is not None:
                server.stop()
        if worker.handlers_left_running:
            _exit_at_once(code)
        if code:
            raise CommandError(f"worker exited with status {code}", returncode=code)


def _exit_at_once(code: int) -> NoReturn:
    """End the process now, with the handler threads that outlived the shutdown's grace
    period: their jobs were released to run again a moment later (the worker's
    ``RELEASED_RUNNING_DELAY``), which an interpreter's ordinary exit, running every
    ``atexit`` function first, could outlast. Logs and output are flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _start_metrics(port: int | None, addr: str) -> MetricsServer | None:
    if port is None:
        return None
    if not 1 <= port <= 65535:
        raise CommandError(f"--metrics-port must be from 1 to 65535, got {port}")
    try:
        from django_pgqueue.metrics import start_metrics_server
    except PgQueueError as exc:  # prometheus-client is missing
        raise CommandError(f"--metrics-port: {exc}") from exc
    try:
        return start_metrics_server(port, addr)
    except OSError as exc:
        raise CommandError(
            f"--metrics-port: cannot listen on {addr}:{port} ({exc.strerror or exc}); "
            "choose a free port, or another --metrics-addr"
        ) from exc


def _configure_logging(level: str) -> None:
    logger = logging.getLogger("django_pgqueue")
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
