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


#: The most members of the record pipeline's ``RecordCodec`` the manager may use: it hands
#: the pipeline one call per method (a save, a decode, a fork), not the pipeline's steps.
MANAGER_CODEC_MEMBERS = 6
#: The most lines manager.py may hold: the constructor, checkpoint reads and writes, resume
#: and fork (the other families of calls live with what they delegate to).
MANAGER_LINES = 700


def _codec_members(source: str) -> set[str]:
    """The attributes ``source`` reads on ``self._codec``, directly or through a local name."""
    tree = ast.parse(source)

    def is_codec(node: ast.expr) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "_codec"
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        )

    aliases = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and is_codec(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and (
            is_codec(node.value) or (isinstance(node.value, ast.Name) and node.value.id in aliases)
        )
    }


def test_the_codec_count_sees_direct_and_aliased_uses() -> None:
    """Members read on ``self._codec`` and on a local alias of it count; others do not."""
    source = (
        "def f(self):\n"
        "    codec = self._codec\n"
        "    codec.save(1)\n"
        "    self._codec.decode(2)\n"
        "    self._storage.load(3)\n"
        "    other.fork(4)\n"
    )
    assert _codec_members(source) == {"save", "decode"}


def test_the_manager_uses_few_members_of_the_codec() -> None:
    """manager.py hands the record pipeline whole calls: at most a few of its members."""
    used = _codec_members((SRC / "manager.py").read_text(encoding="utf-8"))
    assert len(used) <= MANAGER_CODEC_MEMBERS, sorted(used)


def test_the_manager_module_stays_small() -> None:
    """manager.py keeps the checkpoint API; other families live in their own modules."""
    lines = (SRC / "manager.py").read_text(encoding="utf-8").count("\n")
    assert lines <= MANAGER_LINES, f"manager.py has {lines} lines"
