"""Suite-wide hooks: which tests start first, and the end-of-run summaries.

The README's test command runs the suite on four pytest-xdist workers (``-n 4``). Most of
the suite waits on fsync, child processes and PostgreSQL, so four workers on two cores pay.
Under xdist:

* tests marked ``slow`` are queued first, so the long crash loops start at once and
  the short tests fill the gaps around them instead of one long test ending the run;
* a module whose tests share an expensive module- or session-scoped fixture (the docs site
  build, the power-loss trials) marks itself ``pytestmark = pytest.mark.xdist_group(name)``
  and all its tests run on one worker, so the fixture is built once (the scheduler below
  does that: xdist's own ``--dist loadgroup`` does not group anything under pytest 9.2);
* everything a test writes lives under ``tmp_path`` (a directory per worker) and every
  PostgreSQL test gets a schema or database of its own (tests/pg_support.py), so workers
  never share state.

Hundreds of tests start Python processes (the CLI, crash and power-loss writers, docs
examples). Under ``PYTHONDONTWRITEBYTECODE=1`` each of them would compile the whole package
from source again, most of the CLI's start-up time; the children write their bytecode under
``.pytest_cache/pycache`` instead (``PYTHONPYCACHEPREFIX``), never beside the sources.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest

from tests import _summary


def pytest_configure(config: pytest.Config) -> None:
    """Let child processes cache bytecode, out of the source tree (see the module's doc)."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        prefix = config.rootpath / ".pytest_cache" / "pycache"
        prefix.mkdir(parents=True, exist_ok=True)
        os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
        del os.environ["PYTHONDONTWRITEBYTECODE"]


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


@functools.cache
def _grouped(module: Path) -> bool:
    """Whether the test module marks itself ``xdist_group`` (all its tests on one worker)."""
    return module.is_file() and "pytest.mark.xdist_group(" in module.read_text(encoding="utf-8")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n N``: each test is a unit of work, except a grouped module's tests, one unit."""
    if config.getvalue("dist") != "load":
        return None  # an explicit --dist keeps xdist's own scheduling
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if _grouped(config.rootpath / module) else nodeid

    return ModuleGroups(config, log)
