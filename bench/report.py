"""Turn a benchmark's raw figures into the Markdown report, the targets and the chart."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import baseline
from bench.common import W10_LAYOUT
from bench.systems.harness_pgqueue import PAIRED_BLOCK, PREPARED_OPTIONS


@dataclass
class Figure:
    """One measured figure: every run's value, or the reason there is none."""

    system: str
    workload: str
    variant: str = ""
    values: list[float] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)
    #: The workload's nominal size; runs of another size are flagged in the report.
    nominal: int = 0
    error: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    def cell(self, unit: str) -> str:
        """``median (min-max)``, or why there is no value."""
        if self.error and not self.values:
            return self.error
        if not self.values:
            return "-"
        fmt = _formatter(unit)
        text = fmt(self.median)
        if len(self.values) > 1:
            text += f" ({fmt(min(self.values))}-{fmt(max(self.values))})"
        if self.nominal and any(n != self.nominal for n in self.jobs):
            text += f" [n={'/'.join(f'{n:,}' for n in sorted(set(self.jobs)))}]"
        if self.error:
            text += f" ({self.error})"
        return text


@dataclass
class SystemInfo:
    name: str
    label: str
    version: str = ""
    status: str = "ok"
    slots: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: W7's layouts (I/O-bound jobs, one worker process), when it has its own.
    w7_slots: dict[str, str] = field(default_factory=dict)
    #: Whether its queue is in Redis (issue 28's targets tell the two kinds of peer apart).
    on_redis: bool = False


@dataclass
class Results:
    meta: dict[str, Any]
    systems: list[SystemInfo]
    figures: list[Figure] = field(default_factory=list)

    def figure(self, system: str, workload: str, variant: str = "") -> Figure:
        for figure in self.figures:
            if (figure.system, figure.workload, figure.variant) == (system, workload, variant):
                return figure
        figure = Figure(system, workload, variant)
        self.figures.append(figure)
        return figure

    def find(self, system: str, workload: str, variant: str = "") -> Figure | None:
        for figure in self.figures:
            if (figure.system, figure.workload, figure.variant) == (system, workload, variant):
                return figure
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "systems": [asdict(s) for s in self.systems],
            "figures": [asdict(f) for f in self.figures],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Results:
        """The results ``to_json()`` wrote (``results.json``)."""
        return cls(
            meta=data["meta"],
            systems=[SystemInfo(**s) for s in data["systems"]],
            figures=[Figure(**f) for f in data["figures"]],
        )


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _formatter(unit: str) -> Callable[[float | None], str]:
    """How a figure in ``unit`` is written: milliseconds to a tenth, rates whole."""
    return _fmt_ms if unit == "ms" else _fmt_rate


def _ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


# -- targets --------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    measured: float | None
    goal: float
    higher_is_better: bool = True
    unit: str = ""
    detail: str = ""

    @property
    def verdict(self) -> str:
        if self.measured is None:
            return "n/a"
        ok = self.measured >= self.goal if self.higher_is_better else self.measured < self.goal
        return "PASS" if ok else "MISS"

    def row(self) -> str:
        fmt = (lambda v: f"{v:.2f}x") if self.unit == "x" else _fmt_value(self.unit)
        measured = "-" if self.measured is None else fmt(self.measured)
        sign = ">=" if self.higher_is_better else "<"
        goal = fmt(self.goal)
        return f"| {self.name} | {sign} {goal} | {measured} | {self.verdict} | {self.detail} |"


def _fmt_value(unit: str) -> Any:
    if unit == "ms":
        return lambda v: f"{v:.1f} ms"
    if unit == "%":
        return lambda v: f"{100 * v:.1f}%"
    if unit == "jobs":
        return lambda v: f"{v:,.0f} jobs"
    return lambda v: f"{v:,.0f} jobs/s"


def best_variant(
    results: Results, system: str, workload: str = "W3", *, unit: str = "jobs/s"
) -> Figure | None:
    """The variant of ``system`` with the best median for ``workload``: the highest, or
    the lowest for a time (``unit`` "ms"). W1's best is with the system's default
    options: prepared statements are a choice, not a layout."""
    candidates = [
        f
        for f in results.figures
        if f.system == system
        and f.workload == workload
        and f.median is not None
        and not (workload == "W1" and f.variant)
    ]
    best = min if unit == "ms" else max
    return best(candidates, key=lambda f: f.median or 0.0, default=None)


#: How the W1 "prepared" run configures Django, as the report prints it.
PREPARED_OPTIONS_TEXT = ", ".join(f'"{key}": {value!r}' for key, value in PREPARED_OPTIONS.items())


def targets(results: Results, ours: str = "pgqueue") -> list[Target]:
    """The issue's targets for us, each with its measured value."""
    best = best_variant(results, ours)
    w3 = best.median if best else None
    variant = best.variant if best else ""
    # The one ceiling run.py measures: at a worker's own claim batch (CEILING_BATCH).
    ceiling = next(
        (f for f in results.figures if (f.system, f.workload) == ("pgbench", "W3")), None
    )
    peers = [
        f
        for f in results.figures
        if f.workload == "W3"
        and f.system not in (ours, "pgbench", baseline.NAME)
        and f.median is not None
        and f.variant != ""
    ]
    on_redis = {system.name for system in results.systems if system.on_redis}
    best_redis = max(
        (f for f in peers if f.system in on_redis), key=lambda f: f.median or 0.0, default=None
    )
    best_postgres = max(
        (f for f in peers if f.system not in on_redis), key=lambda f: f.median or 0.0, default=None
    )
    w1 = results.find(ours, "W1")
    w1_prepared = results.find(ours, "W1", "prepared")
    w1_paired = results.find(ours, "W1-ratio")
    bare = results.find("reference", "W1", "bare INSERT")
    bare_rate = bare.median if bare else None
    w1_default = _ratio(w1.median if w1 else None, bare_rate)
    w1_separate = _ratio(w1_prepared.median, bare_rate) if w1_prepared else w1_default
    w2 = results.find(ours, "W2")
    w4 = results.find(ours, "W4-p50")
    w5 = results.find(ours, "W5", variant)
    slowdown = _ratio(w3, w5.median if w5 else None)
    w9 = results.find(ours, "W9", variant)
    w11 = results.find(ours, "W11", variant)
    w8 = results.find(ours, "W8", variant)
    w8_chain = results.find(ours, "W8-chain-p50")
    w7 = best_variant(results, ours, "W7")
    w12 = results.find(ours, "W12", "1x4")
    celery_prefork = results.find("celery", "W3", "prefork-4")
    w10 = results.find(ours, "W10", W10_LAYOUT)
    w10_peak = results.find(ours, "W10-peak", W10_LAYOUT)
    limit = results.meta.get("w10_rate")
    return [
        Target("W3 drain", w3, 10_000, unit="jobs/s", detail=f"best layout: {variant or '-'}"),
        Target(
            f"W3 vs pgbench ceiling ({ceiling.variant if ceiling else 'not run'})",
            _ratio(w3, ceiling.median if ceiling else None),
            0.9,
            unit="x",
            detail=f"ceiling {_fmt_rate(ceiling.median if ceiling else None)} jobs/s",
        ),
        Target(
            "W3 vs every Python PostgreSQL peer",
            _ratio(w3, best_postgres.median if best_postgres else None),
            5.0,
            unit="x",
            detail=_peer_detail(best_postgres),
        ),
        Target(
            "W3 vs each Redis-based peer",
            _ratio(w3, best_redis.median if best_redis else None),
            10.0,
            unit="x",
            detail=_peer_detail(best_redis),
        ),
        Target(
            "W1 vs bare single-row INSERT",
            # Like for like: the bare INSERT runs on psycopg's prepared statements; the
            # interleaved runs when there are any, as they share the disk's moments.
            w1_paired.median if w1_paired else w1_separate,
            0.8,
            unit="x",
            detail=_w1_detail(
                w1_paired, w1_prepared is not None, w1_separate, w1_default, bare_rate
            ),
        ),
        _w1_against_celery(results, w1_prepared or w1),
        Target("W2 bulk enqueue", w2.median if w2 else None, 50_000, unit="jobs/s"),
        Target("W4 latency p50", w4.median if w4 else None, 10.0, False, unit="ms"),
        _w4_p99_against_peers(results, ours),
        Target(
            "W5 slowdown (W3 / W5)",
            slowdown,
            1.1,
            False,
            unit="x",
            detail=f"layout {variant or '-'}",
        ),
        Target(
            "W9 one job per key at once, vs W3",
            _ratio(w9.median if w9 else None, w3),
            0.5,
            unit="x",
            detail=f"layout {variant or '-'}",
        ),
        Target(
            "W11 1,000 per-key rates at once, vs W3",
            _ratio(w11.median if w11 else None, w3),
            0.5,
            unit="x",
            detail=f"layout {variant or '-'}",
        ),
        Target(
            "W8 chord of 10,000 and a callback, vs W3",
            _ratio(w8.median if w8 else None, w3),
            0.5,
            unit="x",
            detail=f"layout {variant or '-'}; enqueue to callback done",
        ),
        Target(
            "W8 chain step-to-step p50",
            w8_chain.median if w8_chain else None,
            5.0,
            False,
            unit="ms",
            detail="no-op steps: a step's start minus the previous step's start",
        ),
        Target(
            "W7 jobs awaiting 50 ms of I/O, one process",
            w7.median if w7 else None,
            5_000,
            unit="jobs/s",
            detail=f"layout {w7.variant if w7 else '-'}",
        ),
        Target(
            "W12 no-op jobs in 4 child processes, vs Celery's prefork pool",
            _ratio(w12.median if w12 else None, celery_prefork.median if celery_prefork else None),
            0.5,
            unit="x",
            detail=f"Celery prefork-4 W3: "
            f"{_fmt_rate(celery_prefork.median if celery_prefork else None)} jobs/s",
        ),
        Target(
            "W10 rate kept, off the limit by",
            None if not (w10 and w10.values and limit) else abs(w10.median / limit - 1),
            0.05,
            False,
            unit="%",
            detail=f"limit {limit}/s, 4 worker processes; median "
            f"{_fmt_rate(w10.median if w10 else None)} jobs/s",
        ),
        Target(
            "W10 most starts in any second",
            max(w10_peak.values) if w10_peak and w10_peak.values else None,
            (limit or 0) + 1,
            False,
            unit="jobs",
            detail="read back from started_at; the limit is never exceeded",
        ),
    ]


def _w1_against_celery(results: Results, w1: Figure | None) -> Target:
    """Issue 28: single enqueues at least as fast as Celery's ``.delay()`` on Redis
    without persistence, though each of ours is a durable commit."""
    celery = results.find("celery", "W1")
    ratio = _ratio(w1.median if w1 else None, celery.median if celery else None)
    how = "with Django's prepared statements" if w1 and w1.variant else "Django's defaults"
    return Target(
        "W1 vs Celery's .delay() on Redis without persistence",
        ratio,
        1.0,
        unit="x",
        detail=f"ours {how}, each a durable commit; Celery "
        f"{_fmt_rate(celery.median if celery else None)} jobs/s, lost with Redis",
    )


def _w4_p99_against_peers(results: Results, ours: str) -> Target:
    """Issue 28: W4's p99 at most the best peer's in the same run."""
    mine = results.find(ours, "W4-p99")
    peers = [
        f
        for f in results.figures
        if f.workload == "W4-p99" and f.system not in (ours, baseline.NAME) and f.median is not None
    ]
    best = min(peers, key=lambda f: f.median or 0.0, default=None)
    mine_ms = mine.median if mine else None
    detail = "no peer measured"
    if best is not None and best.median is not None:
        ours_text = "-" if mine_ms is None else f"{mine_ms:.1f}"
        detail = f"ours {ours_text} ms, best: {best.system} {best.median:.1f} ms"
    return Target(
        "W4 p99 vs the best peer's",
        _ratio(mine_ms, best.median if best else None),
        1.0,
        False,
        unit="x",
        detail=detail,
    )


def _peer_detail(best: Figure | None) -> str:
    """The fastest peer of a kind, which a ratio to every peer of that kind is taken to."""
    if best is None:
        return "no peer of this kind measured"
    return f"fastest: {best.system} {best.variant}, {_fmt_rate(best.median)} jobs/s"


def _w1_detail(
    paired: Figure | None,
    prepared: bool,
    separate: float | None,
    default: float | None,
    bare_rate: float | None,
) -> str:
    options = f"Django's prepared statements (`{PREPARED_OPTIONS_TEXT}`)"
    parts = []
    if paired and paired.values:
        parts.append(
            f"interleaved with the bare INSERT in blocks of {PAIRED_BLOCK} jobs, {options}, "
            f"runs {min(paired.values):.2f}-{max(paired.values):.2f}x"
        )
        parts.append(f"in separate runs: {separate or 0:.2f}x")
    elif prepared:
        parts.append(f"with {options}")
    if prepared or paired:
        parts.append(f"Django's default options: {default or 0:.2f}x")
    else:
        parts.append("Django's default options")
    parts.append(f"bare INSERT {_fmt_rate(bare_rate)} jobs/s")
    return "; ".join(parts)


def targets_table(results: Results) -> str:
    lines = ["| Target | Goal | Measured | Verdict | Detail |", "|---|---|---|---|---|"]
    lines += [t.row() for t in targets(results)]
    return "\n".join(lines)


# -- Markdown -------------------------------------------------------------------------


def _system_label(results: Results, name: str) -> str:
    for system in results.systems:
        if system.name == name:
            return f"{system.label} {system.version}".strip()
    return name


def markdown(results: Results) -> str:
    """The whole report: settings, the tables, the targets, the notes."""
    meta = results.meta
    out = [
        "# django-pgqueue benchmark results",
        "",
        f"Run {meta.get('started', '?')} ({meta.get('mode', '?')} mode, "
        f"{meta.get('runs', '?')} run(s) per figure, {meta.get('duration', '?')}); "
        f"django-pgqueue at {meta.get('commit', '?')}. "
        "Each cell: median (min-max) over the runs.",
        "",
        f"Machine: {meta.get('machine', '?')}. Sizes: {meta.get('sizes', '?')}.",
        "",
        "PostgreSQL settings (the same server and settings for every system):",
        "",
        "| setting | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in meta.get("settings", {}).items()),
        "",
        "## Side by side",
        "",
        "Each system's median in its best layout (the tables below give every layout, "
        "with min and max). n/a: not measured for that system (see the notes).",
        "",
        *side_by_side(results),
        "",
        "## Targets (django-pgqueue)",
        "",
        targets_table(results),
        "",
        *baseline_section(results),
        "## Enqueue and latency",
        "",
        "| System | W1 single (jobs/s) | W2 bulk (jobs/s) | W4 p50 (ms) | W4 p99 (ms) |",
        "|---|---|---|---|---|",
    ]
    for system in results.systems:
        if system.status != "ok":
            if system.name not in ("pgbench", "reference"):
                out.append(f"| {system.label} | {system.status} | | | |")
            continue
        if system.name in ("pgbench", "reference"):
            continue
        cells = [
            _cell(results, system.name, "W1", "", "jobs/s"),
            _cell(results, system.name, "W2", "", "jobs/s"),
            _cell(results, system.name, "W4-p50", "", "ms"),
            _cell(results, system.name, "W4-p99", "", "ms"),
        ]
        out.append(f"| {_system_label(results, system.name)} | " + " | ".join(cells) + " |")
    prepared = results.find("pgqueue", "W1", "prepared")
    if prepared:
        out.append(
            f"| django-pgqueue, Django's prepared statements (`{PREPARED_OPTIONS_TEXT}`) "
            f"| {prepared.cell('jobs/s')} | | | |"
        )
    bare = results.find("reference", "W1", "bare INSERT")
    if bare:
        out.append(
            f"| bare INSERT, 1 row per transaction (psycopg) | {bare.cell('jobs/s')} | | | |"
        )
    paired = results.find("pgqueue", "W1-ratio")
    if paired and paired.values:
        out += [
            "",
            f"W1 interleaved with the bare INSERT (blocks of {PAIRED_BLOCK} jobs in ABBA "
            f"order, Django's prepared statements), ours over bare: {paired.median:.2f}x "
            f"({min(paired.values):.2f}-{max(paired.values):.2f}x).",
        ]
    out += [
        "",
        "## Draining (4 worker slots in total)",
        "",
        "| System | Slots | W3 drain (jobs/s) | W5 after finished rows (jobs/s) | W5 slowdown "
        "| W6 mixed (jobs/s) | W9 one per key (jobs/s) | W9 / W3 | W11 per-key rates (jobs/s) "
        "| W11 / W3 | W13 writing a row (jobs/s) | W13 / W3 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for system in results.systems:
        if system.status != "ok" or system.name == "reference":
            continue
        for variant, how in system.slots.items():
            w3 = results.find(system.name, "W3", variant)
            w5 = results.find(system.name, "W5", variant)
            slowdown = _ratio(w3.median if w3 else None, w5.median if w5 else None)
            cells = [
                how,
                _cell(results, system.name, "W3", variant, "jobs/s"),
                _cell(results, system.name, "W5", variant, "jobs/s"),
                "-" if slowdown is None else f"{slowdown:.2f}x",
                _cell(results, system.name, "W6", variant, "jobs/s"),
                _cell(results, system.name, "W9", variant, "jobs/s"),
                _ratio_cell(results, system.name, ("W9", "W3"), variant),
                _cell(results, system.name, "W11", variant, "jobs/s"),
                _ratio_cell(results, system.name, ("W11", "W3"), variant),
                _cell(results, system.name, "W13", variant, "jobs/s"),
                _ratio_cell(results, system.name, ("W13", "W3"), variant),
            ]
            out.append(f"| {_system_label(results, system.name)} | " + " | ".join(cells) + " |")
    out += [
        "",
        "## Workflows (W8)",
        "",
        "A chord: its members side by side, then a callback after them all, timed from the "
        "start of the enqueue to the callback's finish. A chain of no-op steps: each step's "
        "start minus the previous step's start, as the handlers report them, idle workers.",
        "",
        "| System | Slots | W8 chord (jobs/s) | W8 / W3 | chain step-to-step p50 (ms) | p95 (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for system in results.systems:
        if system.status != "ok" or system.name == "reference":
            continue
        for index, (variant, how) in enumerate(system.slots.items()):
            chain = index == 0  # the chain runs in the first layout only
            cells = [
                how,
                _cell(results, system.name, "W8", variant, "jobs/s"),
                _ratio_cell(results, system.name, ("W8", "W3"), variant),
                _cell(results, system.name, "W8-chain-p50", "", "ms") if chain else "",
                _cell(results, system.name, "W8-chain-p95", "", "ms") if chain else "",
            ]
            out.append(f"| {_system_label(results, system.name)} | " + " | ".join(cells) + " |")
    out += _against_celery(results)
    out += _io_section(results)
    out += _process_section(results)
    limit = meta.get("w10_rate")
    out += [
        "",
        f"## Rate limits (W10: {limit} jobs/s, 4 worker processes)",
        "",
        "| System | Jobs started a second, over the window | Most starts in any second |",
        "|---|---|---|",
    ]
    for system in results.systems:
        if system.status != "ok" or system.name in ("pgbench", "reference"):
            continue
        cells = [_cell(results, system.name, "W10", W10_LAYOUT, "jobs/s")]
        peak = results.find(system.name, "W10-peak", W10_LAYOUT)
        if peak and peak.values:
            cells.append(f"{max(peak.values):,.0f}")
        else:
            cells.append(peak.error if peak and peak.error else "-")
        out.append(f"| {_system_label(results, system.name)} | " + " | ".join(cells) + " |")
    out += ["", "## Notes", ""]
    for system in results.systems:
        for note in system.notes:
            out.append(f"- {system.label}: {note}")
    for note in meta.get("notes", []):
        out.append(f"- {note}")
    return "\n".join(out) + "\n"


#: The Celery rows W8 is compared with: (system, its label in the comparison).
CELERY_ROWS = (("celery", "on Redis without persistence"), ("celery-durable", "on durable Redis"))


def _against_celery(results: Results) -> list[str]:
    """W8 side by side with Celery's canvas: each system's best layout, and the chain."""
    ours = best_variant(results, "pgqueue", "W8")
    chain = results.find("pgqueue", "W8-chain-p50")
    lines = []
    for name, how in CELERY_ROWS:
        theirs = best_variant(results, name, "W8")
        their_chain = results.find(name, "W8-chain-p50")
        chord_ratio = _ratio(ours.median if ours else None, theirs.median if theirs else None)
        if chord_ratio is None or ours is None or theirs is None:
            continue
        line = (
            f"- Against Celery {how}: the chord {chord_ratio:.1f}x as fast "
            f"({ours.median:,.0f} jobs/s, {ours.variant}, against {theirs.median:,.0f}, "
            f"{theirs.variant})"
        )
        if chain and chain.median is not None and their_chain and their_chain.median is not None:
            line += (
                f"; a chain's step-to-step p50 {chain.median:.1f} ms against "
                f"{their_chain.median:.1f} ms"
            )
        lines.append(line + ".")
    return ["", *lines] if lines else []


def _io_section(results: Results) -> list[str]:
    """W7: I/O-bound jobs in one worker process, each system at its settings for them,
    with each figure's ratio to ours."""
    ours = best_variant(results, "pgqueue", "W7")
    rows = []
    for system in results.systems:
        if system.status != "ok" or system.name in ("pgbench", "reference"):
            continue
        layouts = system.w7_slots or dict(list(system.slots.items())[:1])
        for variant, how in layouts.items():
            figure = results.find(system.name, "W7", variant)
            if figure is None:
                continue
            ratio = _ratio(ours.median if ours else None, figure.median)
            cells = [how, figure.cell("jobs/s"), "-" if ratio is None else f"{ratio:.2f}x"]
            rows.append(f"| {_system_label(results, system.name)} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [
        "",
        "## I/O-bound jobs (W7)",
        "",
        "Jobs that each wait 50 ms on simulated I/O (`asyncio.sleep` in async handlers, "
        "`time.sleep` in Celery's threads and greenlets), drained by one worker process.",
        "",
        "| System | Slots | W7 (jobs/s) | django-pgqueue's best / this |",
        "|---|---|---|---|",
        *rows,
    ]


def _process_section(results: Results) -> list[str]:
    """W12: no-op jobs through process slots beside the same through threads (W3 in
    1x4), the cost of isolation per job, and Celery's prefork pool when measured."""
    isolated = results.find("pgqueue", "W12", "1x4")
    if isolated is None or isolated.median is None:
        return []
    threads = results.find("pgqueue", "W3", "1x4")
    rows = [
        f"| django-pgqueue, 4 child processes (`--process-concurrency 4`) | "
        f"{isolated.cell('jobs/s')} | 1.00x |"
    ]
    overhead = ""
    if threads is not None and threads.median:
        rows.append(
            f"| django-pgqueue, 4 threads (W3, `--concurrency 4`) | {threads.cell('jobs/s')} | "
            f"{isolated.median / threads.median:.2f}x |"
        )
        per_job = (1 / isolated.median - 1 / threads.median) * 1000 * 4
        overhead = (
            f"Process isolation costs about {per_job:.2f} ms of a slot's time per job "
            "(a pipe round trip to the child, the job pickled there and the outcome back)."
        )
    for name, how in CELERY_ROWS:
        prefork = results.find(name, "W3", "prefork-4")
        if prefork is not None and prefork.median:
            rows.append(
                f"| Celery {how}, prefork pool (W3, `--concurrency 4`) | "
                f"{prefork.cell('jobs/s')} | {isolated.median / prefork.median:.2f}x |"
            )
    return [
        "",
        "## Process isolation (W12)",
        "",
        'No-op jobs of an `isolation="process"` job type, one worker process with 4 '
        "child processes, beside the same jobs on 4 threads and Celery's prefork pool.",
        "",
        "| Run | Jobs/s | W12 / this |",
        "|---|---|---|",
        *rows,
        *(["", overhead] if overhead else []),
    ]


def _ratio_cell(results: Results, system: str, workloads: tuple[str, str], variant: str) -> str:
    """The ratio of two workloads' medians, or ``-``."""
    upper, lower = (results.find(system, workload, variant) for workload in workloads)
    ratio = _ratio(upper.median if upper else None, lower.median if lower else None)
    return "-" if ratio is None else f"{ratio:.2f}x"


def _cell(results: Results, system: str, workload: str, variant: str, unit: str) -> str:
    figure = results.find(system, workload, variant)
    return figure.cell(unit) if figure else "-"


# -- chart ----------------------------------------------------------------------------


#: Chart panels: workload, title.
PANELS = [
    ("W1", "W1 single enqueue (jobs/s)"),
    ("W2", "W2 bulk enqueue (jobs/s)"),
    ("W3", "W3 drain (jobs/s)"),
    ("W5", "W5 drain after finished rows (jobs/s)"),
    ("W6", "W6 1 ms CPU, 10 % retried (jobs/s)"),
    ("W4-p50", "W4 latency p50 (ms, lower is better)"),
]


def chart(results: Results, path: Path) -> None:
    """A bar chart per workload: medians, min-max whiskers, the median written out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for ax, (workload, title) in zip(axes.flat, PANELS, strict=True):
        figures = [f for f in results.figures if f.workload == workload and f.values]
        medians = [f.median or 0.0 for f in figures]
        low = [m - min(f.values) for m, f in zip(medians, figures, strict=True)]
        high = [max(f.values) - m for m, f in zip(medians, figures, strict=True)]
        positions = list(range(len(figures)))
        ax.barh(
            positions,
            medians,
            xerr=[low, high],
            color=[_color(f.system) for f in figures],
            capsize=3,
        )
        ax.set_yticks(positions, [_bar_label(f) for f in figures], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        fmt = _fmt_ms if workload.startswith("W4") else _fmt_rate
        for position, median, figure in zip(positions, medians, figures, strict=True):
            ax.annotate(
                fmt(median),
                (max(figure.values), position),  # past the whisker
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
            )
        ax.margins(x=0.2)
    fig.suptitle(
        f"django-pgqueue and peers, {results.meta.get('started', '')}, "
        f"{results.meta.get('mode', '')} mode: median of {results.meta.get('runs', '?')} "
        "run(s), min-max whiskers",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bar_label(figure: Figure) -> str:
    if figure.system == "reference":
        return figure.variant
    return f"{figure.system} {figure.variant}".strip()


def _color(system: str) -> str:
    return {
        "pgqueue": "#2a7ab9",
        "pgbench": "#999999",
        "reference": "#bbbbbb",
        "procrastinate": "#e3872d",
        "pgqueuer": "#3b9c54",
        "django-tasks-db": "#b54a8f",
        "oban": "#8c6d31",
        "chancy": "#17becf",
        "dbos": "#9467bd",
        "django-absurd": "#bcbd22",
        "celery": "#d62728",
        "celery-durable": "#ff9896",
        "rq": "#7f3b08",
        "rq-durable": "#c7a27c",
        "dramatiq": "#2ca02c",
        "dramatiq-durable": "#98df8a",
    }.get(system, "#777777")


#: The sides of a drain whose CPU time is counted: the workers and the server.
CPU_SIDES = ("worker", "server")

#: The least ratio to the baseline a figure may show (``--baseline``).
BASELINE_GOAL = 0.97


def baseline_targets(results: Results) -> list[Target]:
    """Each compared figure of the working tree as a ratio to the same figure of the
    baseline (``bench/run.py --baseline REV``); empty without one."""
    if not any(f.system == baseline.NAME for f in results.figures):
        return []
    found = []
    for workload, variant in baseline.COMPARED:
        ours = results.find("pgqueue", workload, variant)
        before = results.find(baseline.NAME, workload, variant)
        if ours is None or before is None:
            continue
        found.append(
            Target(
                f"{workload} {variant or 'default'} vs baseline",
                _ratio(ours.median, before.median),
                BASELINE_GOAL,
                unit="x",
                detail=f"{ours.cell('jobs/s')} against {before.cell('jobs/s')}",
            )
        )
    return found


def baseline_section(results: Results) -> list[str]:
    rows = baseline_targets(results)
    if not rows:
        return []
    label = _system_label(results, baseline.NAME)
    return [
        f"## Against the baseline ({label})",
        "",
        "The same workloads, in the same runs, interleaved: the working tree over the "
        "baseline, medians.",
        "",
        "| Figure | Target | Measured | Verdict | Working tree against baseline (jobs/s) |",
        "|---|---|---|---|---|",
        *(target.row() for target in rows),
        "",
        *_cpu_table(results),
    ]


def _cpu_table(results: Results) -> list[str]:
    """CPU time per job of the drains compared with the baseline: the workers' and the
    server's, each a median over the runs. Less blurred than a rate by what else the
    machine runs, it shows on which side a difference of rates lies."""
    rows = []
    for workload, variant in baseline.COMPARED:
        for side in CPU_SIDES:
            ours = results.find("pgqueue", f"{workload}-{side}-cpu", variant)
            before = results.find(baseline.NAME, f"{workload}-{side}-cpu", variant)
            if ours is None or before is None or not ours.values or not before.values:
                continue
            ratio = _ratio(ours.median, before.median)
            rows.append(
                f"| {workload} {variant} | {side} | {ours.median:,.1f} "
                f"({min(ours.values):,.1f}-{max(ours.values):,.1f}) | {before.median:,.1f} "
                f"({min(before.values):,.1f}-{max(before.values):,.1f}) | {ratio:.3f}x |"
            )
    if not rows:
        return []
    return [
        "CPU time per job, in microseconds (medians, min-max): the worker processes (every "
        "thread, from `go` to their exit) and the PostgreSQL server (every process of it).",
        "",
        "| Figure | Side | Working tree | Baseline | Ratio |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]


#: The workloads of the side-by-side table, with their column headers and units.
SIDE_BY_SIDE = (
    ("W1", "W1 single enqueue (jobs/s)", "jobs/s"),
    ("W2", "W2 bulk enqueue (jobs/s)", "jobs/s"),
    ("W3", "W3 drain, 4 slots (jobs/s)", "jobs/s"),
    ("W4-p50", "W4 latency p50 (ms)", "ms"),
    ("W4-p99", "W4 latency p99 (ms)", "ms"),
    ("W6", "W6 1 ms jobs, 10 % retried (jobs/s)", "jobs/s"),
)


def _kept_in(system: SystemInfo) -> str:
    """What a system's queue promises when it says a job is enqueued."""
    if not system.on_redis:
        return "PostgreSQL, durable commit"
    if system.name.endswith("-durable"):
        return "Redis, `appendfsync always`"
    return "Redis, no persistence"


def side_by_side(results: Results) -> list[str]:
    """One row a system: each workload's median in the system's best layout (the
    README's table); W1 with the system's default options."""
    out = [
        "| System | Queue kept in | " + " | ".join(h for _, h, _ in SIDE_BY_SIDE) + " |",
        "|---|---|" + "---:|" * len(SIDE_BY_SIDE),
    ]
    for system in results.systems:
        if system.name in ("pgbench", "reference"):
            continue
        if system.status != "ok":
            out.append(
                f"| {system.label} | {_kept_in(system)} | {system.status} |"
                + " |" * (len(SIDE_BY_SIDE) - 1)
            )
            continue
        cells = []
        for workload, _, unit in SIDE_BY_SIDE:
            best = best_variant(results, system.name, workload, unit=unit)
            cells.append("n/a" if best is None else _formatter(unit)(best.median))
        label = _system_label(results, system.name)
        out.append(f"| {label} | {_kept_in(system)} | " + " | ".join(cells) + " |")
    return out


def summary_lines(results: Results) -> Iterable[str]:
    """What the command prints at the end: the targets, one per line."""
    for target in [*targets(results), *baseline_targets(results)]:
        scale = 100 if target.unit == "%" else 1
        measured = "-" if target.measured is None else f"{scale * target.measured:,.2f}"
        sign = ">=" if target.higher_is_better else "<"
        yield (
            f"{target.verdict:4}  {target.name}: {measured} {target.unit} "
            f"(target {sign} {scale * target.goal:g} {target.unit}) {target.detail}"
        )
