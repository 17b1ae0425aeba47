"""Fixtures of the fault suite: real servers the tests control, and the figures file.

Every test here carries the ``faults`` marker (`.ci/run` runs them in its first pass
only). Figures of each run are printed at the end of the session and written as JSON to
``$PGQUEUE_FAULTS_RESULTS`` (default: ``<tmp>/pgqueue-faults/results.json``), which
docs/explanation/guarantees.md quotes.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from scripts.with_postgres import SystemCluster
from tests.availability import unavailable
from tests.workers import ROOT

from .pgbouncer import PgBouncer

RESULTS = Path(
    os.environ.get("PGQUEUE_FAULTS_RESULTS")
    or Path(tempfile.gettempdir()) / "pgqueue-faults" / "results.json"
)
_figures: dict[str, dict[str, Any]] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _figures:
        return
    terminalreporter.section("pgqueue fault figures")
    for name, values in _figures.items():
        terminalreporter.write_line(
            f"{name}: " + " ".join(f"{key}={value}" for key, value in values.items())
        )
    terminalreporter.write_line(f"written to {RESULTS}")


@pytest.fixture
def figures(request: pytest.FixtureRequest):
    """``figures(**values)`` records this test's figures (printed and written as JSON)."""

    def record(**values: Any) -> None:
        name = request.node.name
        _figures[name] = values
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        previous[name] = {**values, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        RESULTS.write_text(json.dumps(previous, indent=2, sort_keys=True) + "\n")

    return record


class MigratedCluster:
    """A dedicated system PostgreSQL with a migrated ``faults`` database."""

    def __init__(self, cluster: SystemCluster) -> None:
        self.cluster = cluster
        self.url = cluster.url.rsplit("/", 1)[0] + "/faults"

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True)

    def reset(self) -> None:
        """Empty the tables the fault tests write (between tests)."""
        with self.connect() as conn:
            conn.execute(
                "TRUNCATE pgqueue_jobs, pgqueue_job_dependencies, pgqueue_job_waits, "
                "pgqueue_workers, testapp_execution CASCADE"
            )


@pytest.fixture(scope="session")
def dedicated_cluster() -> Iterator[MigratedCluster]:
    """A PostgreSQL of the system binaries that tests may restart, never the shared one."""
    if not glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"):
        unavailable("no system PostgreSQL (apt-get install postgresql)")
    # Durable commits: an immediate restart must not forget a commit already reported
    # (synchronous_commit=off, the suite's tuning, would: the WAL is not yet written).
    cluster = SystemCluster(["fsync=off", "full_page_writes=off", "synchronous_commit=on"])
    cluster.start()
    try:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE faults")
        migrated = MigratedCluster(cluster)
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--verbosity", "0"],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DATABASE_URL": migrated.url,
                "PYTHONPATH": str(ROOT),
            },
            check=True,
            timeout=120,
        )
        yield migrated
    finally:
        cluster.stop()


@pytest.fixture
def cluster(dedicated_cluster: MigratedCluster) -> MigratedCluster:
    dedicated_cluster.reset()
    return dedicated_cluster


@pytest.fixture
def pgbouncer(cluster: MigratedCluster) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction pooling mode in front of ``cluster``."""
    if not shutil.which("pgbouncer") and not os.path.exists("/usr/sbin/pgbouncer"):
        unavailable("pgbouncer is not installed (apt-get install pgbouncer)")
    bouncer = PgBouncer(host="127.0.0.1", port=cluster.cluster.port, pool_mode="transaction")
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()
