"""bench/powerloss.py runs its peers' trials end to end and tells a durable store from one that
is not (a smoke test at two cuts per row; the figures come from longer runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .lazyfs import REPO

pytestmark = pytest.mark.root  # LazyFS: root and /dev/fuse


def test_the_peer_rows_run_and_tell_durable_from_not(lazyfs_binary: Path) -> None:
    """LangGraph's AsyncSqliteSaver keeps what it acknowledged; the seed's store does not."""
    proc = subprocess.run(
        [sys.executable, "bench/powerloss.py", "--cuts", "2", "--only", "lg-sqlite,seed-file"],
        cwd=REPO,
        env={**os.environ, "AIOCHECKPOINT_LAZYFS": str(lazyfs_binary)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["system"]: r for r in map(json.loads, proc.stdout.splitlines()[:4])}
    assert sorted(rows) == [
        "lg-sqlite, 1 writer",
        "lg-sqlite, 50 writers",
        "seed-file, 1 writer",
        "seed-file, 50 writers",
    ]
    assert all(r["cuts"] == 2 and r["acknowledged"] > 0 for r in rows.values())
    assert rows["lg-sqlite, 1 writer"]["lost"] == rows["lg-sqlite, 50 writers"]["lost"] == 0
    assert rows["seed-file, 1 writer"]["lost"] > 0 and rows["seed-file, 50 writers"]["lost"] > 0
    assert "| seed-file, 50 writers | 2 " in proc.stdout
