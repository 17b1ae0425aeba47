"""Harness for oban, the Python port of Oban (run in its own virtualenv by bench/run.py,
on Python 3.12 or later, which it requires).

Workers are classes with an ``async def process`` (oban runs on asyncio); a worker
process is ``Oban(pool=..., queues={"default": SLOTS})`` with its defaults (leadership,
the PostgreSQL notifier that its insert trigger wakes, the stager every second), on a
pool of ``SLOTS + 2`` connections. Oban has no burst mode: a burst worker stops once no
job of the queue is left available, scheduled, retryable or executing (looked at every
20 ms). W6 retries at once (``backoff`` returns 0 seconds; a retryable job is made
available again by the stager, every second).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from oban import Oban, worker
from oban.schema import install
from oban.worker import worker_name
from psycopg_pool import AsyncConnectionPool

from bench import common

MODULE = "bench.systems.harness_oban"
TABLE = "oban_jobs"
#: How often a burst worker looks whether jobs are left.
BURST_CHECK_SECONDS = 0.02


@worker(queue="default")
class Noop:
    async def process(self, job: Any) -> None:
        if job.args.get("probe"):
            common.probe(job.args["i"])


@worker(queue="default", max_attempts=3)
class CpuFlaky:
    async def process(self, job: Any) -> None:
        common.burn_cpu()
        if job.attempt == 1 and common.fails_first_attempt(job.args["i"]):
            raise common.FlakyJobError(job.args["i"])

    def backoff(self, job: Any) -> int:
        return 0


WORKERS = {"noop": Noop, "cpu_flaky": CpuFlaky}


async def _pool(dsn: str, size: int = 2) -> AsyncConnectionPool:
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=size, open=False)
    await pool.open()
    return pool


async def _sql(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(query, params)
        return await cursor.fetchall() if cursor.description else []


async def _completed(dsn: str) -> int:
    rows = await _sql(dsn, f"SELECT count(*) FROM {TABLE} WHERE state = 'completed'")
    return rows[0][0]


async def _truncate(dsn: str) -> None:
    await _sql(dsn, f"TRUNCATE {TABLE}")


async def _enqueue_bulk(oban: Oban, kind: str, jobs: int, chunk: int) -> None:
    new = WORKERS[kind].new
    for start in range(0, jobs, chunk):
        await oban.enqueue_many([new({"i": i}) for i in range(start, min(start + chunk, jobs))])


async def setup(args: Any) -> dict[str, Any]:
    pool = await _pool(args.dsn)
    try:
        await install(pool)
    finally:
        await pool.close()
    return {"ok": True}


async def enqueue_single(args: Any) -> dict[str, Any]:
    await _truncate(args.dsn)
    pool = await _pool(args.dsn)
    try:
        async with Oban(pool=pool) as oban:
            began = time.perf_counter()
            for i in range(args.jobs):
                await oban.enqueue(Noop.new({"i": i}))
            return common.rate(args.jobs, time.perf_counter() - began)
    finally:
        await pool.close()


async def enqueue_bulk(args: Any) -> dict[str, Any]:
    await _truncate(args.dsn)
    pool = await _pool(args.dsn)
    try:
        async with Oban(pool=pool) as oban:
            began = time.perf_counter()
            await _enqueue_bulk(oban, "noop", args.jobs, args.chunk)
            return common.rate(args.jobs, time.perf_counter() - began)
    finally:
        await pool.close()


async def drain(args: Any) -> dict[str, Any]:
    processes, slots = common.parse_layout(args.layout)
    if args.kind not in WORKERS:
        raise RuntimeError(f"no {args.kind} jobs in this harness")
    if not args.keep:
        await _truncate(args.dsn)
    else:
        await _sql(args.dsn, f"VACUUM {TABLE}")  # see --keep
    pool = await _pool(args.dsn)
    try:
        async with Oban(pool=pool) as oban:
            await _enqueue_bulk(oban, args.kind, args.jobs, 5000)
    finally:
        await pool.close()
    await _sql(args.dsn, f"ANALYZE {TABLE}")  # statistics as autovacuum would leave them
    before = await _completed(args.dsn)
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, True)] * processes
    )
    group.go()
    start, end = await asyncio.to_thread(group.wait)
    done = await _completed(args.dsn) - before
    if done != args.jobs:
        raise RuntimeError(f"{done} of {args.jobs} jobs completed")
    rows = await _sql(
        args.dsn,
        f"SELECT extract(epoch FROM max(completed_at)) FROM {TABLE} WHERE state = 'completed'",
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
    pool = await _pool(args.dsn)
    try:
        group.go()
        await asyncio.sleep(1.0)
        async with Oban(pool=pool) as oban:
            for i in range(args.samples):
                await oban.enqueue(Noop.new({"i": i, "probe": True}))
                committed = time.monotonic()
                started = await asyncio.to_thread(receiver.wait, i)
                samples.append(started - committed)
                await asyncio.sleep(common.sample_pause(i))
    finally:
        await pool.close()
        group.terminate()
        receiver.close()
    return {"samples": samples}


async def fill_finished(args: Any) -> dict[str, Any]:
    began = time.perf_counter()
    await _sql(
        args.dsn,
        f"""
        INSERT INTO {TABLE} (state, queue, worker, args, attempt, attempted_at, completed_at)
        SELECT 'completed', 'default', %s, jsonb_build_object('i', g), 1,
               timezone('UTC', now()), timezone('UTC', now())
          FROM generate_series(1, %s) AS g
        """,
        [worker_name(Noop), args.rows],
    )
    await _sql(args.dsn, f"VACUUM ANALYZE {TABLE}")
    return {"rows": args.rows, "seconds": time.perf_counter() - began}


async def _left(conn: Any) -> int:
    cursor = await conn.execute(
        f"SELECT count(*) FROM {TABLE} "
        "WHERE state IN ('available', 'scheduled', 'retryable', 'executing')"
    )
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def _run_worker(args: Any) -> None:
    import psycopg

    # A connection per slot, one for the notifier's LISTEN, one for the rest; and the
    # burst's own, to look whether jobs are left.
    pool = await _pool(args.dsn, args.slots + 2)
    try:
        async with (
            Oban(pool=pool, queues={"default": args.slots}),
            await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn,
        ):
            if not args.burst:
                await asyncio.Event().wait()  # until cancelled (SIGTERM)
            while await _left(conn):
                await asyncio.sleep(BURST_CHECK_SECONDS)
    finally:
        await pool.close()


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
