"""Harness for DBOS Transact's queues (run in its own virtualenv by bench/run.py).

A job is a DBOS workflow (``@DBOS.workflow``) enqueued on a queue. Jobs are enqueued
from outside the workers with ``DBOSClient`` (its documented way for another process):
``enqueue`` one at a time (W1) and ``enqueue_in_transaction`` 5,000 to a transaction of
a SQLAlchemy connection to the system database (W2). A worker process launches DBOS
and registers the queue (``DBOS.register_queue(..., worker_concurrency=SLOTS,
polling_interval_sec=POLL_SECONDS)``): DBOS dequeues by polling (its LISTEN/NOTIFY is
for workflow events, not queues), so the interval is W4's floor: a hundredth of a
second here, its default being one. Workflows run on DBOS's thread pool. Every process
has its own ``executor_id`` (DBOS counts ``worker_concurrency`` per executor). DBOS has
no burst mode: a burst worker stops once no workflow of the queue is left enqueued or
pending (looked at every 20 ms). W3 is timed to the last workflow's ``updated_at``,
when its status was recorded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from dbos import DBOS, DBOSClient

from bench import common

MODULE = "bench.systems.harness_dbos"
APP = "pgqueue_bench"
QUEUE = "bench"
WORKFLOW = "bench_noop"
TABLE = "dbos.workflow_status"
POLL_SECONDS = 0.01
#: How often a burst worker looks whether jobs are left.
BURST_CHECK_SECONDS = 0.02


FLAKY_WORKFLOW = "bench_cpu_flaky"
#: The W6 jobs of this process that failed their first attempt.
_failed_once: set[int] = set()


@DBOS.workflow(name=WORKFLOW)
def noop(i: int, probe: bool = False) -> None:
    if probe:
        common.probe(i)


@DBOS.step(retries_allowed=True, interval_seconds=0, max_attempts=3)
def _burn(i: int) -> None:
    """W6's work: a millisecond of CPU; every tenth job fails its first attempt, which
    DBOS retries at once (a step's retries are its documented way)."""
    common.burn_cpu()
    if common.fails_first_attempt(i) and i not in _failed_once:
        _failed_once.add(i)
        raise common.FlakyJobError(i)


@DBOS.workflow(name=FLAKY_WORKFLOW)
def cpu_flaky(i: int) -> None:
    _burn(i)


def _sql(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def _succeeded(dsn: str) -> int:
    query = f"SELECT count(*) FROM {TABLE} WHERE queue_name = %s AND status = 'SUCCESS'"
    return _sql(dsn, query, [QUEUE])[0][0]


def _truncate(dsn: str) -> None:
    _sql(dsn, f"TRUNCATE {TABLE} CASCADE")


def _client(dsn: str) -> DBOSClient:
    return DBOSClient(system_database_url=dsn, application_name=APP)


OPTIONS: dict[str, Any] = {"queue_name": QUEUE, "workflow_name": WORKFLOW}
#: The enqueue options of each kind of drain.
KIND_OPTIONS = {"noop": OPTIONS, "cpu_flaky": {**OPTIONS, "workflow_name": FLAKY_WORKFLOW}}


def _enqueue_bulk(
    client: DBOSClient, dsn: str, jobs: int, chunk: int, options: dict[str, Any] = OPTIONS
) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        for start in range(0, jobs, chunk):
            # One transaction per chunk, as the other systems' bulk enqueues.
            with engine.begin() as conn:
                for i in range(start, min(start + chunk, jobs)):
                    client.enqueue_in_transaction(conn, options, i)  # type: ignore[arg-type]
    finally:
        engine.dispose()


def _launch(dsn: str, slots: int = 0) -> None:
    """Launch DBOS in this process; with ``slots``, as a worker of the queue."""
    logging.getLogger("dbos").setLevel(logging.ERROR)
    DBOS(
        config={
            "name": APP,
            "system_database_url": dsn,
            "executor_id": f"bench-{os.getpid()}",
            "log_level": "ERROR",
        }
    )
    if not slots:
        DBOS.listen_queues([])
    DBOS.launch()
    if slots:
        DBOS.register_queue(
            QUEUE,
            worker_concurrency=slots,
            polling_interval_sec=POLL_SECONDS,
            on_conflict="always_update",
        )


def setup(args: Any) -> dict[str, Any]:
    _launch(args.dsn)  # creates and migrates its system database
    DBOS.destroy()
    return {"ok": True}


def enqueue_single(args: Any) -> dict[str, Any]:
    _truncate(args.dsn)
    client = _client(args.dsn)
    try:
        began = time.perf_counter()
        for i in range(args.jobs):
            client.enqueue(OPTIONS, i)  # type: ignore[arg-type]
        return common.rate(args.jobs, time.perf_counter() - began)
    finally:
        client.destroy()


def enqueue_bulk(args: Any) -> dict[str, Any]:
    _truncate(args.dsn)
    client = _client(args.dsn)
    try:
        began = time.perf_counter()
        _enqueue_bulk(client, args.dsn, args.jobs, args.chunk)
        return common.rate(args.jobs, time.perf_counter() - began)
    finally:
        client.destroy()


def drain(args: Any) -> dict[str, Any]:
    processes, slots = common.parse_layout(args.layout)
    if args.kind not in KIND_OPTIONS:
        raise RuntimeError(f"no {args.kind} jobs in this harness")
    if not args.keep:
        _truncate(args.dsn)
    else:
        _sql(args.dsn, f"VACUUM {TABLE}")  # see --keep
    client = _client(args.dsn)
    try:
        _enqueue_bulk(client, args.dsn, args.jobs, 5000, KIND_OPTIONS[args.kind])
    finally:
        client.destroy()
    _sql(args.dsn, f"ANALYZE {TABLE}")  # statistics as autovacuum would leave them
    before = _succeeded(args.dsn)
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, True)] * processes
    )
    group.go()
    start, end = group.wait()
    done = _succeeded(args.dsn) - before
    if done != args.jobs:
        raise RuntimeError(f"{done} of {args.jobs} jobs succeeded")
    rows = _sql(
        args.dsn,
        f"SELECT max(updated_at) / 1000.0 FROM {TABLE} WHERE queue_name = %s",
        [QUEUE],
    )
    return common.drain_rate(args.jobs, start, float(rows[0][0]), end)


def latency(args: Any) -> dict[str, Any]:
    _truncate(args.dsn)
    receiver = common.ProbeReceiver()
    env = {**os.environ, "BENCH_PROBE_PORT": str(receiver.port)}
    _, slots = common.parse_layout(args.layout)
    group = common.WorkerGroup.start(
        [common.worker_command(MODULE, args.dsn, slots, False)], env=env
    )
    client = _client(args.dsn)
    try:
        group.go()
        time.sleep(1.0)
        samples = common.latency_samples(
            lambda i: client.enqueue(OPTIONS, i, True),  # type: ignore[arg-type]
            receiver,
            args.samples,
        )
    finally:
        client.destroy()
        group.terminate()
        receiver.close()
    return {"samples": samples}


#: W5's finished rows enqueued through DBOS's API; the rest are copies of one of them
#: made in SQL (its enqueue writes about a thousand a second: a million would take the
#: full run's whole budget).
SEED_ROWS = 1000


def fill_finished(args: Any) -> dict[str, Any]:
    began = time.perf_counter()
    client = _client(args.dsn)
    seed = min(args.rows, SEED_ROWS)
    try:
        _enqueue_bulk(client, args.dsn, seed, 5000)
    finally:
        client.destroy()
    _sql(
        args.dsn,
        f"UPDATE {TABLE} SET status = 'SUCCESS', output = NULL WHERE queue_name = %s",
        [QUEUE],
    )
    # Copies of a finished seed row, each with an id of its own (jsonb_populate_record
    # keeps the other columns of the row it is given; g makes it run once a copy).
    _sql(
        args.dsn,
        f"""
        INSERT INTO {TABLE}
        SELECT copy.*
          FROM (SELECT * FROM {TABLE} WHERE queue_name = %s LIMIT 1) AS seed
         CROSS JOIN generate_series(1, %s) AS g
         CROSS JOIN LATERAL jsonb_populate_record(
                NULL::{TABLE},
                to_jsonb(seed) || jsonb_build_object('workflow_uuid', 'bench-w5-' || g)
              ) AS copy
        """,
        [QUEUE, args.rows - seed],
    )
    _sql(args.dsn, f"VACUUM ANALYZE {TABLE}")
    return {"rows": args.rows, "seconds": time.perf_counter() - began}


def _left(conn: Any) -> int:
    query = (
        f"SELECT count(*) FROM {TABLE} WHERE queue_name = %s AND status IN ('ENQUEUED', 'PENDING')"
    )
    row = conn.execute(query, [QUEUE]).fetchone()
    return int(row[0]) if row else 0


def worker(args: Any) -> None:
    stop = threading.Event()

    def run() -> None:
        import psycopg

        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        # Launched after "go", as the other peers' workers start: launching starts
        # dequeuing at once.
        _launch(args.dsn, args.slots)
        try:
            if not args.burst:
                stop.wait()
                return
            # The burst's own connection, to look whether jobs are left.
            with psycopg.connect(args.dsn, autocommit=True) as conn:
                while _left(conn):
                    time.sleep(BURST_CHECK_SECONDS)
        finally:
            with contextlib.suppress(Exception):
                DBOS.destroy(workflow_completion_timeout_sec=5)

    common.worker_entry(run)


COMMANDS = {
    "setup": setup,
    "enqueue-single": enqueue_single,
    "enqueue-bulk": enqueue_bulk,
    "drain": drain,
    "latency": latency,
    "fill-finished": fill_finished,
}


def main() -> None:
    common.harness_main(__doc__.splitlines()[0], COMMANDS, worker)


if __name__ == "__main__":
    sys.exit(main())
