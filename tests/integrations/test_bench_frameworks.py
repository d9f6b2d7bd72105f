"""``bench/frameworks.py --tiny`` runs end to end: every row for every system (no timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SESSION_ROWS = {"session-add", "session-get", "session-add-c50"}
AF_ROWS = {"af-save", "af-load", "af-load-cold", "af-latest"}
PA_ROWS = {"pa-run", "pa-run-cpu"}
#: The pydantic-ai rows' references: no durability, and pydantic-ai's DBOS engine.
PA_REFERENCES = {"pydantic-ai", "dbos-sqlite", "dbos-postgres"}
ROWS = SESSION_ROWS | AF_ROWS


@pytest.mark.slow  # ~40 s: two of its systems are DBOS child processes
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
        | {(s, r) for s in {*ours, *PA_REFERENCES} for r in PA_ROWS}
    )
    summaries = {
        (line["summary"], line["backend"], line["reference"]) for line in lines if "summary" in line
    }
    assert summaries == (
        {(r, b, "framework") for r in ROWS for b in ours}
        | {(r, b, "framework-memory") for r in AF_ROWS for b in ours}
        | {(r, b, ref) for r in PA_ROWS for b in ours for ref in PA_REFERENCES}
    )
    assert all(line["ours_us"] > 0 < line["framework_us"] for line in lines if "summary" in line)
    # A run records its prompt, three model requests and three tool calls; DBOS makes only
    # the model requests steps.
    units = {(line["reference"], line["units"]) for line in lines if "units" in line}
    assert units == {("pydantic-ai", 7), ("dbos-sqlite", 3), ("dbos-postgres", 3)}
