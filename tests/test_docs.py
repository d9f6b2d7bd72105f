"""Every ```python block of docs/*.md and README.md runs, as is, in a fresh interpreter.

A block fenced ```python (or ```py, with or without attributes such as ``title="x.py"``) is
executed as a script in its own subprocess, with an empty temporary directory as the working
directory, and must exit with status 0 without printing a traceback or an "was never awaited"
warning. A block that leaves files behind must run again over them (a reader re-runs an
example). A block that uses PostgreSQL reads ``AIOCHECKPOINT_PG_DSN``, gets a database of its
own, and must leave no schema in it. Blocks that must not run (an error transcript, a shell
command, a pytest module) use another fence: ```pycon, ```text, ```bash, ```toml.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import subprocess
import sys
import unicodedata
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from aiocheckpoint.storage.postgres.schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from tests import cli_runner

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]
RUNNABLE = {"python", "py"}
TIMEOUT_SECONDS = 120
PG_DSN_VARIABLE = "AIOCHECKPOINT_PG_DSN"
PG_DSN = os.environ.get(PG_DSN_VARIABLE, "postgresql://postgres@127.0.0.1:5432/test")

_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language and its code."""

    page: Path
    line: int
    number: int
    language: str
    code: str

    @property
    def where(self) -> str:
        """``docs/page.md:LINE (block N)``, for test ids and failure messages."""
        return f"{self.page.relative_to(ROOT)}:{self.line} (block {self.number})"


def extract_blocks(page: Path) -> list[Block]:
    """Return the fenced code blocks of a markdown page, in order (indented fences included)."""
    blocks: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = _OPEN.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        words = opening["info"].strip().lstrip("{.").split()
        language = words[0].lower() if words else ""
        body: list[str] = []
        j = i + 1
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        while j < len(lines) and not closing.match(lines[j]):
            line = lines[j]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            j += 1
        blocks.append(Block(page, i + 1, len(blocks) + 1, language, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def _runnable() -> list[Block]:
    return [
        b for page in PAGES if page.exists() for b in extract_blocks(page) if b.language in RUNNABLE
    ]


RUNNABLE_BLOCKS = _runnable()
#: The examples run as ``python example.py``, forked from an interpreter that imported what
#: they import (tests/cli_runner.py): starting Python and importing aiocheckpoint was most
#: of a short example's time.
SCRIPTS = cli_runner.Forks(
    Path(__file__).with_name("_run_script.py"),
    [*cli_runner.PRELOAD, "aiocheckpoint", "pydantic"],
    [sys.executable],
)
#: The frameworks' pages: each example imports its framework's SDK and runs its agent loop
#: (5-12 s a run, twice), over the fast tier's share (tests/conftest.py): the slow tier.
FRAMEWORK_PAGES = frozenset(
    {"agent-framework.md", "langgraph.md", "openai-agents.md", "pydantic-ai.md"}
)


def _tiered(block: Block) -> object:
    if block.page.name in FRAMEWORK_PAGES:
        return pytest.param(block, marks=pytest.mark.slow, id=block.where)
    return pytest.param(block, id=block.where)


def test_the_guide_has_runnable_examples() -> None:
    """The docs pages exist and carry runnable examples (the parametrized test is not vacuous)."""
    for name in ("index", "checkpoints", "state", "resuming", "serialization", "storage"):
        page = DOCS / f"{name}.md"
        assert page.exists(), page
        assert any(b.language in RUNNABLE for b in extract_blocks(page)), f"{page} has no example"


def test_extractor_handles_indented_and_long_fences(tmp_path: Path) -> None:
    """The extractor finds indented blocks (admonitions) and honours four-backtick fences."""
    page = tmp_path / "p.md"
    page.write_text(
        "text\n\n    ```python\n    x = 1\n        y = 2\n    ```\n\n"
        "````python\n```text\ninner\n```\n````\n\n```pycon\n>>> 1\n```\n",
        encoding="utf-8",
    )
    blocks = extract_blocks(page)
    assert [(b.line, b.language) for b in blocks] == [(3, "python"), (8, "python"), (14, "pycon")]
    assert blocks[0].code == "x = 1\n    y = 2\n"
    assert blocks[1].code == "```text\ninner\n```\n"


@pytest.mark.parametrize("block", [_tiered(b) for b in RUNNABLE_BLOCKS])
def test_code_block_runs(block: Block, tmp_path: Path) -> None:
    """This ```python block runs as a script, and again over the files or database it used.

    One that uses PostgreSQL must leave no schema behind in the database it was given.
    """
    script = tmp_path / "example.py"
    script.write_text(block.code, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    work = tmp_path / "cwd"
    work.mkdir()
    with _database_for(block) as dsn:
        if dsn is not None:
            env[PG_DSN_VARIABLE] = dsn
        _run_block(block, script, work, env, "")
        if dsn is not None or any(work.iterdir()):
            # Within a lease's TTL too: a reader runs an example again at once.
            _run_block(block, script, work, env, " (run again over what it left)")
        if dsn is not None:
            left = asyncio.run(_schemas(dsn))
            assert left == [], f"{block.where} left schemas behind: {left}"


def _run_block(block: Block, script: Path, work: Path, env: dict[str, str], run: str) -> None:
    try:
        result = SCRIPTS.run([str(script)], cwd=str(work), env=env, timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}{run} did not finish within {TIMEOUT_SECONDS}s:\n{block.code}")
    problems = []
    if result.returncode != 0:
        problems.append(f"exit status {result.returncode}")
    for marker in ("Traceback", "was never awaited"):
        if marker in result.stderr:
            problems.append(f"{marker!r} on stderr")
    if problems:
        pytest.fail(
            f"{block.where}{run}: {', '.join(problems)}\n--- code ---\n{block.code}"
            f"--- stdout ---\n{result.stdout}--- stderr ---\n{result.stderr}",
            pytrace=False,
        )


@contextmanager
def _database_for(block: Block) -> Iterator[str | None]:
    """A fresh database for a block that uses PostgreSQL (its DSN), dropped after; else None."""
    if PG_DSN_VARIABLE not in block.code:
        assert "postgresql://" not in block.code, f"{block.where}: read {PG_DSN_VARIABLE}"
        yield None
        return
    name = f"aiocp_docs_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield urlunsplit(urlsplit(PG_DSN)._replace(path=f"/{name}"))
    finally:
        _drop_later(name)


#: Drops a database, given the admin DSN and its name.
_DROP = """
import asyncio, sys
import asyncpg

async def drop(dsn, name):
    con = await asyncpg.connect(dsn)
    try:
        await con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await con.close()

asyncio.run(drop(*sys.argv[1:]))
"""
#: The drops under way (kept, so that none is collected while it runs).
_DROPPING: list[subprocess.Popen[bytes]] = []


def _drop_later(name: str) -> None:
    """Drop database ``name`` in a process of its own, not waited for.

    PostgreSQL 15 forces a checkpoint on DROP DATABASE: with the thousands of tables the
    suite's other tests create to sync, that takes 10-15 s, which the test would wait for.
    """
    drop = [sys.executable, "-c", _DROP, PG_DSN, name]
    _DROPPING.append(subprocess.Popen(drop, stdin=subprocess.DEVNULL, start_new_session=True))


async def _admin(statement: str) -> None:
    con = await asyncpg.connect(PG_DSN)
    try:
        await con.execute(statement)
    finally:
        await con.close()


async def _schemas(dsn: str) -> list[str]:
    """The schemas of a database other than those every database has."""
    con = await asyncpg.connect(dsn)
    try:
        rows = await con.fetch(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
            "AND nspname NOT IN ('public', 'information_schema') ORDER BY 1"
        )
    finally:
        await con.close()
    return [row[0] for row in rows]


def test_postgres_page_shows_the_current_schema_version() -> None:
    """docs/postgres-storage.md's schema listing gives the version a new store is created at."""
    page = (DOCS / "postgres-storage.md").read_text(encoding="utf-8")
    shown = re.findall(r"\('schema_version', '(\d+)'\)", page)
    assert shown == [str(PG_SCHEMA_VERSION)]
    assert f"-- version {PG_SCHEMA_VERSION}:" in page


# As Python-Markdown reads an ATX heading: no space is needed after the #s, and a closing
# run of #s is dropped.
_HEADING = re.compile(r"^(?P<level>#{1,6})(?P<text>.*?)#*[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_MARKUP_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def slugify(title: str) -> str:
    """The id Python-Markdown's toc extension (mkdocs' default) gives a heading's text.

    The heading's rendered text is used: a code span counts by its content, a link by its
    text; accents are folded to ASCII and everything but word characters, spaces and hyphens
    is dropped. tests/test_docs_site.py checks this against the ids of a real mkdocs build.
    """
    text = _MARKUP_LINK.sub(r"\1", title)
    text = _CODE_SPAN.sub(lambda m: m[2].strip(), text)
    text = html.unescape(text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


_ATTR_ID = re.compile(r"\{\s*#([\w-]+)\s*\}\s*$")


def _anchors(page: Path) -> set[str]:
    """The heading ids Python-Markdown's toc extension (used by mkdocs) gives a page."""
    anchors: set[str] = set()
    fence: str | None = None
    for line in page.read_text(encoding="utf-8").splitlines():
        opening = _OPEN.match(line)
        if fence is not None:
            if opening and opening["fence"].startswith(fence) and not opening["info"].strip():
                fence = None
        elif opening:
            fence = opening["fence"]
        elif heading := _HEADING.match(line):
            explicit = _ATTR_ID.search(heading["text"])  # attr_list's `{#id}` sets the id
            if explicit:
                anchors.add(explicit[1])
                continue
            slug = slugify(heading["text"])
            # A repeated id gets "_1", "_2", ... like the toc extension's unique().
            unique, n = slug, 0
            while unique in anchors or not unique:
                n += 1
                unique = f"{slug}_{n}"
            anchors.add(unique)
    return anchors


def test_relative_links_resolve() -> None:
    """Every relative link between docs pages points at a page (and heading) that exists."""
    broken = []
    for page in sorted(DOCS.glob("*.md")):
        for match in _LINK.finditer(page.read_text(encoding="utf-8")):
            target, _, anchor = match["target"].partition("#")
            if "://" in match["target"] or target.startswith("mailto:"):
                continue
            linked = page.parent / target if target else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)} -> {match['target']}")
            elif anchor and anchor not in _anchors(linked):
                broken.append(f"{page.relative_to(ROOT)} -> {match['target']} (no such heading)")
    assert broken == []
