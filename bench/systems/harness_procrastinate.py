"""Harness for Procrastinate (run in its own virtualenv by bench/run.py).

Tasks are ``async def`` (Procrastinate's recommended form when a worker runs several
jobs at once); a worker process is ``app.run_worker_async(concurrency=SLOTS)``, with
``wait=False`` to stop once the queue is empty. W6 retries at once
(``RetryStrategy(max_attempts=3)``, no wait).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import procrastinate

from bench import common

MODULE = "bench.systems.harness_procrastinate"
TABLE = "procrastinate_jobs"
#: The most connections a worker's pool opens (the server allows 200 in all).
POOL_MAX = 50


def _app(dsn: str, pool_size: int = 1) -> procrastinate.App:
    """The benchmark's App on ``dsn``, its pool capped at ``pool_size`` connections."""
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=dsn, min_size=1, max_size=max(pool_size, 1)
        )
    )

    @app.task(name="bench.noop")
    async def noop(i: int, probe: bool = False) -> None:
        if probe:
            common.probe(i)

    @app.task(name="bench.io_wait")
    async def io_wait(i: int) -> None:
        await asyncio.sleep(common.IO_WAIT_SECONDS)

    @app.task(
        name="bench.cpu_flaky",
        pass_context=True,
        retry=procrastinate.RetryStrategy(max_attempts=3),
    )
    async def cpu_flaky(context: procrastinate.JobContext, i: int) -> None:
        common.burn_cpu()
        assert context.job is not None
        if context.job.attempts == 0 and common.fails_first_attempt(i):
            raise common.FlakyJobError(i)

    return app


async def _sql(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(query, params)
        return await cursor.fetchall() if cursor.description else []


async def _succeeded(dsn: str) -> int:
    rows = await _sql(dsn, f"SELECT count(*) FROM {TABLE} WHERE status = 'succeeded'")
    return rows[0][0]


async def _truncate(dsn: str) -> None:
    await _sql(dsn, f"TRUNCATE {TABLE} CASCADE")


async def _enqueue_bulk(task: Any, jobs: int, chunk: int) -> None:
    for start in range(0, jobs, chunk):
        await task.batch_defer_async(*({"i": i} for i in range(start, min(start + chunk, jobs))))


async def setup(args: Any) -> dict[str, Any]:
    async with _app(args.dsn).open_async() as app:
        await app.schema_manager.apply_schema_async()
    return {"ok": True}


async def enqueue_single(args: Any) -> dict[str, Any]:
    await _truncate(args.dsn)
    async with _app(args.dsn).open_async() as app:
        noop = app.tasks["bench.noop"]
        began = time.perf_counter()
        for i in range(args.jobs):
            await noop.defer_async(i=i)
        return common.rate(args.jobs, time.perf_counter() - began)


async def enqueue_bulk(args: Any) -> dict[str, Any]:
    await _truncate(args.dsn)
    async with _app(args.dsn).open_async() as app:
        began = time.perf_counter()
        await _enqueue_bulk(app.tasks["bench.noop"], args.jobs, args.chunk)
        return common.rate(args.jobs, time.perf_counter() - began)


async def drain(args: Any) -> dict[str, Any]:
    processes, slots = common.parse_layout(args.layout)
    if not args.keep:
        await _truncate(args.dsn)
    else:
        await _sql(args.dsn, f"VACUUM {TABLE}")  # see --keep
    async with _app(args.dsn).open_async() as app:
        await _enqueue_bulk(app.tasks[f"bench.{args.kind}"], args.jobs, 5000)
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
    rows = await _sql(
        args.dsn,
        "SELECT extract(epoch FROM max(at)) FROM procrastinate_events WHERE type = 'succeeded'",
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
        async with _app(args.dsn).open_async() as app:
            noop = app.tasks["bench.noop"]
            for i in range(args.samples):
                await noop.defer_async(i=i, probe=True)
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
        INSERT INTO {TABLE} (queue_name, task_name, args, status, attempts)
        SELECT 'default', 'bench.noop', jsonb_build_object('i', g), 'succeeded', 1
          FROM generate_series(1, %s) AS g
        """,
        [args.rows],
    )
    await _sql(args.dsn, f"VACUUM ANALYZE {TABLE}")
    return {"rows": args.rows, "seconds": time.perf_counter() - began}


async def _run_worker(args: Any) -> None:
    # A connection per slot, plus one to listen for new jobs; at most POOL_MAX (W7's
    # hundreds of slots each use a connection only to fetch and to finish a job).
    async with _app(args.dsn, min(args.slots + 1, POOL_MAX)).open_async() as app:
        await app.run_worker_async(
            concurrency=args.slots,
            wait=not args.burst,
            install_signal_handlers=False,
        )


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
