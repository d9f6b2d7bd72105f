"""bench/charts.py draws a run's JSON lines as SVG charts, one command for all of them."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.dom.minidom
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _measurement(workload: str, param: str, system: str, **figures: float) -> str:
    record = {"kind": "measurement", "workload": workload, "param": param, "system": system}
    return json.dumps({**record, "group": "ours", **figures})


def test_charts_are_drawn_from_a_runs_json_lines(tmp_path: Path) -> None:
    lines = [json.dumps({"kind": "env", "date": "today"})]
    for system, rate in (("ours-sqlite", 1000.0), ("lg-sqlite", 100.0)):
        for c in (1, 10, 100):
            lines.append(_measurement("write", f"C={c}", system, per_s=rate * c))
        lines.append(_measurement("lag", "20x1MB", system, lag_p99_ms=rate / 100))
        lines.append(_measurement("resume", "10MB", system, resume_ms=rate / 10))
    run = tmp_path / "run.jsonl"
    run.write_text("\n".join([*lines, "| a markdown table line |"]))
    out = tmp_path / "charts"
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "charts.py"), str(run), str(out)],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    assert sorted(p.name for p in out.iterdir()) == ["lag.svg", "resume.svg", "throughput.svg"]
    for svg in out.iterdir():
        text = svg.read_text()
        xml.dom.minidom.parseString(text)  # well-formed
        assert "ours-sqlite" in text and "lg-sqlite" in text
    assert (out / "throughput.svg").read_text().count("<polyline") == 2
