"""A primary and its streaming standby, of the system binaries, for failover tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import psycopg

from scripts.with_postgres import SystemCluster, _free_port
from tests.workers import ROOT

DATABASE = "faults"


class Standby:
    """A hot standby of ``primary``, made by ``pg_basebackup`` and started on a port of
    its own; ``promote()`` makes it the primary."""

    def __init__(self, primary: SystemCluster) -> None:
        self.primary = primary
        self.base = tempfile.mkdtemp(prefix="pgqueue-standby-")
        if primary.as_user:
            shutil.chown(self.base, "postgres", "postgres")
        self.data = os.path.join(self.base, "data")
        self.port = _free_port()
        self.options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base} "
            "-c fsync=off -c full_page_writes=off -c hot_standby=on"
        )

    def _run(self, *command: str) -> None:
        subprocess.run(
            [*self.primary.as_user, *command], check=True, stdout=subprocess.DEVNULL, timeout=120
        )

    def start(self) -> Standby:
        # -R: standby.signal and primary_conninfo; its application_name is the
        # walreceiver's default, which synchronous_standby_names = '*' matches.
        self._run(
            f"{self.primary.bindir}/pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "postgres",
            "-D",
            self.data,
            "-R",
            "-X",
            "stream",
            "--checkpoint=fast",  # a spread checkpoint first would take minutes
        )
        self._run(
            f"{self.primary.bindir}/pg_ctl",
            "-D",
            self.data,
            "-l",
            f"{self.base}/log",
            "-w",
            "-o",
            self.options,
            "start",
        )
        return self

    def fall_behind(self) -> None:
        """Stop receiving the primary's WAL (both keep running): what the primary
        commits from now on exists only there, as when shipping lags."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")

    def promote(self) -> None:
        self._run(f"{self.primary.bindir}/pg_ctl", "-D", self.data, "-w", "promote")

    def stop(self) -> None:
        subprocess.run(
            [
                *self.primary.as_user,
                f"{self.primary.bindir}/pg_ctl",
                "-D",
                self.data,
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
            check=False,
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(self.base, ignore_errors=True)

    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"


def primary_with_database() -> SystemCluster:
    """A started primary with the migrated database ``faults``: durable commits, and
    WAL for a standby."""
    primary = SystemCluster(["fsync=off", "full_page_writes=off", "synchronous_commit=on"])
    primary.start()
    with psycopg.connect(primary.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--verbosity", "0"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": database_url(primary),
            "PYTHONPATH": str(ROOT),
        },
        check=True,
        timeout=120,
    )
    return primary


def database_url(primary: SystemCluster) -> str:
    return primary.url.rsplit("/", 1)[0] + f"/{DATABASE}"


def make_synchronous(primary: SystemCluster) -> None:
    """Have every commit on ``primary`` wait for the standby's flush."""
    with psycopg.connect(primary.url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        conn.execute("SELECT pg_reload_conf()")


def wait_until_streaming(
    primary: SystemCluster, sync_state: str | None, timeout: float = 30
) -> None:
    """Wait until a standby streams from ``primary`` in ``sync_state`` (``"sync"``,
    ``"async"``), or until none does (None)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(primary.url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
            ).fetchone()
            if (row[0] if row else None) == sync_state:
                return
            time.sleep(0.1)
    raise AssertionError(f"standby not {sync_state or 'gone'} within {timeout}s")


def writable(url: str, timeout: float = 30) -> psycopg.Connection[Any]:
    """A connection to ``url`` once it takes writes (a promoted standby)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = psycopg.connect(url, autocommit=True, connect_timeout=2)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            continue
        (in_recovery,) = conn.execute("SELECT pg_is_in_recovery()").fetchone() or (True,)
        if not in_recovery:
            return conn
        conn.close()
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} still a standby after {timeout}s")
        time.sleep(0.1)
