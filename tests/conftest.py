"""Suite-wide hooks: which tests start first, and the end-of-run summaries.

The README's test command runs the suite on pytest-xdist workers (``-n 4``; ``--dist
loadgroup`` is in pyproject.toml's addopts). Most of the suite waits on fsync, child
processes and PostgreSQL, so four workers on two cores pay. Under xdist:

* tests marked ``slow`` are queued first, so the long crash loops start at once and
  the short tests fill the gaps around them instead of one long test ending the run;
* a module whose tests share an expensive module- or session-scoped fixture (the docs site
  build, the power-loss trials) marks itself ``pytest.mark.xdist_group(name)``: the group
  runs on one worker, so the fixture is built once;
* everything a test writes lives under ``tmp_path`` (a directory per worker) and every
  PostgreSQL test gets a schema or database of its own (tests/pg_support.py), so workers
  never share state.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import _summary


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Queue the slow tests first (a stable sort: the same order on every worker)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """Keep what a finished pytest-xdist worker published for the end-of-run summary."""
    _summary.collect_worker(getattr(node, "workeroutput", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the crash and power-loss suites published (see tests/_summary.py)."""
    _summary.write(terminalreporter)
