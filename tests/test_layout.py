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
    "storage/sqlite/writer.py": {"_DELETE_STEP", "_DELETE_WORKFLOW", "_PRUNE"},
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
#: the pipeline one call per method (a save, an owned save, a decode, a fork), not the
#: pipeline's steps.
MANAGER_CODEC_MEMBERS = 7
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(name: str, is_package: bool, source: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports anywhere in ``source``.

    Every import counts: at the top, in a function, under ``if TYPE_CHECKING:``.
    ``from package import module`` imports the module; ``from module import name``, the module.
    """
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                child = f"{module}.{alias.name}"
                found.add(child if child in known else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return (found & known) - {name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another, round a circle (Tarjan's SCCs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = [stack.pop()]
            while group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_cycle_check_finds_a_type_only_circle() -> None:
    """A circle closed by an import under TYPE_CHECKING is found; a chain is not a circle."""
    known = {"p", "p.a", "p.b", "p.c"}
    sources = {
        "p.a": "from .b import X\n",
        "p.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import Y\n",
        "p.c": "from . import a\n",
    }
    graph = {name: _imported(name, False, text, known) for name, text in sources.items()}
    assert graph == {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]
    graph["p.c"] = set()
    assert _cycles(graph) == []


def test_no_import_cycle_in_the_package() -> None:
    """No module of aiocheckpoint imports itself round a circle, not even for types only."""
    paths = {_module_name(path): path for path in SRC.rglob("*.py")}
    known = set(paths)
    graph = {
        name: _imported(name, path.name == "__init__.py", path.read_text(encoding="utf-8"), known)
        for name, path in paths.items()
    }
    assert _cycles(graph) == []
