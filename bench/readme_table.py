"""Write the side-by-side table of the committed benchmark results into README.md.

    python bench/readme_table.py [--results bench/results/results.json] [--check]

The README's performance section holds the table between two markers; this script
rebuilds it from ``results.json`` (``report.side_by_side()``, the table that heads
``results.md``), so the README never shows figures of another run. ``--check`` changes
nothing and exits 1 when the README's table differs (the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import Results, side_by_side  # noqa: E402

README = ROOT / "README.md"
RESULTS = ROOT / "bench/results/results.json"
START = "<!-- bench-table:start -->"
END = "<!-- bench-table:end -->"


def block(results: Results) -> str:
    """The README's lines between the markers: when and how the run was made, the table."""
    meta = results.meta
    return "\n".join(
        [
            START,
            f"Run {meta.get('started', '?')}, {meta.get('runs', '?')} run(s) per figure, "
            f"django-pgqueue at {meta.get('commit', '?')}; medians, each system in its best "
            "layout. Every row from the same run on the same machine "
            f"({meta.get('machine', '?')}) and the same durable PostgreSQL.",
            "",
            *side_by_side(results),
            END,
        ]
    )


def with_block(readme: str, results: Results) -> str:
    """``readme`` with the text between the markers replaced."""
    before, start, rest = readme.partition(START)
    _, end, after = rest.partition(END)
    if not start or not end:
        raise ValueError(f"README.md has no {START} ... {END} block")
    return before + block(results) + after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is stale")
    options = parser.parse_args()
    results = Results.from_json(json.loads(options.results.read_text()))
    readme = README.read_text()
    updated = with_block(readme, results)
    if options.check:
        if updated != readme:
            print("README.md's benchmark table differs from", options.results, file=sys.stderr)
            return 1
        return 0
    README.write_text(updated)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
