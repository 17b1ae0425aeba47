"""Helpers shared by every system's harness: standard library only, because the peers'
harnesses import this module from their own virtualenvs.

A harness is a module run as ``python -m bench.systems.harness_<name> COMMAND ...``
(see :func:`harness_main`). It prints one JSON object, its result, as the last line of
its standard output. Worker processes it starts talk to it through their standard
input and output: they print ``ready`` once set up, wait for ``go`` and print their
start and end times, so that a drain is timed from the moment every worker is ready
(interpreter start-up and imports are not the queue's cost).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent

#: CPU time burnt by a W6 job.
CPU_JOB_SECONDS = 0.001
#: Every tenth job of W6 fails its first attempt.
FAIL_EVERY = 10
#: Seconds a W7 job waits on simulated I/O (``asyncio.sleep``, or ``time.sleep`` where the
#: peer runs sync tasks on threads or greenlets).
IO_WAIT_SECONDS = 0.05
#: W9's keys: job ``i`` has key ``i % W9_KEYS``, each key limited to one job at a time.
W9_KEYS = 1000
#: W11's rate for each of its ``W9_KEYS`` keys, in jobs a second. Together the keys
#: allow 20,000 jobs a second, more than W11's target (half of W3's rate, about 11,000
#: here): the limits are all counted, and each key's window fills with its last job,
#: but they do not cap the drain below the target themselves. At 10 a second (10,000
#: for all keys, the rate before 2026-12-05) they did: a drain then measured the limits
#: doing their job more than the claim counting them (bench/results/issue17/README.md).
W11_RATE = 20
#: W13's table: one row per job, inserted by the job's handler in its transaction.
W13_TABLE = "pgqueue_bench_rows"
#: W10's workers: 4 processes, as its target states, with slots to spare.
W10_LAYOUT = "4x2"
#: How long a worker may take to become ready, and a drain to finish, before the run
#: is given up.
READY_TIMEOUT = 60.0
DRAIN_TIMEOUT = 600.0


class FlakyJobError(Exception):
    """Raised by the W6 job on the first attempt of every tenth job."""


def fails_first_attempt(i: int) -> bool:
    return i % FAIL_EVERY == 0


def check_retried(retried: int, jobs: int) -> None:
    """Raise unless exactly the W6 jobs that fail their first attempt ran twice.

    ``retried``: how many of the ``jobs`` (numbered from 0) the system ran more than once.
    """
    expected = sum(map(fails_first_attempt, range(jobs)))
    if retried != expected:
        raise RuntimeError(f"{retried} jobs ran twice, {expected} failed their first run")


def burn_cpu(seconds: float = CPU_JOB_SECONDS) -> None:
    """Spin for ``seconds`` of thread CPU time (not wall time: the GIL is shared)."""
    deadline = time.thread_time() + seconds
    while time.thread_time() < deadline:
        pass


# -- latency probe -------------------------------------------------------------------

_probe_socket: socket.socket | None = None


def probe(i: int) -> None:
    """Tell the harness that job ``i`` started now (UDP to ``BENCH_PROBE_PORT``)."""
    global _probe_socket
    port = os.environ.get("BENCH_PROBE_PORT")
    if not port:
        return
    if _probe_socket is None:
        _probe_socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _probe_socket.sendto(f"{i} {time.monotonic()!r}".encode(), ("127.0.0.1", int(port)))


class ProbeReceiver:
    """The harness's end of the probe: ``wait(i)`` returns when job ``i`` started."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])

    def wait(self, i: int, timeout: float = 30.0) -> float:
        """Return the monotonic time job ``i`` reported starting."""
        deadline = time.monotonic() + timeout
        while True:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                data = self.sock.recv(128)
            except TimeoutError:
                raise RuntimeError(f"job {i} did not start within {timeout:g}s") from None
            number, started = data.decode().split()
            if int(number) == i:
                return float(started)

    def close(self) -> None:
        self.sock.close()


# -- worker processes ----------------------------------------------------------------


def cost_mark(name: str) -> None:
    """Let bench/cost.py read the database's counters at this point of a drain: with
    ``BENCH_COST_MARKS`` set, say ``cost-mark NAME`` on standard output and wait for its
    answer on standard input. ``start``: worker processes are about to start; ``go``:
    they are ready; ``end``: every one exited."""
    if not os.environ.get("BENCH_COST_MARKS"):
        return
    print(f"cost-mark {name}", flush=True)
    sys.stdin.readline()


def worker_entry(run: Callable[[], None], setup: Callable[[], None] | None = None) -> None:
    """The body of a worker process: set up, say ``ready``, wait for ``go``, run, report.

    SIGTERM (used to stop non-burst workers) is left to ``run`` to handle.
    """
    if setup is not None:
        setup()
    print("ready", flush=True)
    line = sys.stdin.readline()
    if line.strip() != "go":
        return
    start, cpu = time.time(), time.process_time()
    run()
    end, cpu = time.time(), time.process_time() - cpu
    print(json.dumps({"start": start, "end": end, "cpu": cpu}), flush=True)


def async_worker_entry(work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``worker_entry`` for an asyncio worker: run ``work()`` on an event loop of its
    own, SIGTERM cancelling it (how non-burst workers are stopped)."""

    def run() -> None:
        async def main() -> None:
            task = asyncio.ensure_future(work())
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
            with contextlib.suppress(asyncio.CancelledError):
                await task

        asyncio.run(main())

    worker_entry(run)


@dataclass
class WorkerGroup:
    """Worker processes started by a harness, released together."""

    processes: list[subprocess.Popen[str]]
    #: CPU seconds the workers spent from ``go`` to their end, all threads counted
    #: (known once :meth:`wait` returns; an older harness's workers may not report it).
    cpu: float = 0.0

    @classmethod
    def start(cls, commands: Sequence[Sequence[str]], env: dict[str, str] | None = None):
        cost_mark("start")
        processes = [
            subprocess.Popen(
                list(command),
                # The harness's own directory (the repository, or for a baseline one
                # where only bench/ is importable: bench/baseline.py).
                cwd=None,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for command in commands
        ]
        group = cls(processes)
        try:
            for process in processes:
                group._expect_ready(process)
        except BaseException:
            group.kill()
            raise
        return group

    @staticmethod
    def _expect_ready(process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"worker exited before it was ready (status {process.wait()})")
            if line.strip() == "ready":
                return
        raise RuntimeError("worker was not ready in time")

    def go(self) -> None:
        cost_mark("go")
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()

    def wait(self, timeout: float = DRAIN_TIMEOUT) -> tuple[float, float]:
        """Wait for every worker to exit; return (earliest start, latest end)."""
        starts, ends = [], []
        deadline = time.monotonic() + timeout
        try:
            for process in self.processes:
                assert process.stdout is not None
                out, _ = process.communicate(timeout=max(deadline - time.monotonic(), 0.1))
                if process.returncode != 0:
                    raise RuntimeError(f"worker exited with status {process.returncode}")
                times = json.loads(out.strip().splitlines()[-1])
                starts.append(times["start"])
                ends.append(times["end"])
                self.cpu += times.get("cpu", 0.0)
        except BaseException:
            self.kill()
            raise
        cost_mark("end")
        return min(starts), max(ends)

    def terminate(self, timeout: float = 30.0) -> None:
        """SIGTERM every worker and wait for them to exit."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def postmaster(backend_pid: int) -> int | None:
    """The pid of the PostgreSQL server that runs backend ``backend_pid`` (the result of
    ``pg_backend_pid()``), or ``None`` when it is not a process ``/proc`` shows here."""
    try:
        if not Path(f"/proc/{backend_pid}/comm").read_text().startswith("postgres"):
            return None  # a server elsewhere: this pid is another process, or none
        return _proc_stat(backend_pid)[1]
    except (OSError, IndexError, ValueError):
        return None


def server_cpu(postmaster_pid: int | None) -> float | None:
    """CPU seconds the PostgreSQL server ``postmaster_pid`` (see :func:`postmaster`) has
    spent so far: the postmaster, its live children and every child it has reaped.

    The difference of two readings is the server's cost of what ran between them: every
    backend, the WAL writer, the checkpointer and autovacuum counted alike.
    """
    if postmaster_pid is None:
        return None
    try:
        fields = _proc_stat(postmaster_pid)
    except (OSError, IndexError, ValueError):
        return None
    ticks = fields[11] + fields[12] + fields[13] + fields[14]  # utime stime cutime cstime
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                child = _proc_stat(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile (its time is then the postmaster's)
            if child[1] == postmaster_pid:
                ticks += child[11] + child[12]
    return ticks / os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> list[int]:
    """The numeric fields of ``/proc/PID/stat`` after the command name: index 0 is the
    state's place, 1 the parent's pid, 11-14 utime, stime, cutime and cstime."""
    text = Path(f"/proc/{pid}/stat").read_text()
    rest = text[text.rindex(")") + 2 :].split()
    return [0, *(int(value) for value in rest[1:])]


def module_command(module: str, *args: str) -> list[str]:
    """``python -m module args`` with this interpreter (the system's own virtualenv)."""
    return [sys.executable, "-m", module, *args]


def worker_command(module: str, dsn: str, slots: int, burst: bool) -> list[str]:
    """The command line of one worker process of harness ``module`` (its ``worker``
    command): ``slots`` slots, stopping once no job is left when ``burst``."""
    command = module_command(module, "--dsn", dsn, "worker", "--slots", str(slots))
    return [*command, "--burst"] if burst else command


# -- results -------------------------------------------------------------------------


def write_results(directory: str | Path, name: str, text: str, data: dict[str, Any]) -> Path:
    """Write a script's report as ``<name>.md`` and its figures as ``<name>.json`` in
    ``directory`` (made if missing); return the directory."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2))
    return out


def emit(result: dict[str, Any]) -> None:
    """Print a harness's result: one JSON line, the last of its output."""
    print(json.dumps(result), flush=True)


def rate(jobs: int, seconds: float) -> dict[str, Any]:
    return {"jobs": jobs, "seconds": seconds, "rate": jobs / seconds if seconds > 0 else 0.0}


def drain_rate(jobs: int, start: float, last_finished: float, exited: float) -> dict[str, Any]:
    """A drain's result: timed from ``go`` to the last job recorded as finished (the
    database's clock, the same machine's), not to the workers' exit, whose shutdown
    is no measure of the queue; the time to exit is kept as ``wall``."""
    result = rate(jobs, last_finished - start)
    result["wall"] = exited - start
    return result


def rate_kept(starts: Sequence[float], rate: int, seconds: float) -> dict[str, Any]:
    """W10's result from the start times (epoch seconds) of a rate-limited backlog: the
    rate over the ``seconds`` from the first start, and the most starts in any second
    (a half-open window, as the limit counts)."""
    ordered = sorted(starts)
    if not ordered:
        raise RuntimeError("no job started")
    kept = sum(1 for start in ordered if start < ordered[0] + seconds)
    peak = first = 0
    for last, start in enumerate(ordered):
        while ordered[first] <= start - 1.0:
            first += 1
        peak = max(peak, last - first + 1)
    return {"rate": kept / seconds, "limit": rate, "peak": peak, "jobs": kept}


def with_database(url: str, name: str) -> str:
    """``url`` with its database replaced by ``name``."""
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def django_database(url: str) -> dict[str, Any]:
    """A Django ``DATABASES`` entry for a ``postgresql://`` URL.

    Understands ``?host=/socket/dir`` (and ``port``) as well, the form of Unix-socket
    URLs such as the embedded server's.
    """
    parts = urlsplit(url)
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or query.get("user", "")),
        "PASSWORD": unquote(parts.password or query.get("password", "")),
        "HOST": parts.hostname or query.get("host", ""),
        "PORT": str(parts.port or query.get("port", "")),
        # Workers keep their connections, as in production.
        "CONN_MAX_AGE": None,
    }


def parse_layout(value: str) -> tuple[int, int]:
    """``"2x2"`` -> (processes, slots per process)."""
    processes, _, slots = value.partition("x")
    return int(processes), int(slots)


def harness_parser(description: str, extra: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The command line every harness accepts (see bench/run.py for the callers).

    ``extra`` names further commands of this harness that take ``--jobs``.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dsn", required=True, help="URL of this system's own database")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="install the schema")
    for name in ("enqueue-single", "enqueue-bulk", *extra):
        p = sub.add_parser(name)
        p.add_argument("--jobs", type=int, required=True)
        p.add_argument("--chunk", type=int, default=5000)
    p = sub.add_parser("drain", help="enqueue (untimed), then time workers draining the queue")
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--layout", default="1x4", help="PROCESSESxSLOTS")
    p.add_argument(
        "--kind",
        choices=[
            "noop",
            "cpu_flaky",
            "keyed",
            "rated_keys",
            "chord",
            "io_wait",
            "noop_isolated",
            "writes_row",
        ],
        default="noop",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the rows already there (W5), vacuumed first: the previous run's dead "
        "rows would slow the next claims down until autovacuum comes, and a drain without "
        "--keep starts from a truncated table",
    )
    p = sub.add_parser(
        "rate-limit",
        help="W10: a backlog under a rate limit of --rate jobs a second, run by workers for "
        "--seconds; report the rate kept and the most starts in any second",
    )
    p.add_argument("--rate", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--layout", default="4x2")
    p = sub.add_parser("latency", help="enqueue-commit to job start, idle worker")
    p.add_argument("--samples", type=int, required=True)
    p.add_argument("--layout", default="1x4")
    p = sub.add_parser(
        "chain",
        help="W8: a chain of --steps no-op jobs run by idle workers; report the time from "
        "each step's finish to the next one's start",
    )
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--layout", default="1x4")
    p = sub.add_parser("fill-finished", help="add finished rows (W5)")
    p.add_argument("--rows", type=int, required=True)
    p = sub.add_parser("worker", help="(internal) one worker process")
    p.add_argument("--slots", type=int, required=True)
    p.add_argument("--burst", action="store_true")
    p.add_argument("--batch-size", type=int, default=None)
    return parser


_STANDARD_COMMANDS = (
    "setup",
    "enqueue-single",
    "enqueue-bulk",
    "drain",
    "rate-limit",
    "latency",
    "chain",
    "fill-finished",
)


def harness_main(
    description: str,
    commands: dict[str, Callable[[Any], Any]],
    worker: Callable[[Any], None],
    *,
    setup: Callable[[str], None] | None = None,
    run: Callable[[Any], dict[str, Any]] = lambda result: result,
) -> None:
    """Parse a harness's command line, run the command and print its result.

    ``setup(dsn)`` prepares the process first (Django's settings); ``run`` turns what a
    command returns into its result (``asyncio.run`` for harnesses with async commands).
    """
    extra = [name for name in commands if name not in _STANDARD_COMMANDS]
    args = harness_parser(description, extra=extra).parse_args()
    if setup is not None:
        setup(args.dsn)
    if args.command == "worker":
        worker(args)
        return
    emit(run(commands[args.command](args)))


def first_seen_drained(drained: Callable[[], bool], poll_seconds: float) -> float:
    """The time (epoch seconds) ``drained()`` was first true on two polls in a row, for a
    queue that keeps no finishing times (a broker's): a job taken from the queue may be
    in no place it looks at for a moment before it is noted as in flight."""
    first_seen = None
    while True:
        if drained():
            if first_seen is not None:
                return first_seen
            first_seen = time.time()
        else:
            first_seen = None
        time.sleep(poll_seconds)


def sample_pause(i: int) -> float:
    """Seconds the worker is left idle after latency sample ``i`` (W4): a short,
    varying while, so that samples do not fall in step with a worker's timers."""
    return 0.02 + (i % 7) * 0.005


def latency_samples(
    enqueue_one: Callable[[int], None], receiver: ProbeReceiver, samples: int
) -> list[float]:
    """Enqueue ``samples`` probe jobs one at a time; return each one's latency (s).

    ``enqueue_one(i)`` must return once the enqueueing transaction committed. Between
    samples the worker is left idle for a short, varying while.
    """
    latencies = []
    for i in range(samples):
        enqueue_one(i)
        committed = time.monotonic()
        started = receiver.wait(i)
        latencies.append(started - committed)
        time.sleep(sample_pause(i))
    return latencies
