"""A PgBouncer of our own for the tests (the PyPI fixture package hangs as root).

Run as the ``postgres`` user when we are root: PgBouncer refuses to run as root.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgBouncer:
    """One PgBouncer process forwarding every database to ``host:port`` as ``postgres``.

    ``pool_size`` server connections per database: small, so clients share them (which
    is what breaks prepared statements and LISTEN in transaction mode).
    """

    def __init__(self, *, host: str, port: int, pool_mode: str, pool_size: int = 3) -> None:
        self.binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        self.base = Path(tempfile.mkdtemp(prefix="pgqueue-pgbouncer-"))
        self.port = _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        (self.base / "users.txt").write_text('"postgres" ""\n')
        (self.base / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port} user=postgres\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.base}\n"
            "auth_type = trust\n"
            f"auth_file = {self.base}/users.txt\n"
            f"pool_mode = {pool_mode}\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 200\n"
            f"logfile = {self.base}/pgbouncer.log\n"
            f"pidfile = {self.base}/pgbouncer.pid\n"
            # Django and psycopg send these at connect time.
            "ignore_startup_parameters = extra_float_digits,options\n"
        )
        for path in self.base.iterdir():
            shutil.chown(path, *(("postgres", "postgres") if self.as_user else (None, None)))
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = 10) -> None:
        self.process = subprocess.Popen(
            [*self.as_user, self.binary, str(self.base / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen within {timeout}s: {self.log()}")

    def log(self) -> str:
        path = self.base / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.base, ignore_errors=True)
