"""Line charts drawn on the server as SVG: no script and no library to ship, readable
without JavaScript, and testable as text.

``line_chart()`` draws one or more series over the same points; a ``None`` value breaks
its line (no rollups then). Colours come from the stylesheet (``pgqueue-series-N``
classes), so that the admin's dark theme applies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

WIDTH = 720
HEIGHT = 200
#: Room for the axes' labels: left, right, top, bottom.
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 56, 12, 12, 24


@dataclass(frozen=True)
class Line:
    """One series: its label in the legend and its values, one per point."""

    label: str
    values: Sequence[float | int | None]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2 or 5 times a power of ten at or above ``value`` (> 0): the
    top of the axis."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return 10.0 * power  # pragma: no cover - the loop ends at 10


def line_chart(
    title: str,
    times: Sequence[datetime],
    lines: Sequence[Line],
    *,
    format_value: Callable[[float], str],
    format_time: Callable[[datetime], str],
) -> SafeString:
    """An SVG line chart of ``lines`` over ``times``, with its title, a y axis from 0,
    the first, middle and last times, a legend, and each point's value as a tooltip."""
    known = [v for line in lines for v in line.values if v is not None]
    top = nice_ceiling(max(known, default=0))
    plot_w = WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    count = max(len(times), 1)

    def x(k: int) -> float:
        return PAD_LEFT + (plot_w * k / (count - 1) if count > 1 else plot_w / 2)

    def y(value: float) -> float:
        return PAD_TOP + plot_h * (1 - value / top)

    parts = [
        f'<svg class="pgqueue-chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
    ]
    for fraction in (0, 0.5, 1):
        level = y(top * fraction)
        parts.append(
            f'<line class="pgqueue-chart-grid" x1="{PAD_LEFT}" x2="{WIDTH - PAD_RIGHT}" '
            f'y1="{level:.1f}" y2="{level:.1f}"/>'
            f'<text class="pgqueue-chart-label" x="{PAD_LEFT - 6}" y="{level + 4:.1f}" '
            f'text-anchor="end">{escape(format_value(top * fraction))}</text>'
        )
    if times:
        for k, anchor in ((0, "start"), (len(times) // 2, "middle"), (len(times) - 1, "end")):
            parts.append(
                f'<text class="pgqueue-chart-label" x="{x(k):.1f}" y="{HEIGHT - 6}" '
                f'text-anchor="{anchor}">{escape(format_time(times[k]))}</text>'
            )
    for number, line in enumerate(lines):
        parts.append(f'<g class="pgqueue-series pgqueue-series-{number}">')
        for run in _runs(line.values):
            points = " ".join(f"{x(k):.1f},{y(v):.1f}" for k, v in run)
            parts.append(f'<polyline fill="none" points="{points}"/>')
            for k, v in run:
                tip = f"{line.label} {format_time(times[k])}: {format_value(v)}"
                parts.append(
                    f'<circle cx="{x(k):.1f}" cy="{y(v):.1f}" r="2">'
                    f"<title>{escape(tip)}</title></circle>"
                )
        parts.append("</g>")
    if not known:
        parts.append(
            f'<text class="pgqueue-chart-empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" '
            f'text-anchor="middle">{escape(_("No rollups in this span yet."))}</text>'
        )
    parts.append("</svg>")
    legend = "".join(
        f'<li class="pgqueue-series-{number}"><span class="pgqueue-swatch"></span>'
        f"{escape(line.label)}</li>"
        for number, line in enumerate(lines)
    )
    return mark_safe(
        f'<figure class="pgqueue-figure"><figcaption>{escape(title)}</figcaption>'
        f'{"".join(parts)}<ul class="pgqueue-legend">{legend}</ul></figure>'
    )


def _runs(values: Sequence[float | int | None]) -> list[list[tuple[int, float]]]:
    """The stretches of consecutive known values, with their positions."""
    runs: list[list[tuple[int, float]]] = [[]]
    for k, value in enumerate(values):
        if value is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((k, float(value)))
    return [run for run in runs if run]
