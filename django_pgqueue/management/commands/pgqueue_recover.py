"""``manage.py pgqueue_recover``: return jobs of dead workers to pending (or failed)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgqueue.exceptions import PgQueueError
from django_pgqueue.recovery import recover_stale_jobs, release_held_jobs


class Command(BaseCommand):
    help = (
        "Recover claimed or running jobs whose worker stopped heartbeating: back to "
        "pending, or failed when their attempts are spent; then release the jobs held "
        "by a per-key limit whose key has room. Workers also do this "
        "periodically; run it by hand or from cron when no worker is running."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--stale-after",
            type=float,
            default=None,
            help="Seconds without a heartbeat after which a job is stale "
            "(default: PGQUEUE['STALE_AFTER'], 60.0 unless set).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="List the jobs that would be recovered without changing them.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            jobs = recover_stale_jobs(options["stale_after"], dry_run=options["dry_run"])
        except (PgQueueError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        verb = "would recover" if options["dry_run"] else "recovered"
        for job in jobs:
            self.stdout.write(
                f"{job.id}  {job.job_type}  worker={job.previous_worker_id}  "
                f"-> {job.new_status} (attempts {job.attempts})"
            )
        self.stdout.write(f"{verb} {len(jobs)} stale job(s)")
        if not options["dry_run"]:
            released = release_held_jobs()
            self.stdout.write(f"released {released} held job(s) whose key has room")
