"""``manage.py pgqueue_status``: the queues and workers, as a table (rich) or JSON."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper
from django.db import DatabaseError, connections

from django_pgqueue import conf
from django_pgqueue.exceptions import MissingExtraError
from django_pgqueue.stats import WINDOW_SECONDS, Snapshot, WorkerState, snapshot

if TYPE_CHECKING:
    from rich.console import Console, JustifyMethod, RenderableType

#: Most workers listed in the table (the JSON lists them all).
WORKERS_SHOWN = 50


def _positive(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(value)
    return seconds


def _count(value: str) -> int:
    count = int(value)
    if count < 1:
        raise ValueError(value)
    return count


_positive.__name__ = "positive number of seconds"
_count.__name__ = "positive integer"


class Command(BaseCommand):
    help = (
        "Show the queues (jobs by status, paused, limit, throughput and waiting times of "
        "the last minute) and the workers. Tables need django-pgqueue[status] (rich); "
        "--json does not."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--watch",
            type=_positive,
            nargs="?",
            const=2.0,
            default=None,
            metavar="SECONDS",
            help="Refresh every SECONDS (default when given without a value: %(const)s) "
            "until Ctrl-C.",
        )
        parser.add_argument(
            "--count",
            type=_count,
            default=None,
            metavar="N",
            help="With --watch: stop after this many refreshes (default: until Ctrl-C).",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print JSON instead of tables (with --watch: one JSON document per line).",
        )
        parser.add_argument(
            "--failed-total",
            action="store_true",
            help="Also count every failed job per queue (--json: every finished job by "
            "status, and those of the last hour). No index serves these counts: they read "
            "all finished jobs, so avoid it on big tables with a short --watch.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        interval: float | None = options["watch"]
        count: int | None = options["count"]
        if count is not None and interval is None:
            raise CommandError("--count needs --watch: it is the number of refreshes")

        def read() -> Snapshot:
            try:
                return snapshot(totals=options["failed_total"])
            except DatabaseError as exc:
                connection = connections[conf.jobs_database()]
                if not connection.in_atomic_block:  # reconnect at the next refresh
                    connection.close()
                raise CommandError(f"cannot read the queues from the database: {exc}") from exc

        if options["json"]:
            self._json(read, interval, count)
        else:
            self._tables(read, interval, count, failed_total=options["failed_total"])

    def _json(self, read: Any, interval: float | None, count: int | None) -> None:
        if interval is None:
            self.stdout.write(json.dumps(read().as_dict(), indent=2))
            return
        shown = 0
        try:
            while True:
                self.stdout.write(json.dumps(read().as_dict()))
                self.stdout.flush()
                shown += 1
                if count is not None and shown >= count:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return

    def _tables(
        self, read: Any, interval: float | None, count: int | None, *, failed_total: bool
    ) -> None:
        try:
            from rich.live import Live
        except ImportError as exc:
            error = MissingExtraError("pgqueue_status tables", "rich", "status")
            raise CommandError(f"{error}; or use --json, which needs nothing more") from exc

        console = _console(self.stdout)
        if interval is None:
            console.print(render(read(), failed_total=failed_total))
            return
        shown = 1
        try:
            with Live(
                render(read(), failed_total=failed_total),
                console=console,
                auto_refresh=False,
                transient=False,
            ) as live:
                while count is None or shown < count:
                    time.sleep(interval)
                    try:
                        frame: RenderableType = render(read(), failed_total=failed_total)
                    except CommandError as exc:  # keep watching while the database is away
                        frame = f"[red]{exc}[/red] (retrying every {interval:g}s)"
                    live.update(frame, refresh=True)
                    shown += 1
        except KeyboardInterrupt:
            return


class _Stream:
    """Lets rich write through the command's ``OutputWrapper`` without added newlines."""

    def __init__(self, out: OutputWrapper) -> None:
        self._out = out

    def write(self, text: str) -> int:
        self._out.write(text, ending="")
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def isatty(self) -> bool:
        return self._out.isatty()


def _console(out: OutputWrapper) -> Console:
    from rich.console import Console

    stream = _Stream(out)
    # Off a terminal rich assumes 80 columns: wide enough ids would be cut.
    # (rich types file as IO[str]; what it uses of one, _Stream has: write, flush, isatty.)
    return Console(file=stream, width=None if stream.isatty() else 200)  # type: ignore[arg-type]


def render(shot: Snapshot, *, failed_total: bool = False) -> RenderableType:
    """The rich renderable of ``pgqueue_status``: a table of queues, one of workers."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    queues = Table(
        title=f"Queues at {_clock(shot.taken_at)} (rates: last {WINDOW_SECONDS}s)",
        title_justify="left",
    )
    held_total = sum(queue.held for queue in shot.queues)
    waiting_total = sum(queue.waiting for queue in shot.queues)
    columns = ["queue", "state", "limit"]
    if waiting_total:
        columns.append("waiting")
    columns += ["pending", "scheduled"]
    if held_total:
        columns.append("held")
    columns += ["claimed", "running"]
    if failed_total:
        columns.append("failed")
    columns += ["done/min", "failed/min", "wait p50", "wait p95", "oldest due"]
    for name in columns:
        queues.add_column(name, justify="left" if name in ("queue", "state") else "right")
    for queue in shot.queues:
        row = [
            queue.name,
            "[yellow]paused[/yellow]" if queue.paused else "active",
            "-" if queue.max_running is None else str(queue.max_running),
        ]
        if waiting_total:
            row.append(str(queue.waiting))
        row += [str(queue.pending), str(queue.scheduled)]
        if held_total:
            row.append(str(queue.held))
        row += [str(queue.claimed), str(queue.running)]
        if failed_total:
            row.append(_red_if(queue.failed or 0))
        row += [
            str(queue.completed_last_minute),
            _red_if(queue.failed_last_minute),
            _duration(queue.wait_p50_seconds),
            _duration(queue.wait_p95_seconds),
            _duration(queue.oldest_pending_age_seconds),
        ]
        queues.add_row(*row)
    if not shot.queues:
        queues.caption = "no queue has jobs, workers, a pause or a limit yet"

    workers = Table(title="Workers", title_justify="left")
    for name in ("worker", "host", "pid", "queues", "slots", "running", "heartbeat", "state"):
        justify: JustifyMethod = (
            "right" if name in ("pid", "slots", "running", "heartbeat") else "left"
        )
        workers.add_column(name, justify=justify, overflow="fold")
    styles = {
        WorkerState.ALIVE: "green",
        WorkerState.NOT_RESPONDING: "red",
        WorkerState.STOPPED: "dim",
    }
    for worker in shot.workers[:WORKERS_SHOWN]:
        workers.add_row(
            worker.worker_id,
            worker.hostname,
            str(worker.pid),
            ", ".join(worker.queues) if worker.queues else "all",
            str(worker.concurrency),
            str(worker.running),
            _duration((shot.taken_at - worker.heartbeat_at).total_seconds()) + " ago",
            f"[{styles[worker.state]}]{worker.state}[/{styles[worker.state]}]"
            + (", leads" if worker.leads else ""),
        )
    hidden = len(shot.workers) - WORKERS_SHOWN
    if hidden > 0:
        workers.caption = f"and {hidden} more (see --json)"
    elif not shot.workers:
        workers.caption = "no worker has run in the last day"
    if shot.horizon is not None and shot.horizon.past_threshold():
        warning = escape(
            f"Vacuum is held back: {shot.horizon.describe()} holds the xmin horizon "
            f"{shot.horizon.xid_age:,} transactions back, so dead job rows pile up and "
            "claims slow down. End it; set idle_in_transaction_session_timeout."
        )
        return Group(queues, workers, f"[red]{warning}[/red]")
    return Group(queues, workers)


def _red_if(count: int) -> str:
    return f"[red]{count}[/red]" if count else "0"


def _clock(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"
