"""The report's charts as inline SVG (no script, no external file): one line chart of a figure
per release, the releases in the order they were recorded, one point per release that has the
figure, a gap where one has none.

Every text that reaches the SVG (a release's name, a figure) is escaped by `esc`: a release's
name is read from a node."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from servefleet.core.node_output import shown

WIDTH, HEIGHT = 560, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 34, 62
LABEL_MAX = 16  # characters of a release's name under its point (whole in the tooltip)
# The series' colours (the page's legend and the tests look for them).
COLOURS = {"decode": "#2563eb", "ttft": "#ea580c"}


def esc(text: object) -> str:
    """Remote text for HTML or SVG: controls written as escapes (core.node_output.shown), then
    &, <, >, " and ' as entities."""
    return html.escape(shown(str(text)), quote=True)


def _short(text: str) -> str:
    return text if len(text) <= LABEL_MAX else text[: LABEL_MAX - 1] + "…"


def nice_top(value: float) -> tuple[float, int]:
    """The axis' top, the smallest 1, 2, 2.5 or 5 times a power of ten above `value` * 1.1,
    and the steps from 0 to it that fall on round numbers (4 of 0.5 to 2, 5 of 1 to 5)."""
    target = value * 1.1 if value > 0 else 1.0
    power = 10 ** math.floor(math.log10(target))
    mantissa = next(m for m in (1, 2, 2.5, 5, 10) if m * power >= target)
    return mantissa * power, 5 if mantissa in (2.5, 5) else 4


def _number(value: float) -> str:
    """A figure as the chart writes it: 165, 41.2, 0.032."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.3f}"


def _tick(value: float) -> str:
    """An axis value, exactly: 0, 50, 0.0125."""
    return f"{round(value, 10):g}"


def line_chart(
    series: str,
    title: str,
    unit: str,
    labels: Sequence[tuple[str, str]],
    values: Sequence[float | None],
) -> str:
    """An <svg> of `values` (one per label, None: not measured) as a line with a dot per value,
    coloured as COLOURS[series]; each label is two lines (a release's version, and its id or
    state) under its point; the dots carry the release's index."""
    colour = COLOURS[series]
    n = len(labels)
    top, steps = nice_top(max((v for v in values if v is not None), default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return round(LEFT + (i + 0.5) * plot_w / max(n, 1), 1)

    def y(v: float) -> float:
        return round(TOP + plot_h - v / top * plot_h, 1)

    parts = [
        f'<svg class="chart {series}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{esc(title)}">',
        f'<text class="title" x="{LEFT}" y="20">{esc(title)}</text>',
    ]
    for k in range(steps + 1):  # the grid and the axis' values, 0 to the top
        tick = top * k / steps
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick)}" y2="{y(tick)}"/>'
            f'<text class="tick" x="{LEFT - 6}" y="{y(tick) + 4}">{_tick(tick)}</text>'
        )
    path, pen_down = [], False
    for i, value in enumerate(values):
        if value is None:
            pen_down = False
            continue
        path.append(f"{'L' if pen_down else 'M'}{x(i)},{y(value)}")
        pen_down = True
    if path:
        parts.append(
            f'<path class="series" d="{" ".join(path)}" fill="none" stroke="{colour}" '
            f'stroke-width="3" stroke-linejoin="round"/>'
        )
    for i, ((first, second), v) in enumerate(zip(labels, values, strict=True)):
        label = f"{first} ({second})"
        parts.append(
            f'<text class="label" x="{x(i)}" y="{HEIGHT - BOTTOM + 18}">'
            f"<title>{esc(label)}</title>{esc(_short(first))}"
            f'<tspan class="sub" x="{x(i)}" dy="14">{esc(_short(second))}</tspan></text>'
        )
        if v is None:
            parts.append(
                f'<text class="none" x="{x(i)}" y="{TOP + plot_h - 6}">not measured</text>'
            )
            continue
        parts.append(
            f'<circle class="point" data-release="{i}" cx="{x(i)}" cy="{y(v)}" r="6" '
            f'fill="{colour}"><title>{esc(label)}: {_number(v)} {esc(unit)}</title></circle>'
            f'<text class="value" x="{x(i)}" y="{y(v) - 11}">{_number(v)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
