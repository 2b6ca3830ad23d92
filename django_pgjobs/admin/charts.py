"""Line charts as inline SVG, drawn on the server: no JavaScript, no asset build.

The y axis is logarithmic (log of 1 + value), because a queue's figures span orders of magnitude
within one chart: a burst of 3,000 a minute beside a steady 12 must leave the 12 visible. Each
series has its own colour (at least 3:1 against the admin's light and dark backgrounds) and its
own dash pattern, and the legend names each in text beside a sample of its line, so no series is
told apart by colour alone. Times are UTC, and the chart says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

WIDTH = 420
HEIGHT = 160
LEFT = 40  # room for the y labels
RIGHT = 8
TOP = 10
BOTTOM = 24  # room for the time labels

# (css class, stroke colour, dash pattern): the classes the dashboard's style sheet knows.
STYLES = {
    "ready": ("#3a7bd5", ""),
    "running": ("#8e6cc4", "7 3"),
    "waiting": ("#888888", "2 3"),
    "succeeded": ("#3c9a4e", "12 3 2 3"),
    "failed": ("#e0453a", "4 2"),
    "wait": ("#e06b00", ""),
}


@dataclass(frozen=True)
class Series:
    """One line: ``key`` picks its style (a key of ``STYLES``), ``label`` names it."""

    key: str
    label: str
    values: Sequence[float | None]


def log_position(value: float, top: float) -> float:
    """Where ``value`` sits between 0 and ``top`` on the chart's log scale, from 0 to 1."""
    return math.log10(1 + max(value, 0)) / math.log10(1 + top) if top > 0 else 0.0


def log_top(peak: float) -> float:
    """The scale's top: the power of ten at or above the peak (10 at least)."""
    return 10.0 ** max(1, math.ceil(math.log10(peak))) if peak > 10 else 10.0


def legend(series: Sequence[Series]) -> SafeString:
    """The series' names, each after a sample of its line."""
    return format_html(
        '<ul class="pgjobs-legend">{}</ul>',
        format_html_join("", '<li><svg width="28" height="10" aria-hidden="true">'
                         '<line x1="0" y1="5" x2="28" y2="5" stroke="{}" stroke-width="2.5" '
                         'stroke-dasharray="{}"/></svg> {}</li>',
                         ((*STYLES[s.key], s.label) for s in series)),
    )


def _compact(value: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def log_chart(
    chart_id: str, times: Sequence[datetime], series: Sequence[Series], *, title: str,
    unit: str = "", time_format: str = "%H:%M", label_every: int = 10,
) -> SafeString:
    """One chart of ``series`` over ``times`` (oldest first), with its legend under it."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    peak = max((v for s in series for v in s.values if v is not None), default=0.0)
    top = log_top(peak)
    step = plot_w / max(len(times) - 1, 1)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - log_position(value, top))

    lines, dots = [], []
    for s in series:
        # A gap (None) breaks the line; a point alone between gaps is drawn as a dot.
        segments: list[list[tuple[float, float]]] = [[]]
        for i, value in enumerate(s.values):
            if value is None:
                segments.append([])
            else:
                segments[-1].append((LEFT + i * step, y(value)))
        path = " ".join("M" + " L".join(f"{x:.1f},{yy:.1f}" for x, yy in seg)
                        for seg in segments if len(seg) > 1)
        colour, dash = STYLES[s.key]
        dots += [(f"{seg[0][0]:.1f}", f"{seg[0][1]:.1f}", colour) for seg in segments
                 if len(seg) == 1]
        peak_s = max((v for v in s.values if v is not None), default=None)
        lines.append((path or "M0,0", colour, dash, f"{s.label}: peak "
                      + ("none" if peak_s is None else f"{_compact(round(peak_s, 1))}{unit}")))
    grid = [0.0, *(10.0 ** k for k in range(0, round(math.log10(top)) + 1))]
    y_labels = [(f"{LEFT - 4}", f"{y(v) + 3:.1f}", f"{_compact(v)}{unit}", f"{y(v):.1f}")
                for v in grid]
    x_labels = [(f"{LEFT + i * step:.1f}", f"{HEIGHT - 6}", f"{t:{time_format}}")
                for i, t in enumerate(times) if i % label_every == 0]
    summary = "; ".join(text for *_, text in lines)
    return format_html(
        '<figure class="pgjobs-chart"><svg xmlns="http://www.w3.org/2000/svg" id="{id}" '
        'role="img" viewBox="0 0 {w} {h}" aria-label="{aria}">'
        '<title>{title}</title>{grid}'
        '<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" class="pgjobs-axis"/>'
        "{lines}{dots}{y_labels}{x_labels}</svg>"
        '<figcaption>{title}, log scale, UTC. {legend}</figcaption></figure>',
        id=chart_id, w=WIDTH, h=HEIGHT, title=title, left=LEFT, right=WIDTH - RIGHT,
        base=TOP + plot_h, aria=f"{title}, log scale, UTC: {summary}",
        grid=format_html_join("", '<line x1="{}" y1="{}" x2="{}" y2="{}" class="pgjobs-grid"/>',
                              ((LEFT, yy, WIDTH - RIGHT, yy) for *_, yy in y_labels)),
        lines=format_html_join(
            "", '<path d="{}" fill="none" stroke="{}" stroke-width="2" stroke-dasharray="{}" '
            'stroke-linejoin="round"><title>{}</title></path>', lines),
        dots=format_html_join("", '<circle cx="{}" cy="{}" r="3" fill="{}"/>', dots),
        y_labels=format_html_join(
            "", '<text x="{}" y="{}" text-anchor="end" class="pgjobs-label">{}</text>',
            ((x, yy, text) for x, yy, text, _ in y_labels)),
        x_labels=format_html_join(
            "", '<text x="{}" y="{}" text-anchor="middle" class="pgjobs-label">{}</text>',
            x_labels),
        legend=legend(series),
    )


__all__ = ["STYLES", "Series", "legend", "log_chart", "log_position", "log_top"]
