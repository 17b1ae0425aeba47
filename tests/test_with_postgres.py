"""scripts/with_postgres.py: the PostgreSQL release it picks from the npm package's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "with_postgres.py"


def load_script():
    spec = importlib.util.spec_from_file_location("with_postgres", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("with_postgres", module)
    spec.loader.exec_module(module)
    return module


VERSIONS = [
    "13.23.0-beta.16",
    "14.9.0-beta.15",
    "14.10.0-beta.15",
    "14.10.0-beta.16",
    "14.2.0-beta.17",
    "141.0.0",  # not a release of 14
    "16.9.0-beta.15",
]


def test_the_newest_release_of_a_major_is_picked_by_number_not_by_text():
    script = load_script()

    assert script.newest_release(VERSIONS, 14) == "14.10.0-beta.16"
    assert script.newest_release(VERSIONS, 16) == "16.9.0-beta.15"


def test_a_major_without_a_release_is_refused_by_name():
    script = load_script()

    with pytest.raises(SystemExit, match="no release of PostgreSQL 12"):
        script.newest_release(VERSIONS, 12)
