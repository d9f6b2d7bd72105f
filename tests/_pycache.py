"""The test processes' bytecode cache when ``PYTHONDONTWRITEBYTECODE`` is set (tests/conftest.py).

Under a ``PYTHONPYCACHEPREFIX`` Python reads bytecode from the prefix only, so the first run
of a fresh clone would compile every installed package again in each of the four workers
(~20 s of a cold run on two cores) although pip and Python compiled them at install time.
:func:`seed` links that bytecode into the prefix once, before the workers start: a link, not
a copy, and Python replaces a stale file instead of writing into it.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

__all__ = ["seed"]


def _installed_dirs() -> set[Path]:
    """The standard library's and the environment's package directories, none inside another."""
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    paths = sysconfig.get_paths()
    tops = {Path(paths[name]) for name in names if name in paths}
    return {top for top in tops if not any(top.is_relative_to(o) and top != o for o in tops)}


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except FileExistsError:
        pass
    except OSError:  # another file system: a copy is as good
        shutil.copy2(source, target)


def seed(prefix: Path) -> None:
    """Link the installed packages' compiled bytecode into ``prefix``, once per prefix."""
    tag = sys.implementation.cache_tag
    marker = prefix / f".seeded-{tag}"
    if tag is None or marker.exists():
        return
    for top in _installed_dirs():
        for cache in top.rglob("__pycache__"):
            compiled = list(cache.glob(f"*.{tag}.pyc"))
            if not compiled:
                continue
            # Where Python looks under a prefix: the prefix, then the source's absolute directory.
            target = prefix / cache.parent.relative_to(cache.parent.anchor)
            target.mkdir(parents=True, exist_ok=True)
            for pyc in compiled:
                _link(pyc, target / pyc.name)
    marker.touch()
