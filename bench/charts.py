"""Draw a run's main comparisons as SVG charts, from the JSON lines ``bench/run.py`` prints.

    python bench/run.py > run.jsonl && python bench/charts.py run.jsonl docs/charts

Writes ``throughput.svg`` (checkpoints per second against concurrency, one line per
system), ``lag.svg`` (event-loop lag p99 per system and scenario) and ``resume.svg``
(resume time of the large state per system). Plain SVG, no plotting library: the figures
are the run's medians, as in its tables.
"""

from __future__ import annotations

import argparse
import json
import math
from html import escape
from pathlib import Path
from typing import Any

__all__ = ["bar_chart", "charts", "line_chart"]

_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 640, 360, 70, 170, 40, 50
_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#17becf", "#bcbd22", "#393b79", "#637939", "#843c39"]  # fmt: skip


def _svg(title: str, body: list[str]) -> str:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'font-family="sans-serif" font-size="11">'
    )
    heading = (
        f'<text x="{_W / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>'
    )
    return "\n".join([head, '<rect width="100%" height="100%" fill="white"/>', heading, *body,
                      "</svg>", ""])  # fmt: skip


def _log_axis(values: list[float]) -> tuple[float, float]:
    positive = [v for v in values if v > 0] or [1.0]
    return math.floor(math.log10(min(positive))), math.ceil(math.log10(max(positive)) + 1e-9)


def _y_grid(low: float, high: float, label: str) -> tuple[list[str], Any]:
    """Horizontal grid lines at each power of ten, and the function placing a value."""
    span = max(high - low, 1.0)
    plot_h = _H - _TOP - _BOTTOM

    def y(value: float) -> float:
        return _H - _BOTTOM - (math.log10(max(value, 10**low)) - low) / span * plot_h

    out = []
    for power in range(int(low), int(high) + 1):
        at = y(10.0**power)
        out.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{at:.1f}" y2="{at:.1f}" '
                   'stroke="#ddd"/>')  # fmt: skip
        out.append(f'<text x="{_LEFT - 6}" y="{at + 4:.1f}" '
                   f'text-anchor="end">{10.0**power:g}</text>')  # fmt: skip
    out.append(f'<text x="14" y="{_H / 2}" transform="rotate(-90 14 {_H / 2})" '
               f'text-anchor="middle">{escape(label)} (log scale)</text>')  # fmt: skip
    return out, y


def line_chart(title: str, xs: list[str], series: dict[str, list[float | None]], label: str) -> str:
    """One line per series over the categories ``xs``, log-scaled values."""
    values = [v for vs in series.values() for v in vs if v]
    low, high = _log_axis(values)
    body, y = _y_grid(low, high, label)
    step = (_W - _LEFT - _RIGHT) / max(len(xs) - 1, 1)
    for i, x in enumerate(xs):
        body.append(f'<text x="{_LEFT + i * step:.1f}" y="{_H - _BOTTOM + 16}" '
                    f'text-anchor="middle">{escape(x)}</text>')  # fmt: skip
    for n, (name, vs) in enumerate(series.items()):
        colour = _COLOURS[n % len(_COLOURS)]
        points = [f"{_LEFT + i * step:.1f},{y(v):.1f}" for i, v in enumerate(vs) if v]
        body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                    f'points="{" ".join(points)}"/>')  # fmt: skip
        body += [f'<circle cx="{p.split(",")[0]}" cy="{p.split(",")[1]}" r="3" fill="{colour}"/>'
                 for p in points]  # fmt: skip
        body.append(_legend(n, name, colour))
    return _svg(title, body)


def bar_chart(title: str, bars: dict[str, float], label: str) -> str:
    """One bar per name, log-scaled values printed above the bars."""
    low, high = _log_axis(list(bars.values()))
    body, y = _y_grid(low, high, label)
    width = (_W - _LEFT - _RIGHT) / max(len(bars), 1)
    for n, (name, value) in enumerate(bars.items()):
        colour = _COLOURS[n % len(_COLOURS)]
        x, top = _LEFT + n * width + width * 0.15, y(value)
        body.append(f'<rect x="{x:.1f}" y="{top:.1f}" width="{width * 0.7:.1f}" '
                    f'height="{_H - _BOTTOM - top:.1f}" fill="{colour}"/>')  # fmt: skip
        body.append(f'<text x="{x + width * 0.35:.1f}" y="{top - 4:.1f}" '
                    f'text-anchor="middle">{value:.3g}</text>')  # fmt: skip
        body.append(_legend(n, name, colour))
    return _svg(title, body)


def _legend(n: int, name: str, colour: str) -> str:
    y = _TOP + 14 * n
    return (f'<rect x="{_W - _RIGHT + 12}" y="{y}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{_W - _RIGHT + 26}" y="{y + 9}">{escape(name)}</text>')  # fmt: skip


def charts(records: list[dict[str, Any]]) -> dict[str, str]:
    """The SVG files (name: text) a run's measurements make; a chart needs its workload."""
    results = [r for r in records if r.get("kind") == "measurement"]
    out: dict[str, str] = {}
    writes = [r for r in results if r["workload"] == "write"]
    if writes:
        xs = list(dict.fromkeys(r["param"] for r in writes))
        by = {(r["system"], r["param"]): r["per_s"] for r in writes}
        systems = list(dict.fromkeys(r["system"] for r in writes))
        series = {s: [by.get((s, x)) for x in xs] for s in systems}
        out["throughput.svg"] = line_chart(
            "Durable writes of the ~1 KB state", xs, series, "checkpoints/s"
        )
    lags = [r for r in results if r["workload"] == "lag" and r["system"] != "(idle loop)"]
    if lags:
        bars = {f"{r['system']} {r['param']}": r["lag_p99_ms"] for r in lags}
        out["lag.svg"] = bar_chart("Event-loop lag p99 while writing", bars, "ms")
    resumes = [r for r in results if r["workload"] == "resume"]
    if resumes:
        bars = {r["system"]: r["resume_ms"] for r in resumes}
        out["resume.svg"] = bar_chart(f"Resume of the {resumes[0]['param']} state", bars, "ms")
    return out


def main(argv: list[str] | None = None) -> int:
    """Read a run's JSON lines, write its charts into a directory."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the JSON lines bench/run.py printed")
    parser.add_argument("out", type=Path, help="the directory for the SVG files")
    args = parser.parse_args(argv)
    lines = args.run.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in charts(records).items():
        (args.out / name).write_text(text)
        print(args.out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
