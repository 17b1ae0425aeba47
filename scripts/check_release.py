"""Build the release and prove that it installs: ``make release-check``.

1. ``python -m build`` makes the wheel and the sdist into ``dist/``; ``twine check``
   reads their metadata as PyPI would.
2. Both must carry the files that are not Python: the versioned SQL of every migration,
   the admin's templates and static files, ``py.typed``.
3. The wheel is installed into a new virtualenv (no repository on its path), with
   ``psycopg[binary]``; a project of two files (settings, a jobs module) migrates the
   database ``DATABASE_URL`` names, enqueues one job and runs ``pgqueue_worker --burst``,
   which must complete it.

Run under scripts/with_postgres.py (the Makefile does) for a throwaway server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"

#: Files every built artefact must hold, by their path inside the package.
REQUIRED = (
    "django_pgqueue/py.typed",
    "django_pgqueue/sql/claim_job_batch_v1.sql",
    "django_pgqueue/migrations/0001_initial.py",
    "django_pgqueue/templates/django_pgqueue/admin/job/change_list.html",
)
#: Kinds of files that must be in the artefacts as many times as in the repository.
COUNTED = ("django_pgqueue/sql/", "django_pgqueue/templates/", "django_pgqueue/static/")

SETTINGS = """
import os
from urllib.parse import urlsplit, parse_qs, unquote

url = urlsplit(os.environ["DATABASE_URL"])
query = {key: values[-1] for key, values in parse_qs(url.query).items()}
SECRET_KEY = "release-check"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_pgqueue",
                  "shop"]
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": unquote(url.path.lstrip("/")),
    "USER": unquote(url.username or ""),
    "PASSWORD": unquote(url.password or ""),
    "HOST": url.hostname or query.get("host", ""),
    "PORT": str(url.port or query.get("port", "")),
}}
"""

JOBS = """
from django_pgqueue import job


@job("shop.double")
def double(job):
    return {"doubled": job.data["n"] * 2}
"""

ENQUEUE_AND_CHECK = """
import sys
import django
django.setup()
from django.core.management import call_command
from django_pgqueue import enqueue
from django_pgqueue.models import Job

job = enqueue("shop.double", {"n": 21})
call_command("pgqueue_worker", "--burst", "--concurrency", "1")
job.refresh_from_db()
print(job.status, job.result)
sys.exit(0 if (job.status, job.result) == ("completed", {"doubled": 42}) else 1)
"""


def run(*command: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    print("$", " ".join(str(part) for part in command), flush=True)
    subprocess.run([str(part) for part in command], check=True, cwd=cwd, env=env)


def names_in(artefact: Path) -> list[str]:
    if artefact.suffix == ".whl":
        with zipfile.ZipFile(artefact) as wheel:
            return wheel.namelist()
    with tarfile.open(artefact) as sdist:
        # An sdist's paths start with "<name>-<version>/".
        return [member.name.split("/", 1)[1] for member in sdist.getmembers() if "/" in member.name]


def check_contents(artefact: Path) -> None:
    names = set(names_in(artefact))
    missing = [path for path in REQUIRED if path not in names]
    for prefix in COUNTED:
        expected = {
            str(path.relative_to(ROOT))
            for path in (ROOT / prefix).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
        }
        missing += sorted(expected - names)
    if missing:
        raise SystemExit(f"{artefact.name} lacks {len(missing)} file(s): {missing[:10]}")
    print(f"{artefact.name}: {len(names)} files, every required one present")


def main() -> int:
    if "DATABASE_URL" not in os.environ:
        raise SystemExit("DATABASE_URL is not set: run through scripts/with_postgres.py")
    shutil.rmtree(DIST, ignore_errors=True)
    run(sys.executable, "-m", "build", "--outdir", DIST, ROOT)
    artefacts = sorted(DIST.iterdir())
    run(sys.executable, "-m", "twine", "check", "--strict", *artefacts)
    for artefact in artefacts:
        check_contents(artefact)
    (wheel,) = [path for path in artefacts if path.suffix == ".whl"]
    with tempfile.TemporaryDirectory(prefix="pgqueue-release-") as scratch:
        venv = Path(scratch) / "venv"
        run(sys.executable, "-m", "venv", venv)
        python = venv / "bin" / "python"
        run(
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"{wheel}[binary]",
        )
        project = Path(scratch) / "project"
        (project / "shop").mkdir(parents=True)
        (project / "settings.py").write_text(SETTINGS)
        (project / "shop" / "__init__.py").write_text("")
        (project / "shop" / "jobs.py").write_text(JOBS)
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "settings", "PYTHONPATH": str(project)}
        env.pop("VIRTUAL_ENV", None)
        run(python, "-m", "django", "migrate", "--verbosity", "0", cwd=project, env=env)
        run(python, "-c", ENQUEUE_AND_CHECK, cwd=project, env=env)
    print("release check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
