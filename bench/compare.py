"""Compare this checkout with another commit, side by side in one run, as ratios.

    python bench/compare.py [--base REV] [--rounds N] [--quick | --tiny] [--only NAME ...]

Checks ``REV`` (default ``HEAD~1``) out into a temporary git worktree, then runs
``bench/run.py`` on our own systems alternately in the base and in this checkout (base,
head, base, head, ...), ``--rounds`` times each, so both see the same machine and the same
noise. Prints, for every measurement both produced, the median of each side and the ratio
head / base of its headline figure (throughput, resume time, loop lag, stored bytes), and
whether that ratio is better or worse. Each side's ``bench/run.py`` is its own: a change to
the suite itself is compared as the two commits run it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OURS = "ours-memory,ours-file,ours-sqlite,ours-postgres"

#: The headline figure of each workload, and whether higher is better.
HEADLINE: dict[str, tuple[str, bool]] = {
    "write": ("per_s", True),
    "lag": ("lag_p99_ms", False),
    "lookup": ("latest_long_ms", False),
    "growth": ("bytes", False),
    "resume": ("resume_ms", False),
}

Key = tuple[str, str, str]


def run_side(tree: Path, args: argparse.Namespace) -> dict[Key, float]:
    """One ``bench/run.py`` of ``tree``: headline figure per (workload, param, system)."""
    command = [sys.executable, "bench/run.py", f"--{args.size}", "--only", OURS]
    for name in args.only:
        command += ["--only", name]
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"bench/run.py failed in {tree}:\n{done.stderr[-2000:]}")
    figures: dict[Key, float] = {}
    for line in done.stdout.splitlines():
        record = _measurement(line)
        if record is not None and record["workload"] in HEADLINE:
            field, _ = HEADLINE[record["workload"]]
            if isinstance(record.get(field), (int, float)):
                figures[(record["workload"], record["param"], record["system"])] = record[field]
    return figures


def _measurement(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    record: dict[str, Any] = json.loads(line)
    return record if record.get("kind") == "measurement" else None


def compare(base: list[dict[Key, float]], head: list[dict[Key, float]]) -> list[str]:
    """Table rows: each key both sides measured in every round, medians and ratio."""
    keys = sorted(set.intersection(*(set(r) for r in base + head)))
    rows = [f"{'workload':8} {'param':12} {'system':14} {'base':>10} {'head':>10} ratio"]
    for key in keys:
        old = statistics.median(r[key] for r in base)
        new = statistics.median(r[key] for r in head)
        ratio = new / old if old else float("inf")
        higher_better = HEADLINE[key[0]][1]
        verdict = "better" if (ratio > 1) == higher_better else "worse"
        if abs(ratio - 1) < 0.05:
            verdict = "same"
        rows.append(
            f"{key[0]:8} {key[1]:12} {key[2]:14} {old:10.4g} {new:10.4g} {ratio:5.2f}x {verdict}"
        )
    return rows


def main() -> None:
    """Parse the arguments, run both sides alternately, print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD~1", help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side (median)")
    parser.add_argument("--only", action="append", default=[], help="passed to bench/run.py")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="size", action="store_const", const="quick")
    size.add_argument("--tiny", dest="size", action="store_const", const="tiny")
    parser.set_defaults(size="quick")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aiocheckpoint-base-") as tmp:
        tree = Path(tmp) / "base"
        git = ["git", "-C", str(ROOT)]
        subprocess.run(
            [*git, "worktree", "add", "--detach", str(tree), args.base],
            check=True,
            capture_output=True,
        )
        try:
            base: list[dict[Key, float]] = []
            head: list[dict[Key, float]] = []
            for _ in range(args.rounds):
                base.append(run_side(tree, args))
                head.append(run_side(ROOT, args))
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=False)
    print(f"base {args.base}, head {ROOT.name}, {args.rounds} rounds of --{args.size}")
    print("\n".join(compare(base, head)))


if __name__ == "__main__":
    main()
