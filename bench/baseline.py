"""django-pgqueue at an earlier commit, benchmarked beside the working tree.

``bench/run.py --baseline REV`` adds the system ``pgqueue-before``: the package as it
was at ``REV``, installed from a ``git archive`` of that commit into a virtualenv of its
own, and driven by the working tree's harness (the same workloads, sizes and timing).
Its harness runs from a directory that holds only a link to ``bench/``, so that the
working tree's ``django_pgqueue`` cannot shadow the installed one. The report then
gives each figure's ratio to the baseline (``report.baseline_table``).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The system name and the figures compared with it (workload, variant).
NAME = "pgqueue-before"
COMPARED = (
    ("W1", ""),
    ("W1", "prepared"),
    ("W2", ""),
    ("W3", "1x4"),
    ("W3", "2x2"),
    ("W13", "1x4"),
    ("W13", "2x2"),
)


def resolve(rev: str) -> str:
    """The full commit id of ``rev`` (a branch, tag or abbreviated id)."""
    result = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"--baseline {rev!r} is not a commit of this repository")
    return result.stdout.strip()


def checkout(commit: str, venv_dir: Path) -> Path:
    """The source tree of ``commit`` (extracted once, under ``venv_dir``)."""
    target = venv_dir / f"src-{commit[:12]}"
    if (target / "pyproject.toml").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as archive:
        subprocess.run(["git", "archive", commit], cwd=ROOT, stdout=archive, check=True)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(target, filter="data")
    return target


def requirements(source: Path) -> tuple[str, ...]:
    """What the baseline's virtualenv installs: that source, with this Django and psycopg
    (the same versions as the working tree's run, so only our code differs)."""
    django = importlib.metadata.version("Django")
    psycopg = importlib.metadata.version("psycopg")
    return (str(source), f"Django=={django}", f"psycopg[binary]=={psycopg}")


def harness_path(venv_dir: Path) -> Path:
    """A directory holding only ``bench`` (a link to the working tree's): the cwd and
    ``PYTHONPATH`` of the baseline's harness and workers."""
    path = venv_dir / "baseline-path"
    link = path / "bench"
    if not link.exists():
        path.mkdir(parents=True, exist_ok=True)
        link.symlink_to(ROOT / "bench", target_is_directory=True)
    return path
