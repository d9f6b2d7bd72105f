"""Suite-wide hooks: the test tiers, which tests start first, and the end-of-run summaries.

The suite has four tiers (README.md, "Run the tests"), told apart by markers:

* the fast tier, unmarked: runs anywhere, as any user, from a fresh clone; a plain
  ``pytest`` runs it, and nothing else;
* ``slow``: long but self-contained (crash and kill loops, decoding bombs, the docs site
  build, the bench scripts): ``pytest -m slow``;
* ``root``: needs root (tmpfs and loop mounts, files of another uid) and, for the power-loss
  suite, /dev/fuse and LazyFS: ``sudo .venv/bin/python -m pytest -m root``;
* ``browser``: drives the system's Chromium (/usr/bin/chromium, which ``.ci/run`` installs)
  with Playwright (the web inspector): ``pytest -m browser``.

Which tier a new test belongs to: ``root`` if it needs anything a fresh clone run by any
user lacks (root, a mount, another uid, /dev/fuse, LazyFS or anything else from beside the
repository); ``browser`` if it drives Chromium; otherwise ``slow`` if one run of it takes
more than about five seconds on a quiet machine (kill and crash loops, decoding bombs,
builds), as the fast tier must finish in under five minutes on two cores; otherwise no
marker. Never a skip instead. A property whose random examples are costly checks a few of
them in the fast tier and all of them in the slow tier (tests/tiered.py).

A test carries at most one of these markers. An explicit ``-m`` picks tests by pytest's
own rules; without one, a test file named on the command line runs in full (whatever its
tiers), and anything else runs its fast tier only, with a line at the end saying how many
tests of the other tiers were left out and how to run them. ``.ci/run`` runs every tier.

The README's test command runs the suite on four pytest-xdist workers (``-n 4``). Most of
the suite waits on fsync, child processes and PostgreSQL, so four workers on two cores pay.
Under xdist:

* tests marked ``slow`` or ``root`` are queued first, so the long crash loops start at once and
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
``.pytest_cache/pycache`` instead (``PYTHONPYCACHEPREFIX``), never beside the sources, and
the installed packages' bytecode is linked there first (tests/_pycache.py). The
CLI tests' commands and the crash tests' writers do not start Python at all: each is forked
from a warmed-up interpreter, one per test process (tests/_zygote.py, tests/cli_runner.py);
``AIOCHECKPOINT_TEST_CLI_SUBPROCESS=1`` starts every CLI command as a fresh process instead.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest

from tests import _pycache, _summary


def pytest_configure(config: pytest.Config) -> None:
    """Let child processes cache bytecode, out of the source tree (see the module's doc)."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        prefix = config.rootpath / ".pytest_cache" / "pycache"
        prefix.mkdir(parents=True, exist_ok=True)
        _pycache.seed(prefix)
        os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
        del os.environ["PYTHONDONTWRITEBYTECODE"]


#: The markers of the tiers beyond the fast one, and the command that runs each.
TIERS = {
    "slow": ".venv/bin/python -m pytest -q -n 4 -m slow",
    "root": "sudo .venv/bin/python -m pytest -q -n 4 -m root",
    "browser": ".venv/bin/python -m pytest -q -m browser",
}


#: Fixtures that need root (a mount, FUSE): a test using one must be in the root tier.
ROOT_FIXTURES = frozenset({"lazyfs_binary", "mounts", "small_disk", "tiny_disk"})


def tier(item: pytest.Item) -> str:
    """The tier of a test: ``slow``, ``root``, ``browser`` or ``fast`` (unmarked)."""
    marked = [name for name in TIERS if item.get_closest_marker(name) is not None]
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(marked)}: pick one tier")
    needs_root = ROOT_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    if needs_root and marked != ["root"]:
        raise pytest.UsageError(f"{item.nodeid} uses {min(needs_root)}: mark it root")
    return marked[0] if marked else "fast"


def _named_files(config: pytest.Config) -> set[Path]:
    """The test files named on the command line (``tests/test_x.py``, ``...::test_y``)."""
    base = config.invocation_params.dir
    named = (base / arg.split("::", 1)[0] for arg in config.args)
    return {path.resolve() for path in named if path.is_file()}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the fast tier unless ``-m`` or a named file says otherwise (see the module's doc);
    queue the slow and root tests first (a stable sort: the same order on every worker)."""
    tiers = {item.nodeid: tier(item) for item in items}
    if not config.option.markexpr:
        named = _named_files(config)
        left = [i for i in items if tiers[i.nodeid] != "fast" and i.path.resolve() not in named]
        if left:
            gone = {id(item) for item in left}
            items[:] = [item for item in items if id(item) not in gone]
            config.hook.pytest_deselected(items=left)
            _publish_left_out(config, [tiers[item.nodeid] for item in left])
    items.sort(key=lambda item: tiers[item.nodeid] == "fast")


def _publish_left_out(config: pytest.Config, left: list[str]) -> None:
    """Say at the end of the run which tiers were not run, and their commands (once: every
    pytest-xdist worker collects the same tests)."""
    worker = getattr(config, "workerinput", {}).get("workerid", "gw0")
    if worker != "gw0":
        return
    lines = [
        f"not run here (the fast tier only): {left.count(name)} {name} tests: {command}"
        for name, command in TIERS.items()
        if name in left
    ]
    _summary.publish(config, lines)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A root-tier test run without root fails at once, saying so (it is never skipped)."""
    if item.get_closest_marker("root") is not None and os.geteuid() != 0:
        pytest.fail(f"{item.nodeid} needs root (the root tier: {TIERS['root']})", pytrace=False)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """Keep what a finished pytest-xdist worker published for the end-of-run summary."""
    _summary.collect_worker(getattr(node, "workeroutput", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the suites published (tests/_summary.py): the tiers left out, the kills..."""
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
