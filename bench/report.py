"""Ratios within one run, and the markdown tables."""

from __future__ import annotations

from typing import Any

__all__ = ["COLUMNS", "markdown", "ratios"]

#: Per workload, the figures shown (metric, label, True when higher is better).
COLUMNS: dict[str, list[tuple[str, str, bool]]] = {
    "write": [("per_s", "ckpt/s", True), ("p50_ms", "p50 ms", False), ("p99_ms", "p99 ms", False)],
    "lag": [
        ("lag_p99_ms", "lag p99 ms", False),
        ("lag_max_ms", "lag max ms", False),
        ("per_s", "ckpt/s", True),
    ],
    "lookup": [
        ("latest_short_ms", "latest@10 ms", False),
        ("latest_long_ms", "latest@long ms", False),
        ("long_over_short", "long/short", False),
        ("page10_long_ms", "page10@long ms", False),
    ],
    "growth": [
        ("bytes", "MB stored", False),
        ("x_final_state", "x final state", False),
        ("ms_at_10", "ms/step @10", False),
        ("ms_at_100", "ms/step @100", False),
        ("ms_at_1000", "ms/step @1000", False),
        ("cpu_ms_at_10", "CPU ms/step @10", False),
        ("cpu_ms_at_1000", "CPU ms/step @1000", False),
    ],
    "resume": [("resume_ms", "resume ms", False)],
}
#: The figures each of our backends is compared on, against every other system.
RATIO_METRICS = {
    "write": ["per_s", "p99_ms"],
    "lag": ["lag_p99_ms", "lag_max_ms"],
    "lookup": ["latest_long_ms", "long_over_short", "page10_long_ms"],
    "growth": ["bytes", "cpu_ms_at_1000"],
    "resume": ["resume_ms"],
}
_HIGHER_IS_BETTER = {"per_s"}


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of our systems against every other, per workload, parameter and metric.

    ``advantage`` > 1 means ours is better by that factor (more per second, or less time,
    lag or space).
    """
    out = []
    for ours in (r for r in results if r["group"] == "ours"):
        for other in results:
            if other["system"] == ours["system"] or other["group"] in ("ours", "reference"):
                continue
            if (other["workload"], other["param"]) != (ours["workload"], ours["param"]):
                continue
            for metric in RATIO_METRICS[ours["workload"]]:
                mine, theirs = ours.get(metric), other.get(metric)
                if not mine or not theirs:
                    continue
                advantage = mine / theirs if metric in _HIGHER_IS_BETTER else theirs / mine
                out.append({
                    "kind": "ratio", "workload": ours["workload"], "param": ours["param"],
                    "metric": metric, "ours": ours["system"], "vs": other["system"],
                    "vs_group": other["group"], "ours_value": mine, "vs_value": theirs,
                    "advantage": round(advantage, 3),
                })  # fmt: skip
    return out


def _fmt(metric: str, value: Any) -> str:
    if value is None:
        return ""
    if metric == "bytes":
        return f"{value / 1e6:,.1f}"
    if metric == "per_s":
        return f"{value:,.0f}"
    if isinstance(value, float):
        return f"{value:.3g}" if value < 100 else f"{value:,.0f}"
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _workload_table(workload: str, results: list[dict[str, Any]]) -> list[str]:
    mine = [r for r in results if r["workload"] == workload]
    params = list(dict.fromkeys(r["param"] for r in mine))
    systems = list(dict.fromkeys(r["system"] for r in mine))
    columns = [(p, m, label) for p in params for m, label, _ in COLUMNS[workload]
               if any(m in r for r in mine if r["param"] == p)]  # fmt: skip
    by_key = {(r["system"], r["param"]): r for r in mine}
    header = ["system"] + [f"{p} {label}" if len(params) > 1 else label for p, _, label in columns]
    rows = []
    for system in systems:
        cells = [_fmt(m, by_key.get((system, p), {}).get(m)) for p, m, _ in columns]
        rows.append([system, *cells])
    title = f"### {workload}" + (f" ({params[0]})" if len(params) == 1 else "")
    return [title, "", *_table(header, rows), ""]


def _ratio_table(ours: str, ratio_rows: list[dict[str, Any]]) -> list[str]:
    mine = [r for r in ratio_rows if r["ours"] == ours]
    others = list(dict.fromkeys(r["vs"] for r in mine))
    keys = list(dict.fromkeys((r["workload"], r["param"], r["metric"]) for r in mine))
    cell = {(r["workload"], r["param"], r["metric"], r["vs"]): r["advantage"] for r in mine}
    rows = []
    for workload, param, metric in keys:
        values = [cell.get((workload, param, metric, o)) for o in others]
        rows.append([f"{workload} {param} {metric}",
                     *("" if v is None else _fmt("x", v) + "x" for v in values)])  # fmt: skip
    return [f"### {ours} vs each system (>1x: {ours} is better)", "",
            *_table(["figure", *others], rows), ""]  # fmt: skip


def markdown(
    header: dict[str, Any],
    results: list[dict[str, Any]],
    ratio_rows: list[dict[str, Any]],
    unavailable: dict[str, str],
    notes: dict[str, str],
) -> str:
    """The whole report: run details, one table per workload, one ratio table per backend."""
    pg = header.get("postgres") or {}
    pg_text = ", ".join(f"{k}={v}" for k, v in pg.items()) if pg else "not reachable"
    lines = [
        f"Run {header['date']} ({header['mode']}): `{header['command']}`",
        "",
        f"Machine: {header['nproc']} x {header['cpu']} (load average at start "
        f"{header.get('loadavg', ['?'])[0]}); Python {header['python']}; "
        f"SQLite {header['sqlite']}; PostgreSQL: {pg_text}.",
        "",
    ]
    for workload in COLUMNS:
        if any(r["workload"] == workload for r in results):
            lines += _workload_table(workload, results)
    for ours in dict.fromkeys(r["ours"] for r in ratio_rows):
        lines += _ratio_table(ours, ratio_rows)
    present = dict.fromkeys(r["system"] for r in results)
    described = [f"- `{name}`: {notes[name]}" for name in present if name in notes]
    if described:
        lines += ["Systems:", "", *described, ""]
    if unavailable:
        lines += ["Not available in this run:", ""]
        lines += [f"- `{name}`: {reason}" for name, reason in unavailable.items()]
        lines.append("")
    return "\n".join(lines)
