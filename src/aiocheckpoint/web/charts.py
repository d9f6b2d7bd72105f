"""Pictures drawn on the server as SVG: a workflow's timeline and the store's throughput.

No script draws anything (the Content-Security-Policy forbids it): these functions turn
data into shapes (:class:`Chart`) that a template writes as ``<svg>`` elements, every text
escaped like the rest of the page. Colours come from the stylesheet by class.

The timeline takes :class:`Span` lanes, so another source (a workflow's event history,
say) can add spans or marks of its own beside the checkpoints' without a change here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

__all__ = [
    "Bar",
    "Chart",
    "Span",
    "Tick",
    "stacked_bars",
    "timeline",
]

#: Width and height of a drawing, in SVG units (the stylesheet scales it to the page).
WIDTH: Final = 960
ROW: Final = 22
LEFT: Final = 150
#: The narrowest bar, so an instant still shows.
MIN_WIDTH: Final = 2.0


@dataclass(frozen=True)
class Span:
    """Something that happened from ``start`` to ``end`` in a lane: a step, a pause..."""

    lane: str
    start: datetime
    end: datetime
    #: the stylesheet class that colours it (``agent-failed``, ``paused``...)
    css: str
    #: its tooltip
    title: str
    href: str | None = None


@dataclass(frozen=True)
class Bar:
    """A rectangle of a drawing, with its tooltip and link."""

    x: float
    y: float
    width: float
    height: float
    css: str
    title: str
    href: str | None = None


@dataclass(frozen=True)
class Tick:
    """A label along an axis at ``x`` (or, for a lane label, at ``y``)."""

    x: float
    y: float
    text: str


@dataclass
class Chart:
    """What a template draws: its size, bars and labels."""

    width: float
    height: float
    bars: list[Bar] = field(default_factory=list)
    labels: list[Tick] = field(default_factory=list)
    axis: list[Tick] = field(default_factory=list)


def timeline(spans: Sequence[Span]) -> Chart | None:
    """The spans on one time axis, one row per lane in order of first appearance."""
    if not spans:
        return None
    lanes: dict[str, int] = {}
    for span in spans:
        lanes.setdefault(span.lane, len(lanes))
    first = min(s.start for s in spans)
    last = max(s.end for s in spans)
    total = max((last - first).total_seconds(), 1e-3)
    scale = (WIDTH - LEFT - 10) / total
    chart = Chart(WIDTH, ROW * len(lanes) + 44)
    for lane, row in lanes.items():
        chart.labels.append(Tick(4, row * ROW + 15, lane))
    for span in spans:
        x = LEFT + (span.start - first).total_seconds() * scale
        width = max((span.end - span.start).total_seconds() * scale, MIN_WIDTH)
        y = lanes[span.lane] * ROW + 3
        chart.bars.append(Bar(x, y, width, ROW - 6, span.css, span.title, span.href))
    chart.axis = _time_axis(first, total, scale, ROW * len(lanes) + 18)
    return chart


def _time_axis(first: datetime, total: float, scale: float, y: float) -> list[Tick]:
    """Five labels along the time axis: the offset from the start (``+1.5s``, ``+2m``)."""
    return [
        Tick(LEFT + total * n / 4 * scale, y, "+" + _duration(total * n / 4)) for n in range(5)
    ] + [Tick(LEFT, y + 14, "from " + first.isoformat(timespec="seconds"))]


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:g}m" if seconds % 60 == 0 else f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def stacked_bars(
    start: datetime, bucket: timedelta, counts: Sequence[dict[str, int]], series: Sequence[str]
) -> Chart:
    """One column per bucket (from ``start``, ``bucket`` long), its ``series`` stacked."""
    height = 200.0
    peak = max([sum(c.get(s, 0) for s in series) for c in counts] + [1])
    step = (WIDTH - LEFT) / max(len(counts), 1)
    chart = Chart(WIDTH, height + 30)
    for n, count in enumerate(counts):
        top = height
        when = start + bucket * n
        for name in series:
            value = count.get(name, 0)
            if not value:
                continue
            tall = value / peak * (height - 10)
            top -= tall
            title = f"{when.isoformat(timespec='minutes')}: {value} {name}"
            css = name.replace(" ", "-")
            chart.bars.append(Bar(LEFT + n * step, top, max(step - 1, 1), tall, css, title))
    per = _duration(bucket.total_seconds())
    chart.labels = [Tick(4, 14, f"{peak} per {per}"), Tick(4, height, "0")]
    chart.axis = [
        Tick(LEFT + n * step, height + 18, (start + bucket * n).strftime("%H:%M"))
        for n in range(0, len(counts), max(len(counts) // 6, 1))
    ]
    return chart
