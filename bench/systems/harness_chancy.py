"""Harness for Chancy (run in its own virtualenv by bench/run.py).

Jobs are ``async def`` functions run by its asyncio executor, the fastest of its
executors for no-op work (no process or thread to hand a job to); the queue is declared
with ``concurrency=4``, ``polling_interval=1`` (its smallest, in whole seconds) and
``eager_polling=True`` (poll again as soon as a job finishes), and notifications on (its
default: a push wakes the workers). A worker process is a ``Worker`` with its default
plugins, its logger set to errors only (as every system here: its default writes a line
per job). Chancy has no burst mode: a burst worker stops once no job of the queue is
left pending, running or retrying (looked at every 20 ms). W3 is timed to the last
job's ``completed_at``, the moment its executor finished it (the worker writes the
outcomes of a second together).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from typing import Any

from chancy import Chancy, Job, Queue, QueuedJob, Worker

from bench import common

MODULE = "bench.systems.harness_chancy"
TABLE = "chancy_jobs"
#: How often a burst worker looks whether jobs are left.
BURST_CHECK_SECONDS = 0.02
QUEUE = Queue(
    "default",
    concurrency=4,
    executor=Chancy.Executor.Async,
    polling_interval=1,
    eager_polling=True,
)


async def noop(i: int, probe: bool = False) -> None:
    if probe:
        common.probe(i)


async def cpu_flaky(i: int, *, context: QueuedJob) -> None:
    """W6: burn a millisecond of CPU; every tenth job fails its first attempt."""
    common.burn_cpu()
    if context.attempts == 0 and common.fails_first_attempt(i):
        raise common.FlakyJobError(i)


# Chancy hands the job to a keyword-only parameter annotated with QueuedJob, a class:
# this module's annotations are strings (``from __future__ import annotations``).
cpu_flaky.__annotations__["context"] = QueuedJob
#: W6's jobs may run twice: a failed attempt is retried at once (Chancy's default, with
#: no retry plugin: the job is due again as soon as it is marked ``retrying``).
FLAKY_ATTEMPTS = 3


def _chancy(dsn: str, pool_size: int = 2) -> Chancy:
    # Errors only, as every system here: its default logger writes a line per job.
    log = logging.getLogger("bench.chancy")
    log.setLevel(logging.ERROR)
    if not log.handlers:
        log.addHandler(logging.StreamHandler())
    return Chancy(dsn, min_connection_pool_size=1, max_connection_pool_size=pool_size, log=log)


async def _sql(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(query, params)
        return await cursor.fetchall() if cursor.description else []


async def _succeeded(dsn: str) -> int:
    rows = await _sql(dsn, f"SELECT count(*) FROM {TABLE} WHERE state = 'succeeded'")
    return rows[0][0]


async def _truncate(dsn: str) -> None:
    await _sql(dsn, f"TRUNCATE {TABLE}")


def _job(i: int, probe: bool = False, kind: str = "noop") -> Job:
    if kind == "cpu_flaky":
        return Job.from_func(cpu_flaky, kwargs={"i": i}).with_max_attempts(FLAKY_ATTEMPTS)
    return Job.from_func(noop, kwargs={"i": i, "probe": probe} if probe else {"i": i})


async def _enqueue_bulk(chancy: Chancy, jobs: int, chunk: int, kind: str = "noop") -> None:
    for start in range(0, jobs, chunk):
        part = [_job(i, kind=kind) for i in range(start, min(start + chunk, jobs))]
        # One transaction per chunk, as the other systems' bulk enqueues.
        async for _ in chancy.push_many(part, batch_size=chunk):
            pass


async def setup(args: Any) -> dict[str, Any]:
    async with _chancy(args.dsn) as chancy:
        await chancy.migrate()
        await chancy.declare(QUEUE, upsert=True)
    return {"ok": True}


async def enqueue_single(args: Any) -> dict[str, Any]:
    await _truncate(args.dsn)
    async with _chancy(args.dsn) as chancy:
        began = time.perf_counter()
        for i in range(args.jobs):
            await chancy.push(_job(i))
        return common.rate(args.jobs, time.perf_counter() - began)


async def enqueue_bulk(args: Any) -> dict[str, Any]:
    await _truncate(args.dsn)
    async with _chancy(args.dsn) as chancy:
        began = time.perf_counter()
        await _enqueue_bulk(chancy, args.jobs, args.chunk)
        return common.rate(args.jobs, time.perf_counter() - began)


async def drain(args: Any) -> dict[str, Any]:
    processes, slots = common.parse_layout(args.layout)
    if args.kind not in ("noop", "cpu_flaky"):
        raise RuntimeError(f"no {args.kind} jobs in this harness")
    if not args.keep:
        await _truncate(args.dsn)
    else:
        await _sql(args.dsn, f"VACUUM {TABLE}")  # see --keep
    async with _chancy(args.dsn) as chancy:
        await _enqueue_bulk(chancy, args.jobs, 5000, args.kind)
    await _sql(args.dsn, f"ANALYZE {TABLE}")  # statistics as autovacuum would leave them
    before = await _succeeded(args.dsn)
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, True)] * processes
    )
    group.go()
    start, end = await asyncio.to_thread(group.wait)
    done = await _succeeded(args.dsn) - before
    if done != args.jobs:
        raise RuntimeError(f"{done} of {args.jobs} jobs succeeded")
    if args.kind == "cpu_flaky":
        retried = (await _sql(args.dsn, f"SELECT count(*) FROM {TABLE} WHERE attempts > 1"))[0][0]
        common.check_retried(retried, args.jobs)
    rows = await _sql(
        args.dsn,
        f"SELECT extract(epoch FROM max(completed_at)) FROM {TABLE} WHERE state = 'succeeded'",
    )
    return common.drain_rate(args.jobs, start, float(rows[0][0]), end)


async def latency(args: Any) -> dict[str, Any]:
    await _truncate(args.dsn)
    receiver = common.ProbeReceiver()
    env = {**os.environ, "BENCH_PROBE_PORT": str(receiver.port)}
    _, slots = common.parse_layout(args.layout)
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, False)], env=env
    )
    samples = []
    try:
        group.go()
        await asyncio.sleep(1.0)
        async with _chancy(args.dsn) as chancy:
            for i in range(args.samples):
                await chancy.push(_job(i, probe=True))
                committed = time.monotonic()
                started = await asyncio.to_thread(receiver.wait, i)
                samples.append(started - committed)
                await asyncio.sleep(common.sample_pause(i))
    finally:
        group.terminate()
        receiver.close()
    return {"samples": samples}


async def fill_finished(args: Any) -> dict[str, Any]:
    began = time.perf_counter()
    await _sql(
        args.dsn,
        f"""
        INSERT INTO {TABLE} (id, queue, func, kwargs, state, attempts, completed_at)
        SELECT gen_random_uuid(), 'default', %s, jsonb_build_object('i', g), 'succeeded', 1,
               now()
          FROM generate_series(1, %s) AS g
        """,
        [_job(0).func, args.rows],
    )
    await _sql(args.dsn, f"VACUUM ANALYZE {TABLE}")
    return {"rows": args.rows, "seconds": time.perf_counter() - began}


async def _left(conn: Any) -> int:
    cursor = await conn.execute(
        f"SELECT count(*) FROM {TABLE} WHERE state IN ('pending', 'running', 'retrying')"
    )
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def _run_worker(args: Any) -> None:
    import psycopg

    # A connection per slot, one for its notifications, one for the rest; and the
    # burst's own, to look whether jobs are left.
    async with (
        _chancy(args.dsn, args.slots + 2) as chancy,
        Worker(chancy, register_signal_handlers=False) as worker,
        await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn,
    ):
        if not args.burst:
            await worker.wait_for_shutdown()
        while await _left(conn):
            await asyncio.sleep(BURST_CHECK_SECONDS)


def worker(args: Any) -> None:
    common.async_worker_entry(lambda: _run_worker(args))


COMMANDS = {
    "setup": setup,
    "enqueue-single": enqueue_single,
    "enqueue-bulk": enqueue_bulk,
    "drain": drain,
    "latency": latency,
    "fill-finished": fill_finished,
}


def main() -> None:
    common.harness_main(__doc__.splitlines()[0], COMMANDS, worker, run=asyncio.run)


if __name__ == "__main__":
    sys.exit(main())
