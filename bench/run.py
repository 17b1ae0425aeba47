"""Benchmark django-pgqueue against its peers and the pgbench ceiling.

    python bench/run.py [--quick | --smoke] [--systems NAME,...] [--database-url URL]

Starts its own durable PostgreSQL (the system server binaries; or uses
``--database-url``), gives each system a fresh database, runs every workload for
every system (each peer from PyPI in its own virtualenv under ``--venv-dir``), and
writes ``results.md``, ``results.json`` and ``chart.png`` into ``--results-dir``.
See bench/README.md for what each workload measures.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import baseline, redis_server, report  # noqa: E402
from bench.common import IO_WAIT_SECONDS, W9_KEYS, W10_LAYOUT, W11_RATE  # noqa: E402
from bench.report import Figure, Results, SystemInfo  # noqa: E402
from django_pgqueue.conf import PgQueueSettings  # noqa: E402

#: Durable settings for the benchmark's own server: never the test tuning. Checkpoints
#: are spaced out so that none lands in the middle of a short run by chance.
DURABLE_SETTINGS = [
    "fsync=on",
    "synchronous_commit=on",
    "full_page_writes=on",
    "shared_buffers=1GB",
    "max_connections=200",
    "max_wal_size=8GB",
    "checkpoint_timeout=30min",
]
RECORDED_SETTINGS = [
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "shared_buffers",
    "max_connections",
    "max_wal_size",
    "checkpoint_timeout",
    "work_mem",
    "autovacuum",
    "autovacuum_naptime",
]
DB_PREFIX = "pgqueue_bench_"
PGBENCH_SCRIPT = ROOT / "bench" / "pgbench" / "claim_complete.sql"
PGBENCH_CLIENTS = 4
#: The ceiling's claim batch: a worker's own with 4 slots and the default prefetch
#: (``concurrency + PREFETCH``), as the W3 target names it.
CEILING_BATCH = PGBENCH_CLIENTS + PgQueueSettings().PREFETCH


@dataclass(frozen=True)
class Sizes:
    """How much work each workload does, and how many runs make a figure."""

    w1: int
    w2: int
    w3: int
    w4: int
    w5_rows: int
    w6: int
    runs: int
    #: Seconds one run of a throughput figure should take. Before its first run, a
    #: calibration run of ``1 / SMALLEST_SHARE`` of the size estimates the system's rate;
    #: a system that would need over 1.5 times the budget does the budget's worth of jobs
    #: instead (down to that share), the same number in every run (flagged in the report).
    #: None: always the nominal size.
    budget: float | None
    #: Drains run in every layout of a system; the others in its first layout only.
    every_layout: tuple[str, ...] = ("W3", "W5", "W6", "W8", "W9", "W11", "W13")
    #: W9: jobs over ``W9_KEYS`` keys, each key limited to one job at a time.
    w9: int = 20_000
    #: W11: jobs over ``W9_KEYS`` keys, each key under a rate of ``W11_RATE`` a second.
    w11: int = 20_000
    #: W10: a rate limit of ``w10_rate`` jobs a second, measured over ``w10_seconds``.
    w10_rate: int = 100
    w10_seconds: float = 60.0
    #: W8: a chord of this many jobs (members and the callback), and a chain of so many
    #: steps.
    w8: int = 10_001
    w8_chain: int = 1_000
    #: W7: jobs each awaiting ``IO_WAIT_SECONDS`` of simulated I/O, one worker process.
    w7: int = 10_000
    #: W12: no-op jobs through process slots (``isolation="process"``), 1 x 4.
    w12: int = 5_000
    #: W13: jobs whose handler inserts a row in its transaction, in each layout of W3.
    w13: int = 20_000

    def describe(self) -> str:
        return (
            f"W1 {self.w1:,} jobs, W2 {self.w2:,}, W3 {self.w3:,}, W4 {self.w4} samples, "
            f"W5 {self.w5_rows:,} finished rows, W6 {self.w6:,}, W9 {self.w9:,} over "
            f"{W9_KEYS:,} keys, W10 {self.w10_rate}/s for {self.w10_seconds:g} s, W11 "
            f"{self.w11:,} over {W9_KEYS:,} keys at {W11_RATE}/s each, W8 a chord of "
            f"{self.w8 - 1:,} jobs and a callback, and a chain of {self.w8_chain:,} steps, "
            f"W7 {self.w7:,} jobs awaiting {IO_WAIT_SECONDS * 1000:g} ms each, W12 "
            f"{self.w12:,} no-op jobs in child processes, W13 {self.w13:,} jobs writing a "
            "row each"
        )


#: The full run: every figure once, slow systems held to about 5 s of timed work a
#: figure, so that every system and workload fit in about 20 minutes on 2 cores.
FULL = Sizes(10_000, 50_000, 20_000, 200, 1_000_000, 3_000, 1, 5.0)
#: A calibration run, and the fewest jobs a budgeted figure does: this share of its size.
SMALLEST_SHARE = 20
QUICK = Sizes(
    2_000,
    10_000,
    5_000,
    50,
    100_000,
    1_000,
    1,
    3.0,
    w9=5_000,
    w10_seconds=20,
    w11=5_000,
    w8=2_501,
    w8_chain=200,
    w7=5_000,
    w12=2_000,
    w13=5_000,
)
SMOKE = Sizes(
    100,
    500,
    200,
    10,
    1_000,
    100,
    1,
    None,
    every_layout=("W3",),
    w9=200,
    w10_rate=20,
    w10_seconds=2,
    w11=200,
    w8=201,
    w8_chain=20,
    w7=200,
    w12=100,
    w13=200,
)


#: Why a peer has no W9 figure: what it offers for "at most one job per key at once".
NO_PER_KEY_LIMITS = "n/a: no per-key concurrency limit"
#: Why a peer has no W10 or W11 figure.
NO_RATE_LIMITS = "n/a: no cluster-wide rate limit"
#: Why a peer has no W8 figure.
NO_WORKFLOWS = "n/a: no workflows (chords, chains)"
#: Why a peer has no W12 figure.
NO_PROCESS_ISOLATION = "n/a: no per-job-type process isolation"
#: Why a peer has no W13 figure.
OURS_ONLY = "n/a: django-pgqueue's completion in the handler's transaction, against its baseline"
#: Why a Redis-based peer has no W5 figure.
NO_FINISHED_ROWS = "n/a: Redis keeps no finished jobs for a drain to pass over"
#: What Celery lacks of the workloads, whatever its Redis.
CELERY_UNSUPPORTED = {
    "W5": NO_FINISHED_ROWS,
    "W9": NO_PER_KEY_LIMITS,
    "W10": "n/a: its rate_limit is per worker process, not cluster-wide",
    "W11": NO_RATE_LIMITS,
    "W12": "n/a: its prefork pool is its W3 figure in `prefork-4`",
    "W13": OURS_ONLY,
}
CELERY_LAYOUTS = {
    "prefork-4": "1 worker, prefork pool, `--concurrency 4`",
    "threads-4": "1 worker, threads pool, `--concurrency 4`",
}
#: Celery's pools for I/O-bound tasks (W7 sleeps with ``time.sleep``, patched by gevent).
CELERY_W7_LAYOUTS = {
    "threads-500": "1 worker, threads pool, `--concurrency 500`",
    "gevent-500": "1 worker, gevent pool, `--concurrency 500`",
}
CELERY_NOTES = (
    "`.delay()` (W1); no bulk enqueue, so W2 is a loop of `apply_async` on one producer "
    "connection; `task_acks_late=True` (nothing lost with a worker), a prefetch of 100 "
    "tasks, results ignored except the chord's members (W8: `chord(group(...), callback)` "
    "with Redis as the result backend; its chain is `chain(task.si(...), ...)`). A drain "
    "ends when the queue and the unacknowledged set are empty; the worker waits in its "
    "`worker_ready` signal for the start, so its start-up is not timed.",
)


#: RQ and Dramatiq: what they lack of the workloads, whatever their Redis.
RQ_UNSUPPORTED = {
    "W5": NO_FINISHED_ROWS,
    "W7": "n/a: a worker process runs one job at a time",
    "W8": "n/a: not measured yet (its `depends_on` takes a list of jobs)",
    "W9": NO_PER_KEY_LIMITS,
    "W10": "n/a: not measured yet",
    "W11": "n/a: not measured yet",
    "W12": "n/a: its default `Worker` forks a work horse for every job: W3 in `fork-4`",
    "W13": OURS_ONLY,
}
RQ_LAYOUTS = {
    "fork-4": "4 worker processes, RQ's default `Worker` (a forked work horse per job)",
    "simple-4": "4 worker processes, `SimpleWorker` (jobs in the worker process)",
}
RQ_NOTES = (
    "`Queue.enqueue` by the function's dotted path (W1), `enqueue_many` in chunks of 5,000 "
    "(W2: one Redis pipeline a chunk); results kept 500 s (its default); burst workers "
    "(`work(burst=True)`); W6 with `Retry(max=1)` (queued again at once). A drain is "
    "timed to the last job's `ended_at`; the workers are then killed (a burst worker's "
    "exit can wait a minute for its command channel's thread).",
)
DRAMATIQ_UNSUPPORTED = {
    "W5": NO_FINISHED_ROWS,
    "W7": "n/a: not measured yet (its `AsyncIO` middleware runs async actors)",
    "W8": "n/a: not measured yet (its groups and pipelines)",
    "W9": "n/a: not measured yet (its `ConcurrentRateLimiter` takes a key)",
    "W10": "n/a: not measured yet (its rate limiters)",
    "W11": "n/a: not measured yet (its rate limiters)",
    "W12": NO_PROCESS_ISOLATION,
    "W13": OURS_ONLY,
}
DRAMATIQ_NOTES = (
    "`actor.send` (W1); no bulk enqueue, so W2 is the same loop; `RedisBroker` with its "
    "default middleware and `CurrentMessage`; a worker process is `dramatiq.Worker("
    "worker_threads=4, worker_timeout=10)` (an idle consumer looks again within 10 ms; "
    "its default backs off to 1 s); W6's actor has `max_retries=1` and a 1 ms backoff. "
    "A drain ends when the queue's and the delay queue's message hashes are empty (a "
    "message leaves them once acknowledged, after it ran).",
)
#: Redis as most teams run it, and as durable as a PostgreSQL commit.
REDIS_KINDS = (
    (
        "",
        "no persistence",
        redis_server.VOLATILE,
        'Redis as most teams run it: `--appendonly no --save ""`, so a crash of Redis '
        "loses every queued job.",
    ),
    (
        "-durable",
        "appendfsync always",
        redis_server.DURABLE,
        "Redis durable as a PostgreSQL commit: `--appendonly yes --appendfsync always`.",
    ),
)


@dataclass(frozen=True)
class SystemSpec:
    """A system under test: its harness, where it comes from, how it spends 4 slots."""

    name: str
    label: str
    module: str
    #: pip requirements of its own virtualenv; empty: this interpreter (django-pgqueue).
    requirements: tuple[str, ...]
    distribution: str
    layouts: dict[str, str]
    unsupported: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: Where its harness runs and imports ``bench`` from (None: the repository).
    harness_path: Path | None = None
    #: The settings of the ``redis-server`` the benchmark starts for it (None: it needs
    #: none); its harness finds it at ``BENCH_REDIS_URL``.
    redis: tuple[str, ...] | None = None
    #: W7's layouts, one worker process each, at its best settings for I/O-bound jobs
    #: (none: W7 is in ``unsupported``).
    w7_layouts: dict[str, str] = field(default_factory=dict)
    #: The Python its virtualenv needs ("3.12": pyenv's build, else python3.12 on the PATH),
    #: when this interpreter is too old for it; empty: this interpreter.
    python: str = ""


SYSTEMS = [
    SystemSpec(
        "pgqueue",
        "django-pgqueue",
        "bench.systems.harness_pgqueue",
        (),
        "django-pgqueue",
        {
            "1x4": "1 process x 4 threads (`--concurrency 4`)",
            "2x2": "2 processes x 2 threads (`--concurrency 2`)",
        },
        notes=(
            "`enqueue()` in autocommit (W1), `enqueue_many()` in chunks of 5,000 (W2), "
            "`manage.py pgqueue_worker --burst` through `call_command` (W3, W5, W6); "
            "package defaults (prefetch up to 400 jobs while jobs are fast, NOTIFY on). "
            "W1 runs twice: with Django's default database options (no prepared "
            "statements, client-side binding) and with prepared statements turned on in "
            "`OPTIONS`, as psycopg has them for the bare INSERT; the W1 target compares "
            "the latter. W7: an `async def` handler awaiting `asyncio.sleep`.",
        ),
        w7_layouts={"1x500": "1 process, `--async-concurrency 500`, `--concurrency 1`"},
    ),
    SystemSpec(
        "procrastinate",
        "Procrastinate",
        "bench.systems.harness_procrastinate",
        ("procrastinate==3.10.0", "psycopg[binary]"),
        "procrastinate",
        {"1x4": "1 process, `concurrency=4` (async tasks)"},
        w7_layouts={
            "1x100": "1 process, `concurrency=100`, a pool of 50 connections",
            "1x500": "1 process, `concurrency=500`, a pool of 50 connections",
        },
        unsupported={
            "W8": NO_WORKFLOWS,
            "W9": "n/a: not measured yet (its `lock` runs one job per key)",
            "W12": NO_PROCESS_ISOLATION,
            "W13": OURS_ONLY,
            "W10": NO_RATE_LIMITS,
            "W11": NO_RATE_LIMITS,
        },
        notes=(
            "`defer_async` (W1), `batch_defer_async` in chunks of 5,000 (W2), "
            "`run_worker_async(wait=False)` (W3, W5, W6), `RetryStrategy(max_attempts=3)`.",
        ),
    ),
    SystemSpec(
        "oban",
        "oban (Python)",
        "bench.systems.harness_oban",
        ("oban==0.7.0",),
        "oban",
        {"1x4": '1 process, `queues={"default": 4}` (async workers)'},
        unsupported={
            "W7": "n/a: not measured yet",
            "W8": "n/a: workflows are in Oban Pro, not in oban",
            "W9": "n/a: global and partitioned limits are in Oban Pro, not in oban",
            "W10": "n/a: rate limits are in Oban Pro, not in oban",
            "W11": "n/a: rate limits are in Oban Pro, not in oban",
            "W12": NO_PROCESS_ISOLATION,
            "W13": OURS_ONLY,
        },
        notes=(
            "Python 3.12 (it requires it); `Oban.enqueue` (W1), `enqueue_many` in chunks of "
            '5,000 (W2); a worker process runs `Oban(pool=..., queues={"default": 4})` '
            "with its defaults on a pool of 6 connections, stopped once no job is left "
            "(it has no burst mode; W3, W5, W6); W6's `backoff` is 0 s, its stager makes a "
            "retryable job available within a second.",
        ),
        python="3.12",
    ),
    SystemSpec(
        "chancy",
        "Chancy",
        "bench.systems.harness_chancy",
        ("chancy==0.26.0",),
        "chancy",
        {"1x4": "1 process, a queue of `concurrency=4` on its asyncio executor"},
        unsupported={
            "W7": "n/a: not measured yet",
            "W8": "n/a: not measured yet (its workflows are a plugin)",
            "W9": "n/a: not measured yet",
            "W10": "n/a: not measured yet (its queues take a global rate limit)",
            "W11": "n/a: no per-key rate limit",
            "W12": "n/a: not measured yet (its process executor runs every job of a queue)",
            "W13": OURS_ONLY,
        },
        notes=(
            "`push` (W1), `push_many` in chunks of 5,000 (W2); a worker process is a "
            "`Worker` with its default plugins, its queue declared with "
            "`executor=Chancy.Executor.Async`, `concurrency=4`, `polling_interval=1` and "
            "`eager_polling=True`, notifications on; stopped once no job is left (it has "
            "no burst mode; W3, W5, W6). W6's jobs have `max_attempts=3` and no retry "
            "plugin: a failed attempt is due again at once.",
        ),
    ),
    SystemSpec(
        "dbos",
        "DBOS",
        "bench.systems.harness_dbos",
        ("dbos==3.4.0",),
        "dbos",
        {"1x4": "1 process, a queue of `worker_concurrency=4` polled every 10 ms (threads)"},
        unsupported={
            "W7": "n/a: not measured yet",
            "W8": "n/a: not measured yet (its workflows are durable functions, not graphs)",
            "W9": "n/a: not measured yet (its partitioned queues limit a key)",
            "W10": "n/a: not measured yet (its queues take a limiter)",
            "W11": "n/a: not measured yet (its partitioned queues take a limiter a key)",
            "W12": NO_PROCESS_ISOLATION,
            "W13": OURS_ONLY,
        },
        notes=(
            "A job is a workflow on a queue. `DBOSClient.enqueue` (W1), "
            "`enqueue_in_transaction` 5,000 to a transaction (W2), both from a process "
            "that runs no worker; a worker process launches DBOS with "
            "`Queue(worker_concurrency=4, polling_interval_sec=0.01)` (it dequeues by "
            "polling), its own `executor_id`, logs at errors only; stopped once no job is "
            "left (it has no burst mode; W3, W5, W6). W6's workflow runs its work as a "
            "step with `retries_allowed=True, interval_seconds=0, max_attempts=3`: a "
            "failed attempt is retried at once, in the same process.",
        ),
    ),
    SystemSpec(
        "django-absurd",
        "django-absurd",
        "bench.systems.harness_django_absurd",
        ("django-absurd==1.0.1", "psycopg[binary]"),
        "django-absurd",
        {"1x4": "1 process, `absurd_worker --concurrency 4 --poll-interval 0.01` (threads)"},
        unsupported={
            "W5": "n/a: not measured yet",
            "W7": "n/a: not measured yet",
            "W8": "n/a: not measured yet (its workflows are durable steps, not graphs)",
            "W9": NO_PER_KEY_LIMITS,
            "W10": NO_RATE_LIMITS,
            "W11": NO_RATE_LIMITS,
            "W12": NO_PROCESS_ISOLATION,
            "W13": OURS_ONLY,
        },
        notes=(
            "Python 3.12 and Django 6 (it requires them); Django Tasks on "
            "`django_absurd.backends.AbsurdBackend`: `enqueue` (W1), and in a loop of "
            "5,000 to a transaction (W2: the Tasks API has no bulk enqueue); a worker "
            "process is `absurd_worker --concurrency 4 --poll-interval 0.01` (it polls; its "
            "default is 0.25 s), stopped once no task is left (it has no burst mode; W3, "
            'W6). W6\'s task has `@absurd_params(max_attempts=3, retry_strategy={"kind": '
            '"fixed", "base_seconds": 0})`: a failed attempt is due again at once.',
        ),
        python="3.12",
    ),
    SystemSpec(
        "pgqueuer",
        "PgQueuer",
        "bench.systems.harness_pgqueuer",
        ("pgqueuer==1.6.0", "asyncpg"),
        "pgqueuer",
        {"1x4": "1 process, `max_concurrent_tasks=4`, `batch_size=2` (async)"},
        unsupported={
            "W8": NO_WORKFLOWS,
            "W9": NO_PER_KEY_LIMITS,
            "W7": "n/a: not measured yet",
            "W10": "n/a: not measured yet (its entrypoints take `requests_per_second`)",
            "W11": "n/a: no per-key rate limit",
            "W12": NO_PROCESS_ISOLATION,
            "W13": OURS_ONLY,
        },
        notes=(
            "asyncpg driver; finished jobs leave its queue table for `pgqueuer_log`, so W5's "
            "finished rows go there; W6 uses `DatabaseRetryEntrypointExecutor` with no delay.",
        ),
    ),
    SystemSpec(
        "django-tasks-db",
        "django-tasks-db",
        "bench.systems.harness_django_tasks_db",
        ("django-tasks-db[compat]==0.13.0", "psycopg[binary]"),
        "django-tasks-db",
        {"4x1": "4 `db_worker` processes x 1 task"},
        unsupported={
            "W6": "n/a: no retries",
            "W7": "n/a: a worker process runs one task at a time",
            "W8": NO_WORKFLOWS,
            "W9": NO_PER_KEY_LIMITS,
            "W10": NO_RATE_LIMITS,
            "W11": NO_RATE_LIMITS,
            "W12": NO_PROCESS_ISOLATION,
            "W13": OURS_ONLY,
        },
        notes=(
            "Django 5.2 with the django-tasks backport; no bulk enqueue API (W2 is a loop, one "
            "transaction per 5,000); `db_worker` polls (W4 with `--interval 0.1`, not the "
            "default 1 s).",
        ),
    ),
    *(
        SystemSpec(
            f"celery{suffix}",
            f"Celery on Redis ({how})",
            "bench.systems.harness_celery",
            ("celery[redis,gevent]==5.7.0",),
            "celery",
            CELERY_LAYOUTS,
            unsupported=CELERY_UNSUPPORTED,
            notes=(*CELERY_NOTES, note),
            redis=settings,
            w7_layouts=CELERY_W7_LAYOUTS,
        )
        for suffix, how, settings, note in REDIS_KINDS
    ),
    *(
        SystemSpec(
            f"rq{suffix}",
            f"RQ on Redis ({how})",
            "bench.systems.harness_rq",
            ("rq==3.0.0",),
            "rq",
            RQ_LAYOUTS,
            unsupported=RQ_UNSUPPORTED,
            notes=(*RQ_NOTES, note),
            redis=settings,
        )
        for suffix, how, settings, note in REDIS_KINDS
    ),
    *(
        SystemSpec(
            f"dramatiq{suffix}",
            f"Dramatiq on Redis ({how})",
            "bench.systems.harness_dramatiq",
            ("dramatiq[redis]==2.2.1",),
            "dramatiq",
            {"1x4": "1 worker process, `worker_threads=4`"},
            unsupported=DRAMATIQ_UNSUPPORTED,
            notes=(*DRAMATIQ_NOTES, note),
            redis=settings,
        )
        for suffix, how, settings, note in REDIS_KINDS
    ),
]
PEER_EXTRA_LAYOUT = {"2x2": "2 processes x concurrency 2"}
WORKLOADS = (
    "W1",
    "W2",
    "W3",
    "W4",
    "W5",
    "W6",
    "W7",
    "W8",
    "W9",
    "W10",
    "W11",
    "W12",
    "W13",
)
ALL_NAMES = [spec.name for spec in SYSTEMS] + ["pgbench"]


class Unavailable(Exception):
    """A system that cannot be installed or run here; reported, not fatal."""


class HarnessError(Exception):
    """One run of a harness failed."""


# -- PostgreSQL -------------------------------------------------------------------------


def _with_postgres() -> Any:
    """scripts/with_postgres.py, which knows how to start the system server."""
    spec = importlib.util.spec_from_file_location(
        "with_postgres", ROOT / "scripts" / "with_postgres.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def postgres(database_url: str | None, extra_settings: Sequence[str] = ()) -> Iterator[str]:
    """Yield the URL of the server to benchmark on: the given one, or a durable one
    started with ``DURABLE_SETTINGS`` and then ``extra_settings`` (``name=value``)."""
    if database_url:
        yield database_url
        return
    with _with_postgres().system_server([*DURABLE_SETTINGS, *extra_settings]) as url:
        yield url


def add_server_setting_argument(parser: argparse.ArgumentParser) -> None:
    """``--server-setting NAME=VALUE`` (repeatable), for the server the benchmark starts."""
    parser.add_argument(
        "--server-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        type=_server_setting,
        help="a PostgreSQL setting for the server the benchmark starts, after the durable "
        "ones (repeatable; e.g. autovacuum_naptime=10s); recorded in the results",
    )


def script_meta(
    script: str, database_url: str | None, settings: Sequence[str] = ()
) -> dict[str, Any]:
    """What heads a script's results: when it started, the commit, the machine, and the
    server (``database_url``'s, or the one ``script`` started with ``settings``)."""
    return {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": git_commit(),
        "machine": machine(),
        "server": "given by --database-url" if database_url else started_server(script, settings),
    }


def started_server(script: str, settings: Sequence[str]) -> str:
    """The results' ``server`` line for a server that ``script`` started, with its
    ``--server-setting`` values."""
    return f"started by {script} ({', '.join(['system binaries', 'durable settings', *settings])})"


def _server_setting(value: str) -> str:
    name, sep, setting = value.partition("=")
    # An extension's settings are named with a dot (auto_explain.log_min_duration).
    if not sep or not re.fullmatch(r"[a-z_]+(\.[a-z_]+)?", name) or not setting:
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE, e.g. autovacuum_naptime=10s: {value!r}"
        )
    return value


def _connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def _with_database(url: str, name: str) -> str:
    from bench.common import with_database

    return with_database(url, name)


def server_settings(url: str) -> dict[str, str]:
    with _connect(url) as conn:
        return {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in RECORDED_SETTINGS}


def fresh_database(admin_url: str, system: str) -> str:
    """Create an empty database for ``system`` (dropping a leftover one); return its URL."""
    name = DB_PREFIX + re.sub(r"\W", "_", system)
    with _connect(admin_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return _with_database(admin_url, name)


def rerun_on_a_fresh_database(script: str, name: str, extra_settings: Sequence[str] = ()) -> int:
    """Run ``script`` again, with these arguments, on a fresh database ``name`` (its URL
    in ``BENCH_DATABASE_URL``): of ``--database-url``'s server, else of a durable one
    started as this command starts its own, with ``extra_settings`` after the durable
    ones. Return its exit status."""
    url = None
    if "--database-url" in sys.argv:
        url = sys.argv[sys.argv.index("--database-url") + 1]
    with postgres(url, extra_settings) as admin_url:
        database = fresh_database(admin_url, name)
        try:
            env = {**os.environ, "BENCH_DATABASE_URL": database}
            return subprocess.run([sys.executable, script, *sys.argv[1:]], env=env).returncode
        finally:
            drop_database(admin_url, database)


def drop_database(admin_url: str, url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with contextlib.suppress(Exception), _connect(admin_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- systems ----------------------------------------------------------------------------


def base_python(version: str) -> str:
    """An interpreter of Python ``version`` ("3.12") or later: this one when it is
    recent enough, else pyenv's build of that version, else pythonX.Y on the PATH."""
    if not version or sys.version_info[:2] >= tuple(int(part) for part in version.split(".")):
        return sys.executable
    # pyenv's own builds first: its shims on the PATH may name a version not selected.
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for candidate in sorted(pyenv.glob(f"{version}.*/bin/python"), reverse=True):
        return str(candidate)
    found = shutil.which(f"python{version}")
    if found:
        return found
    raise Unavailable(f"needs Python {version}, found neither pyenv's nor python{version}")


def ensure_venv(spec: SystemSpec, venv_dir: Path) -> str:
    """Return the interpreter for ``spec``, creating its virtualenv when needed."""
    if not spec.requirements:
        return sys.executable
    path = venv_dir / spec.name
    python = path / "bin" / "python"
    stamp = path / ".bench-requirements"
    wanted = "\n".join(spec.requirements)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return str(python)
    log(f"installing {spec.label} into {path}")
    try:
        if not python.exists():
            subprocess.run(
                [base_python(spec.python), "-m", "venv", str(path)],
                check=True,
                capture_output=True,
            )
        subprocess.run(
            [
                str(python),
                *("-m", "pip", "install", "--quiet", "--disable-pip-version-check"),
                *spec.requirements,
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or str(exc)).strip().splitlines()
        raise Unavailable(f"pip install failed: {tail[-1] if tail else exc}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"cannot create its virtualenv: {exc}") from None
    stamp.write_text(wanted)
    return str(python)


def distribution_version(python: str, distribution: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return result.stdout.strip()


def harness_environment(path: Path, extra: dict[str, str]) -> dict[str, str]:
    """The environment of a harness process that imports ``bench`` from ``path``:
    this one's, with ``extra`` added and no Django settings module of ours."""
    env = {**os.environ, **extra, "PYTHONPATH": str(path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


def harness(
    python: str,
    module: str,
    dsn: str,
    *args: str,
    timeout: float,
    path: Path = ROOT,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one harness command in its own process group; return its JSON result.

    ``path``: its working directory and ``PYTHONPATH``, where ``bench`` is imported from;
    ``env``: variables added to its environment.
    """
    process = subprocess.Popen(
        [python, "-m", module, "--dsn", dsn, *args],
        cwd=path,
        env=harness_environment(path, env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise HarnessError(f"timed out after {timeout:.0f}s") from None
    finally:
        # Workers it started must not outlive it, whatever happened.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    if process.returncode != 0:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        raise HarnessError(lines[-1][:200] if lines else f"exit status {process.returncode}")
    return json.loads(out.strip().splitlines()[-1])


@dataclass
class Prepared:
    spec: SystemSpec
    python: str
    dsn: str
    #: A second database holding the W5 finished rows, so that W3 and W5 runs alternate.
    history: str
    layouts: dict[str, str]
    #: Variables for its harness's environment (``BENCH_REDIS_URL``).
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, history: bool = False, timeout: float = 1800) -> dict[str, Any]:
        dsn = self.history if history else self.dsn
        path = self.spec.harness_path or ROOT
        return harness(
            self.python, self.spec.module, dsn, *args, timeout=timeout, path=path, env=self.env
        )


# -- pgbench ----------------------------------------------------------------------------


def pgbench_binary() -> str:
    found = shutil.which("pgbench")
    if found:
        return found
    with contextlib.suppress(SystemExit):
        candidate = Path(_with_postgres()._system_bindir()) / "pgbench"
        if candidate.exists():
            return str(candidate)
    raise Unavailable("pgbench not found (it ships with the PostgreSQL server packages)")


def fill_pgbench_jobs(dsn: str, jobs: int) -> None:
    """An empty ``pgqueue_jobs`` filled with ``jobs`` due no-op jobs, analysed."""
    with _connect(dsn) as conn:
        conn.execute("TRUNCATE pgqueue_jobs CASCADE")
        conn.execute(
            "INSERT INTO pgqueue_jobs (job_type, data, created_at) "
            "SELECT 'bench.noop', jsonb_build_object('i', g), clock_timestamp() "
            "FROM generate_series(1, %s) AS g",
            [jobs],
        )
        conn.execute("ANALYZE pgqueue_jobs")  # as the harnesses do before a drain


def pgbench_drain(binary: str, dsn: str, jobs: int, batch: int) -> float:
    """Claim and complete the ``jobs`` rows :func:`fill_pgbench_jobs` left, with
    ``PGBENCH_CLIENTS`` clients each claiming up to ``batch`` a round and completing the
    round before's in the same transaction; return the seconds taken, with those of
    completing every client's last claim after pgbench."""
    # One round more than the claims need: a client's last round completes its claim.
    per_client = math.ceil(jobs / (PGBENCH_CLIENTS * batch)) + 1
    command = [
        binary,
        "-n",
        "-M",
        "extended",
        "-c",
        str(PGBENCH_CLIENTS),
        "-j",
        "2",
        "-t",
        str(per_client),
        "-D",
        f"batch={batch}",
        "-D",
        "ids={}",
        "-f",
        str(PGBENCH_SCRIPT),
        dsn,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", result.stdout)
    if result.returncode != 0 or not match:
        raise HarnessError((result.stderr.strip().splitlines() or ["pgbench failed"])[-1])
    seconds = PGBENCH_CLIENTS * per_client / float(match.group(1))
    with _connect(dsn) as conn:
        began = time.perf_counter()
        # Claims a client made in its last round, when SKIP LOCKED left it more to do.
        conn.execute(
            "UPDATE pgqueue_jobs SET status = 'completed', progress = 100, "
            "completed_at = now() WHERE worker_id = 'pgbench' AND status = 'running'"
        )
        seconds += time.perf_counter() - began
        done = conn.execute("SELECT count(*) FROM pgqueue_jobs WHERE status = 'completed'")
        completed = done.fetchone()[0]
    if completed != jobs:
        raise HarnessError(f"pgbench completed {completed} of {jobs} jobs")
    return seconds


def run_pgbench(binary: str, dsn: str, jobs: int, batch: int) -> dict[str, Any]:
    """Claim-and-complete ``jobs`` pre-filled rows with pgbench; return the job rate."""
    fill_pgbench_jobs(dsn, jobs)
    seconds = pgbench_drain(binary, dsn, jobs, batch)
    return {"jobs": jobs, "seconds": seconds, "rate": jobs / seconds}


# -- the benchmark ----------------------------------------------------------------------

_started = time.monotonic()


def log(message: str) -> None:
    elapsed = int(time.monotonic() - _started)
    print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {message}", file=sys.stderr, flush=True)


#: A harness call for a given number of jobs.
Measure = Callable[[int], dict[str, Any]]
FigureKey = tuple[str, str, str]


class Bench:
    """Runs the workloads, interleaving systems within each run so that a noisy moment
    of the machine falls on all of them alike."""

    def __init__(
        self, results: Results, sizes: Sizes, workloads: frozenset[str] = frozenset(WORKLOADS)
    ) -> None:
        self.results = results
        self.sizes = sizes
        #: The workloads to run (``--workloads``); W5 runs beside W3 only.
        self.workloads = workloads
        self.systems: list[Prepared] = []
        self.pgbench: tuple[str, str] | None = None
        #: Jobs per run, by figure (system, workload, variant), once chosen.
        self.jobs: dict[FigureKey, int] = {}

    def record(
        self,
        figure: Figure,
        what: str,
        call: Any,
        *,
        key: str = "rate",
        scale: float = 1.0,
    ) -> dict[str, Any] | None:
        try:
            result = call()
        except (HarnessError, Unavailable, OSError, subprocess.SubprocessError) as exc:
            figure.error = f"error: {exc}"
            log(f"{what}: FAILED: {exc}")
            return None
        figure.values.append(result[key] * scale)
        if "jobs" in result:
            figure.jobs.append(result["jobs"])
        log(f"{what}: {result[key] * scale:,.{3 if key == 'ratio' else 1}f}")
        return result

    def each_run(self) -> Iterator[int]:
        yield from range(1, self.sizes.runs + 1)

    def in_turn(self, run: int) -> list[Prepared]:
        """The systems in the order of run ``run``: each run starts one system later, so
        that no system always runs first (a drain leaves the server busier than it found
        it for a moment: checkpoints, autovacuum, caches) and the ratios of one run carry
        no bias of order."""
        turn = (run - 1) % max(len(self.systems), 1)
        return self.systems[turn:] + self.systems[:turn]

    def size(self, key: FigureKey, nominal: int, measure: Measure) -> int:
        """Jobs per run of figure ``key``: ``nominal``, unless a calibration run shows
        that the system needs far longer than the budget for it."""
        if key in self.jobs:
            return self.jobs[key]
        jobs = nominal
        budget = self.sizes.budget
        if budget and nominal >= 2000:
            probe = max(500, nominal // SMALLEST_SHARE)
            try:
                rate = measure(probe)["rate"]
            except (HarnessError, OSError, subprocess.SubprocessError, KeyError):
                rate = 0.0
            if rate and nominal / rate > 1.5 * budget:
                # Not below the calibration's size: it is short and noisy already.
                jobs = max(probe, int(rate * budget) // 100 * 100)
                label = " ".join(part for part in key if part)
                log(f"{label}: {rate:,.0f} jobs/s on {probe:,}: {jobs:,} jobs per run")
        self.jobs[key] = jobs
        return jobs

    def throughput(
        self, key: FigureKey, run: int, nominal: int, measure: Measure, jobs: int | None = None
    ) -> None:
        """One run of a jobs/s figure (sized by :meth:`size` unless ``jobs`` is given)."""
        figure = self.results.figure(*key)
        figure.nominal = nominal
        if jobs is None:
            jobs = self.size(key, nominal, measure)
        label = " ".join(part for part in (key[1], f"run {run}", key[0], key[2]) if part)
        result = self.record(figure, f"{label} ({jobs:,} jobs)", lambda: measure(jobs))
        for side in report.CPU_SIDES:
            if result and result.get(f"{side}_cpu") is not None and result.get("jobs"):
                cpu = self.results.figure(key[0], f"{key[1]}-{side}-cpu", key[2])
                cpu.values.append(1e6 * result[f"{side}_cpu"] / result["jobs"])

    def enqueue(self, workload: str, command: str, nominal: int) -> None:
        pgqueue = self._pgqueue()
        for run in self.each_run():
            for system in self.in_turn(run):
                self.throughput(
                    (system.spec.name, workload, ""),
                    run,
                    nominal,
                    lambda n, s=system: s.run(command, "--jobs", str(n)),
                )
            if workload == "W1" and pgqueue:
                for build in self._pgqueue_builds():
                    self.throughput(
                        (build.spec.name, "W1", "prepared"),
                        run,
                        nominal,
                        lambda n, p=build: p.run("enqueue-single-prepared", "--jobs", str(n)),
                    )
                self.throughput(
                    ("reference", "W1", "bare INSERT"),
                    run,
                    nominal,
                    lambda n, p=pgqueue: p.run("baseline-insert", "--jobs", str(n)),
                )
                # The target's ratio: both interleaved in one run (harness docstring).
                self.record(
                    self.results.figure("pgqueue", "W1-ratio"),
                    f"W1 run {run} pgqueue interleaved with the bare INSERT, ratio",
                    lambda p=pgqueue: p.run("enqueue-single-paired", "--jobs", str(nominal)),
                    key="ratio",
                )

    def _pgqueue(self) -> Prepared | None:
        return next((s for s in self.systems if s.spec.name == "pgqueue"), None)

    def _pgqueue_builds(self) -> list[Prepared]:
        """The working tree's django-pgqueue, then the baseline's, if benchmarked."""
        return [s for s in self.systems if s.spec.name in ("pgqueue", baseline.NAME)]

    def drain(self, workload: str, nominal: int, *, kind: str = "noop") -> None:
        """W3 (each run followed by the same run of W5, in the database with the finished
        rows: the W5 slowdown compares runs made side by side), or W6."""
        for run in self.each_run():
            for system in self.in_turn(run):
                name = system.spec.name
                layouts = list(system.layouts)
                if workload == "W7":
                    layouts = list(system.spec.w7_layouts) or layouts[:1]
                elif workload not in self.sizes.every_layout:
                    layouts = layouts[:1]
                for layout in layouts:
                    key = (name, workload, layout)
                    if workload in system.spec.unsupported:
                        self.results.figure(*key).error = system.spec.unsupported[workload]
                        continue
                    args = ["drain", "--layout", layout, "--kind", kind]
                    self.throughput(
                        key,
                        run,
                        nominal,
                        lambda n, s=system, a=args: s.run(*a, "--jobs", str(n)),
                    )
                    paired = "W5" in self.sizes.every_layout or layout == layouts[0]
                    if (
                        workload == "W3"
                        and "W5" in self.workloads
                        and "W5" not in system.spec.unsupported
                        and paired
                        and (name, "W3", layout) in self.jobs
                    ):
                        self.throughput(
                            (name, "W5", layout),
                            run,
                            nominal,
                            lambda n, s=system, a=args: s.run(
                                *a, "--keep", "--jobs", str(n), history=True
                            ),
                            jobs=self.jobs[(name, "W3", layout)],
                        )
            if workload == "W3" and self.pgbench:
                binary, dsn = self.pgbench
                self.throughput(
                    ("pgbench", "W3", f"batch {CEILING_BATCH}"),
                    run,
                    nominal,
                    lambda n, x=binary, d=dsn: run_pgbench(x, d, n, CEILING_BATCH),
                )

    def rate_limit(self) -> None:
        """W10: a backlog under a rate limit, run by ``W10_LAYOUT`` workers: the rate
        kept over the measured seconds, and the most starts in any second."""
        rate, seconds = self.sizes.w10_rate, self.sizes.w10_seconds
        for run in self.each_run():
            for system in self.in_turn(run):
                name = system.spec.name
                kept = self.results.figure(name, "W10", W10_LAYOUT)
                peak = self.results.figure(name, "W10-peak", W10_LAYOUT)
                if "W10" in system.spec.unsupported:
                    kept.error = peak.error = system.spec.unsupported["W10"]
                    continue
                args = ["rate-limit", "--rate", str(rate), "--seconds", f"{seconds:g}"]
                result = self.record(
                    kept,
                    f"W10 run {run} {name} jobs/s under {rate}/s",
                    lambda s=system, a=args: s.run(*a, "--layout", W10_LAYOUT),
                )
                if result:
                    peak.values.append(result["peak"])
                else:
                    peak.error = kept.error

    def latency(self) -> None:
        for run in self.each_run():
            for system in self.in_turn(run):
                p50 = self.results.figure(system.spec.name, "W4-p50")
                p99 = self.results.figure(system.spec.name, "W4-p99")
                layout = next(iter(system.layouts))
                result = self.record(
                    p50,
                    f"W4 run {run} {system.spec.name} p50 ms",
                    lambda s=system, layout=layout: _percentiles(
                        s.run("latency", "--samples", str(self.sizes.w4), "--layout", layout)
                    ),
                    key="p50",
                    scale=1000,
                )
                if result:
                    p99.values.append(result["p99"] * 1000)
                else:
                    p99.error = p50.error

    def chain_latency(self) -> None:
        """W8's chain: the time from each step's finish to the next step's start."""
        for run in self.each_run():
            for system in self.in_turn(run):
                p50 = self.results.figure(system.spec.name, "W8-chain-p50")
                p95 = self.results.figure(system.spec.name, "W8-chain-p95")
                if "W8" in system.spec.unsupported:
                    p50.error = p95.error = system.spec.unsupported["W8"]
                    continue
                layout = next(iter(system.layouts))
                result = self.record(
                    p50,
                    f"W8 run {run} {system.spec.name} chain step-to-step p50 ms",
                    lambda s=system, layout=layout, n=str(self.sizes.w8_chain): _percentiles(
                        s.run("chain", "--steps", n, "--layout", layout)
                    ),
                    key="p50",
                    scale=1000,
                )
                if result:
                    p95.values.append(result["p95"] * 1000)
                else:
                    p95.error = p50.error


def _percentiles(result: dict[str, Any]) -> dict[str, Any]:
    samples = sorted(result["samples"])
    if not samples:
        raise HarnessError("no latency sample")
    p95_index = min(len(samples) - 1, math.ceil(0.95 * len(samples)) - 1)
    p99_index = min(len(samples) - 1, math.ceil(0.99 * len(samples)) - 1)
    return {
        "p50": statistics.median(samples),
        "p95": samples[p95_index],
        "p99": samples[p99_index],
    }


def prepare(
    bench: Bench,
    specs: Sequence[SystemSpec],
    admin_url: str,
    args: Any,
    services: contextlib.ExitStack,
) -> None:
    """Install, create a database for and set up each system; unavailable ones are noted.

    A system that needs Redis gets its own ``redis-server``, stopped with ``services``.
    """
    for spec in specs:
        info = next(s for s in bench.results.systems if s.name == spec.name)
        try:
            python = ensure_venv(spec, Path(args.venv_dir))
            info.version = distribution_version(python, spec.distribution)
            path = spec.harness_path or ROOT
            env = {}
            if spec.redis is not None:
                try:
                    env["BENCH_REDIS_URL"] = services.enter_context(
                        redis_server.redis_server(spec.redis)
                    )
                except redis_server.RedisUnavailable as exc:
                    raise Unavailable(str(exc)) from None
            dsn = fresh_database(admin_url, spec.name)
            harness(python, spec.module, dsn, "setup", timeout=300, path=path, env=env)
            history = fresh_database(admin_url, f"{spec.name}_w5")
            harness(python, spec.module, history, "setup", timeout=300, path=path, env=env)
            if "W5" in bench.workloads and "W5" not in spec.unsupported:
                rows = str(bench.sizes.w5_rows)
                filled = harness(
                    python,
                    spec.module,
                    history,
                    "fill-finished",
                    "--rows",
                    rows,
                    timeout=1800,
                    path=path,
                )
                log(
                    f"{spec.label}: {bench.sizes.w5_rows:,} finished rows "
                    f"in {filled['seconds']:.1f}s"
                )
        except (Unavailable, HarnessError) as exc:
            info.status = f"unavailable: {exc}"
            log(f"{spec.label}: {info.status}")
            continue
        layouts = dict(spec.layouts)
        if args.all_layouts and spec.requirements and spec.redis is None and "4x1" not in layouts:
            layouts.update(PEER_EXTRA_LAYOUT)
        info.slots = layouts
        info.w7_slots = dict(spec.w7_layouts)
        bench.systems.append(Prepared(spec, python, dsn, history, layouts, env))
        log(f"{spec.label} {info.version}: ready")


def prepare_pgbench(bench: Bench, admin_url: str) -> None:
    info = next(s for s in bench.results.systems if s.name == "pgbench")
    ours = next(s for s in SYSTEMS if s.name == "pgqueue")
    try:
        binary = pgbench_binary()
        dsn = fresh_database(admin_url, "pgbench")
        harness(sys.executable, ours.module, dsn, "setup", timeout=300)
        version = subprocess.run([binary, "--version"], capture_output=True, text=True)
        found = re.search(r"\d+(\.\d+)+", version.stdout)
        info.version = found.group(0) if found else ""
    except (Unavailable, HarnessError, OSError) as exc:
        info.status = f"unavailable: {exc}"
        log(f"pgbench: {info.status}")
        return
    info.slots = {
        f"batch {CEILING_BATCH}": f"{PGBENCH_CLIENTS} clients, claim up to {CEILING_BATCH} "
        "a round, completing the round before's in the same transaction",
    }
    bench.pgbench = (binary, dsn)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}"


def git_commit() -> str:
    result = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or "unknown"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="1 run each, smaller sizes")
    mode.add_argument(
        "--smoke",
        action="store_true",
        help="a few hundred jobs, 1 run, no chart (what the test suite runs)",
    )
    parser.add_argument("--runs", type=int, default=None, help="runs per figure (default: 1)")
    parser.add_argument(
        "--systems",
        default=None,
        help=f"comma-separated, from {','.join(ALL_NAMES)} (default: all; --smoke: pgqueue)",
    )
    add_server_setting_argument(parser)
    parser.add_argument(
        "--database-url",
        default=None,
        help="use this PostgreSQL server (a role that may create databases) instead of "
        "starting one",
    )
    parser.add_argument(
        "--results-dir",
        default=None,
        help="where to write results.md/json and chart.png "
        "(default: bench/results; --smoke: nowhere)",
    )
    parser.add_argument(
        "--venv-dir",
        default=os.environ.get(
            "PGQUEUE_BENCH_VENVS", str(Path.home() / ".cache" / "pgqueue-bench" / "venvs")
        ),
        help="where the peers' virtualenvs live (default: %(default)s)",
    )
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    parser.add_argument(
        "--all-layouts",
        action="store_true",
        help="also run the peers with 2 processes x 2 slots",
    )
    parser.add_argument(
        "--keep-databases", action="store_true", help="leave the benchmark databases behind"
    )
    parser.add_argument(
        "--workloads",
        type=_workloads,
        default=frozenset(WORKLOADS),
        help=f"comma-separated, from {','.join(WORKLOADS)} (default: all; W5 needs W3)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        default=None,
        help="also run django-pgqueue as of commit REV (system pgqueue-before) and report "
        "each figure's ratio to it (bench/baseline.py)",
    )
    return parser.parse_args(argv)


def _workloads(value: str) -> frozenset[str]:
    chosen = frozenset(name.strip().upper() for name in value.split(",") if name.strip())
    unknown = sorted(chosen - set(WORKLOADS))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown workloads {unknown}; choose from {WORKLOADS}")
    return chosen


def baseline_spec(rev: str, venv_dir: Path) -> SystemSpec:
    """django-pgqueue at ``rev``, driven by this tree's harness (bench/baseline.py)."""
    commit = baseline.resolve(rev)
    ours = next(spec for spec in SYSTEMS if spec.name == "pgqueue")
    source = baseline.checkout(commit, venv_dir)
    return dataclasses.replace(
        ours,
        name=baseline.NAME,
        label=f"django-pgqueue at {commit[:9]}",
        requirements=baseline.requirements(source),
        notes=(f"The package as of {commit[:9]} ({rev}), with this tree's harness.",),
        # Per-key limits may be newer than the baseline: compare W9 with W3 instead.
        unsupported={
            "W8": "n/a: compared with W3 of the same run",
            "W9": "n/a: compared with W3 of the same run",
            "W10": "n/a: measured against the limit, not the baseline",
            "W11": "n/a: compared with W3 of the same run",
        },
        harness_path=baseline.harness_path(venv_dir),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.runs:
        sizes = Sizes(**{**sizes.__dict__, "runs": args.runs})
    default_systems = "pgqueue" if args.smoke else ",".join(ALL_NAMES)
    names = [n.strip() for n in (args.systems or default_systems).split(",") if n.strip()]
    unknown = sorted(set(names) - set(ALL_NAMES))
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; choose from {ALL_NAMES}")
    specs = [spec for spec in SYSTEMS if spec.name in names]
    if args.baseline:
        before = baseline_spec(args.baseline, Path(args.venv_dir))
        specs.insert(1 if specs and specs[0].name == "pgqueue" else 0, before)
    results_dir = Path(args.results_dir) if args.results_dir else None
    if results_dir is None and not args.smoke:
        results_dir = ROOT / "bench" / "results"

    started = datetime.now(UTC)
    infos = [
        SystemInfo(spec.name, spec.label, notes=list(spec.notes), on_redis=spec.redis is not None)
        for spec in specs
    ]
    if "pgbench" in names:
        infos.append(
            SystemInfo(
                "pgbench",
                "pgbench ceiling",
                notes=[
                    "bare claim-and-complete SQL of django-pgqueue's shape "
                    "(bench/pgbench/claim_complete.sql) on `pgqueue_jobs`, "
                    f"{PGBENCH_CLIENTS} clients, one transaction a round (the last "
                    "round's completions and the next claim, as a worker's cycle)"
                ],
            )
        )
    results = Results(
        meta={
            "started": started.strftime("%Y-%m-%d %H:%M UTC"),
            "mode": "smoke" if args.smoke else "quick" if args.quick else "full",
            "w10_rate": sizes.w10_rate,
            "runs": sizes.runs,
            "sizes": sizes.describe(),
            "workloads": ", ".join(sorted(args.workloads)),
            "machine": machine(),
            "commit": git_commit(),
            "server": "given by --database-url"
            if args.database_url
            else started_server("bench/run.py", args.server_setting),
            "notes": [
                "Drains are timed from the moment every worker process is set up and "
                "ready (imports and start-up excluded) until the last job is recorded as "
                "finished in the database (the workers' own shutdown excluded); enqueues "
                "run in one client, each transaction committed before the next.",
                "W4 measures from the enqueueing transaction's commit returning to the "
                "job's handler starting (both clocks: the machine's monotonic clock).",
                *(
                    [
                        f"A system that would need more than {1.5 * sizes.budget:g} s for one "
                        f"run (estimated by a calibration run of 1/{SMALLEST_SHARE} of the "
                        f"size) does about "
                        f"{sizes.budget:g} s worth of jobs per run instead (at least that "
                        "calibration's size), the same number in every run: [n=...] in a "
                        "cell. Rates stay comparable."
                    ]
                    if sizes.budget
                    else []
                ),
            ],
        },
        systems=infos,
    )
    bench = Bench(results, sizes, args.workloads)
    log(f"benchmark: {results.meta['mode']} mode, systems {', '.join(names)}")
    with (
        postgres(args.database_url, args.server_setting) as admin_url,
        contextlib.ExitStack() as services,
    ):
        results.meta["settings"] = server_settings(admin_url)
        log(f"server: {admin_url} {results.meta['settings']}")
        prepare(bench, specs, admin_url, args, services)
        if "pgbench" in names:
            prepare_pgbench(bench, admin_url)
        try:
            if "W1" in bench.workloads:
                bench.enqueue("W1", "enqueue-single", sizes.w1)
            if "W2" in bench.workloads:
                bench.enqueue("W2", "enqueue-bulk", sizes.w2)
            if "W3" in bench.workloads:
                bench.drain("W3", sizes.w3)
            if "W4" in bench.workloads:
                bench.latency()
            if "W6" in bench.workloads:
                bench.drain("W6", sizes.w6, kind="cpu_flaky")
            if "W7" in bench.workloads:
                bench.drain("W7", sizes.w7, kind="io_wait")
            if "W12" in bench.workloads:
                bench.drain("W12", sizes.w12, kind="noop_isolated")
            if "W13" in bench.workloads:
                bench.drain("W13", sizes.w13, kind="writes_row")
            if "W8" in bench.workloads:
                bench.drain("W8", sizes.w8, kind="chord")
                bench.chain_latency()
            if "W9" in bench.workloads:
                bench.drain("W9", sizes.w9, kind="keyed")
            if "W10" in bench.workloads:
                bench.rate_limit()
            if "W11" in bench.workloads:
                bench.drain("W11", sizes.w11, kind="rated_keys")
        finally:
            if not args.keep_databases:
                for system in bench.systems:
                    drop_database(admin_url, system.dsn)
                    drop_database(admin_url, system.history)
                if bench.pgbench:
                    drop_database(admin_url, bench.pgbench[1])
    elapsed = int(time.monotonic() - _started)
    results.meta["duration"] = f"{elapsed // 60} min {elapsed % 60} s"

    text = report.markdown(results)
    if results_dir:
        results_dir.mkdir(parents=True, exist_ok=True)
        (results_dir / "results.md").write_text(text)
        (results_dir / "results.json").write_text(json.dumps(results.to_json(), indent=2))
        if not args.no_chart and not args.smoke:
            report.chart(results, results_dir / "chart.png")
        log(f"wrote {results_dir}")
    print(text)
    for line in report.summary_lines(results):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
