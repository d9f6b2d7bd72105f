"""The package's layout: what one module may take from another.

ruff's ``PLC2701`` (on for ``src/`` in pyproject.toml) refuses a private name imported from
another package; it lets one module of aiocheckpoint import another's private names. This
test refuses that too: a name another module needs is public in the module that defines it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "aiocheckpoint"

#: Private names still imported across modules, by importing module: work left, which this
#: list only shrinks.
KNOWN = {
    "storage/sqlite/blobs.py": {"_PRUNE"},
    "storage/sqlite/readers.py": {
        "_ALL_ROWS",
        "_EXISTS_ANY",
        "_EXISTS_STEP",
        "_LATEST",
        "_ONE",
        "_SCAN",
        "_WORKFLOWS",
    },
    "storage/sqlite/sweeps.py": {"_DELETE_STEP"},
    "storage/sqlite/writer.py": {"_DELETE_STEP", "_DELETE_WORKFLOW", "_PRUNE", "_UPSERT"},
}


def _private_imports(source: str) -> set[str]:
    """The private names ``source`` imports from other modules."""
    return {
        alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    }


def test_the_check_finds_a_private_import() -> None:
    """The check sees relative and absolute imports of private names, and only those."""
    source = "from .split import _Splitter, Node\nfrom aiocheckpoint.x import _y as y\n"
    assert _private_imports(source) == {"_Splitter", "_y"}
    assert _private_imports("from __future__ import annotations\nimport _thread\n") == set()


@pytest.mark.parametrize(
    "path", sorted(SRC.rglob("*.py")), ids=lambda path: str(path.relative_to(SRC))
)
def test_no_private_name_is_imported_across_modules(path: Path) -> None:
    """No module imports another's private name, beyond the known leftovers."""
    name = path.relative_to(SRC).as_posix()
    assert _private_imports(path.read_text(encoding="utf-8")) <= KNOWN.get(name, set())
