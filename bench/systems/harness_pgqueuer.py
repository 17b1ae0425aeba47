"""Harness for PgQueuer (run in its own virtualenv by bench/run.py).

Entrypoints are ``async def`` (PgQueuer accepts no other kind); a worker process is a
``QueueManager`` on one asyncpg connection, as in PgQueuer's quick start, run with
``max_concurrent_tasks=SLOTS`` (PgQueuer requires a batch of at most half of that) and
``mode=drain`` to stop once the queue is empty. PgQueuer deletes finished jobs from its
queue table and logs them in ``pgqueuer_log``: completions are counted there, and W5's
finished rows are added there. W6 retries at once (``DatabaseRetryEntrypointExecutor``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any

import asyncpg
from pgqueuer import DatabaseRetryEntrypointExecutor, Queries, QueueManager
from pgqueuer.db import AsyncpgDriver
from pgqueuer.domain.types import QueueExecutionMode
from pgqueuer.models import Job

from bench import common

MODULE = "bench.systems.harness_pgqueuer"


async def _connect(dsn: str) -> asyncpg.Connection:
    return await asyncpg.connect(dsn)


async def _successful(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")


async def _truncate(conn: asyncpg.Connection) -> None:
    await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")


def _payload(i: int, probe: bool = False) -> bytes:
    return f"{i} probe".encode() if probe else str(i).encode()


async def _enqueue_bulk(queries: Queries, entrypoint: str, jobs: int, chunk: int) -> None:
    for start in range(0, jobs, chunk):
        count = min(start + chunk, jobs) - start
        await queries.enqueue(
            [entrypoint] * count, [_payload(i) for i in range(start, start + count)], [0] * count
        )


def _queue_manager(conn: asyncpg.Connection) -> QueueManager:
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("bench.noop")
    async def noop(job: Job) -> None:
        assert job.payload is not None
        i, *probe = job.payload.decode().split()
        if probe:
            common.probe(int(i))

    @qm.entrypoint(
        "bench.cpu_flaky",
        executor_factory=lambda parameters: DatabaseRetryEntrypointExecutor(
            parameters=parameters, max_attempts=3, initial_delay=timedelta(0)
        ),
    )
    async def cpu_flaky(job: Job) -> None:
        assert job.payload is not None
        i = int(job.payload)
        common.burn_cpu()
        if job.attempts == 0 and common.fails_first_attempt(i):
            raise common.FlakyJobError(i)

    return qm


async def setup(args: Any) -> dict[str, Any]:
    conn = await _connect(args.dsn)
    await Queries(AsyncpgDriver(conn)).install()
    await conn.close()
    return {"ok": True}


async def enqueue_single(args: Any) -> dict[str, Any]:
    conn = await _connect(args.dsn)
    await _truncate(conn)
    queries = Queries(AsyncpgDriver(conn))
    began = time.perf_counter()
    for i in range(args.jobs):
        await queries.enqueue("bench.noop", _payload(i))
    elapsed = time.perf_counter() - began
    await conn.close()
    return common.rate(args.jobs, elapsed)


async def enqueue_bulk(args: Any) -> dict[str, Any]:
    conn = await _connect(args.dsn)
    await _truncate(conn)
    began = time.perf_counter()
    await _enqueue_bulk(Queries(AsyncpgDriver(conn)), "bench.noop", args.jobs, args.chunk)
    elapsed = time.perf_counter() - began
    await conn.close()
    return common.rate(args.jobs, elapsed)


async def drain(args: Any) -> dict[str, Any]:
    processes, slots = common.parse_layout(args.layout)
    conn = await _connect(args.dsn)
    if not args.keep:
        await _truncate(conn)
    else:
        await conn.execute("VACUUM pgqueuer, pgqueuer_log")  # see --keep
    await _enqueue_bulk(Queries(AsyncpgDriver(conn)), f"bench.{args.kind}", args.jobs, 5000)
    await conn.execute("ANALYZE pgqueuer")  # statistics as autovacuum would leave them
    before = await _successful(conn)
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, True)] * processes
    )
    group.go()
    start, end = await asyncio.to_thread(group.wait)
    done = await _successful(conn) - before
    left = await conn.fetchval("SELECT count(*) FROM pgqueuer")
    last = await conn.fetchval(
        "SELECT extract(epoch FROM max(created)) FROM pgqueuer_log WHERE status = 'successful'"
    )
    await conn.close()
    if done != args.jobs or left:
        raise RuntimeError(f"{done} of {args.jobs} jobs successful, {left} left in the queue")
    return common.drain_rate(args.jobs, start, float(last), end)


async def latency(args: Any) -> dict[str, Any]:
    conn = await _connect(args.dsn)
    await _truncate(conn)
    queries = Queries(AsyncpgDriver(conn))
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
        for i in range(args.samples):
            await queries.enqueue("bench.noop", _payload(i, probe=True))
            committed = time.monotonic()
            started = await asyncio.to_thread(receiver.wait, i)
            samples.append(started - committed)
            await asyncio.sleep(common.sample_pause(i))
    finally:
        group.terminate()
        receiver.close()
        await conn.close()
    return {"samples": samples}


async def fill_finished(args: Any) -> dict[str, Any]:
    conn = await _connect(args.dsn)
    began = time.perf_counter()
    await conn.execute(
        """
        INSERT INTO pgqueuer_log (job_id, status, priority, entrypoint, aggregated)
        SELECT g, 'successful', 0, 'bench.noop', true FROM generate_series(1, $1::int) AS g
        """,
        args.rows,
    )
    await conn.execute("VACUUM ANALYZE pgqueuer_log")
    elapsed = time.perf_counter() - began
    await conn.close()
    return {"rows": args.rows, "seconds": elapsed}


async def _run_worker(args: Any) -> None:
    if args.slots < 2:
        raise ValueError("PgQueuer needs max_concurrent_tasks >= 2 x batch_size: 2 slots or more")
    conn = await _connect(args.dsn)
    qm = _queue_manager(conn)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    await qm.run(
        batch_size=args.slots // 2,
        max_concurrent_tasks=args.slots,
        mode=QueueExecutionMode.drain if args.burst else QueueExecutionMode.continuous,
    )
    await conn.close()


def worker(args: Any) -> None:
    common.worker_entry(lambda: asyncio.run(_run_worker(args)))


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
