"""End-of-run summary lines (kills dealt, power cuts, ...) that survive pytest-xdist.

A suite publishes its lines and counts when the session finishes. Run in one process they
are printed at the end of the run; in a pytest-xdist worker they travel to the controller
with the worker's output (tests/conftest.py collects them), where each count is summed over
the workers and printed once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

_LINES = "aiocheckpoint_summary_lines"
_COUNTS = "aiocheckpoint_summary_counts"

#: What this process will print: lines in order, and counts per title.
LINES: list[str] = []
COUNTS: dict[str, Counter[str]] = {}


def publish(
    config: pytest.Config,
    lines: Iterable[str] = (),
    counts: Mapping[str, Mapping[str, int]] | None = None,
) -> None:
    """Print ``lines`` and ``counts`` (``{title: {what: n}}``) at the end of the run."""
    output: dict[str, Any] | None = getattr(config, "workeroutput", None)
    if output is None:
        collect(lines, counts or {})
        return
    output.setdefault(_LINES, []).extend(lines)
    sent = output.setdefault(_COUNTS, {})
    sent.update({title: dict(counter) for title, counter in (counts or {}).items() if counter})


def collect(lines: Iterable[str], counts: Mapping[str, Mapping[str, int]]) -> None:
    """Add lines and counts (this process's, or a worker's) to what is printed."""
    LINES.extend(lines)
    for title, counter in counts.items():
        if counter:
            COUNTS.setdefault(title, Counter()).update(counter)


def collect_worker(workeroutput: Mapping[str, Any]) -> None:
    """Add what a finished pytest-xdist worker published."""
    collect(workeroutput.get(_LINES, []), workeroutput.get(_COUNTS, {}))


def write(terminalreporter: Any) -> None:
    """Print everything published, counts as ``title: what: n, ...``."""
    for line in LINES:
        terminalreporter.write_line(line)
    for title, counter in COUNTS.items():
        shown = ", ".join(f"{what}: {n}" for what, n in sorted(counter.items()))
        terminalreporter.write_line(f"{title}: {shown}")
