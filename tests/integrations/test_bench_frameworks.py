"""``bench/frameworks.py --tiny`` runs end to end: every row for every system (no timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SESSION_ROWS = {"session-add", "session-get", "session-add-c50"}
AF_ROWS = {"af-save", "af-load", "af-load-cold", "af-latest"}
ROWS = SESSION_ROWS | AF_ROWS


def test_the_frameworks_bench_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "frameworks.py"), "--tiny"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    ours = {"memory", "sqlite", "file", "postgres"}
    measured = {(line["system"], line["row"]) for line in lines if "row" in line}
    assert measured == (
        {(s, r) for s in {*ours, "framework"} for r in ROWS}
        | {("framework-memory", r) for r in AF_ROWS}
    )
    summaries = {
        (line["summary"], line["backend"], line["reference"]) for line in lines if "summary" in line
    }
    assert summaries == (
        {(r, b, "framework") for r in ROWS for b in ours}
        | {(r, b, "framework-memory") for r in AF_ROWS for b in ours}
    )
    assert all(line["ours_us"] > 0 < line["framework_us"] for line in lines if "summary" in line)
