"""``manage.py pgqueue_prune``: delete finished jobs older than a given age."""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgqueue.pruning import PRUNED_BY_DEFAULT, prune_jobs
from django_pgqueue.schema import JobStatus

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")


def parse_duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"15m"``, ``"12h"``, ``"7d"`` or ``"2w"`` as seconds."""
    match = _DURATION_RE.fullmatch(text.strip())
    if not match:
        raise ValueError(
            f"{text!r} is not a duration; use a number of seconds or e.g. 30m, 12h, 7d, 2w"
        )
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


class Command(BaseCommand):
    help = (
        "Delete finished jobs (completed and cancelled; failed ones with --include-failed) "
        "whose completed_at is older than --older-than, in bounded batches. Workers do the "
        "same on their own when PGQUEUE['RETENTION'] is set."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            required=True,
            help="Age of the jobs to delete: seconds, or a number with s, m, h, d or w (e.g. 7d).",
        )
        parser.add_argument(
            "--include-failed",
            action="store_true",
            help="Also delete failed jobs (by default they are kept for inspection and retry).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=1000,
            help="Rows deleted per statement (default: %(default)s).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count the jobs without deleting them."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        statuses = list(PRUNED_BY_DEFAULT)
        if options["include_failed"]:
            statuses.append(JobStatus.FAILED.value)
        try:
            deleted = prune_jobs(
                parse_duration(options["older_than"]),
                statuses=statuses,
                batch_size=options["batch_size"],
                dry_run=options["dry_run"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        verb = "would delete" if options["dry_run"] else "deleted"
        self.stdout.write(f"{verb} {deleted} finished job(s) ({', '.join(statuses)})")
