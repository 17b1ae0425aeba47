"""``manage.py pgqueue_queue``: pause and resume queues, list them with their state."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_pgqueue import validation
from django_pgqueue.exceptions import InvalidArgumentError
from django_pgqueue.queues import describe_queues, known_queues, pause_queue, resume_queue


class Command(BaseCommand):
    help = (
        "Pause or resume queues, or list them. No worker claims jobs of a paused queue; "
        "jobs already running finish, and new jobs can still be enqueued."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        subcommands = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
        pause = subcommands.add_parser("pause", help="Stop workers from claiming these queues.")
        resume = subcommands.add_parser("resume", help="Let workers claim these queues again.")
        listing = subcommands.add_parser(
            "list", help="Queues with their state, pending and running jobs, and limit."
        )
        for subcommand in (pause, resume):
            subcommand.add_argument("names", nargs="+", metavar="NAME", help="Queue names.")
        for subcommand in (pause, resume, listing):
            subcommand.add_argument(
                "--database",
                default=None,
                help="Database alias (default: PGQUEUE['DATABASE'], 'default' unless set).",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        if options["subcommand"] == "list":
            self._list(using)
            return
        names: list[str] = options["names"]
        for name in names:
            try:
                validation.queue(name, "queue name")
            except InvalidArgumentError as exc:
                raise CommandError(f"{exc}. Nothing was changed.") from None
        if options["subcommand"] == "pause":
            known = set(known_queues(using))
            for name in names:
                if name not in known:
                    self.stderr.write(
                        f"note: queue {name!r} has no pending or running jobs, and no job "
                        "type or limit uses it; pausing it anyway (check the spelling)"
                    )
                changed = pause_queue(name, using=using)
                self.stdout.write(f"{name}: {'paused' if changed else 'already paused'}")
        else:
            for name in names:
                changed = resume_queue(name, using=using)
                self.stdout.write(f"{name}: {'resumed' if changed else 'was not paused'}")

    def _list(self, using: str | None) -> None:
        rows = [("QUEUE", "STATE", "PENDING", "RUNNING", "LIMIT")]
        for info in describe_queues(using):
            state = "active"
            if info.paused_at is not None:
                state = f"paused since {info.paused_at:%Y-%m-%d %H:%M:%S %Z}"
            limit = "-" if info.limit is None else str(info.limit)
            rows.append((info.name, state, str(info.pending), str(info.running), limit))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            cells = [
                cell.rjust(width) if 2 <= i <= 4 else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            ]
            self.stdout.write("  ".join(cells).rstrip())
