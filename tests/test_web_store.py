"""The inspector's store page: backend, schema version, size, and `verify` on demand, a
bounded number of checkpoints a request, damaged and locked records told apart."""

from __future__ import annotations

import html
import re

import pytest

from aiocheckpoint import CheckpointManager, open_storage
from aiocheckpoint.storage.postgres.schema import SCHEMA_VERSION as PG_VERSION
from aiocheckpoint.storage.sqlite.schema import SCHEMA_VERSION
from aiocheckpoint.web import store
from tests.test_cli import BACKENDS, NewStore, new_store
from tests.web_support import KEYS, client, populate

__all__ = ["new_store"]

SUMMARY = re.compile(
    r"Checked (\d+) checkpoints in (\d+) workflows[^:]*: (\d+) corrupted, (\d+) unreadable"
)


def fact(page: str, name: str) -> str:
    return html.unescape(page.split(f"<dt>{name}</dt><dd>", 1)[1].split("</dd>", 1)[0])


@pytest.mark.parametrize("kind", BACKENDS)
async def test_the_store_page_names_backend_schema_and_size(kind: str, new_store: NewStore) -> None:
    url = new_store(kind)
    await populate(url)
    async with client(url) as http:
        page = (await http.get("/store")).text
    backend = {"file": "File", "sqlite": "SQLite", "postgres": "Postgres"}[kind]
    assert fact(page, "backend") == f"{backend}CheckpointStorage"
    if kind == "sqlite":
        assert fact(page, "schema version") == str(SCHEMA_VERSION)
    if kind == "postgres":
        assert fact(page, "schema version") == str(PG_VERSION)
        assert fact(page, "size") == "not measured by the inspector"
    else:
        assert int(fact(page, "size").split()[0].replace(",", "")) > 1000
    assert ("finished 2" in page) == (kind != "file")  # "done" and the hostile one
    assert 'action="/store"' in page and "Checked" not in page  # verify only on demand


async def walk(http: object, start: str) -> tuple[list[tuple[int, ...]], str]:
    """Follow "Verify the next checkpoints" from ``start``: each page's summary (checked,
    workflows, corrupted, unreadable), all text."""
    seen, text, target = [], "", start
    while target:
        page = (await http.get(target)).text  # type: ignore[attr-defined]
        [found] = SUMMARY.findall(page)
        seen.append(tuple(int(n) for n in found))
        text += page
        following = re.findall(r'rel="next" href="([^"]*)"', page)
        target = html.unescape(following[0]) if following else ""
    return seen, text


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_verify_pages_through_every_checkpoint(
    kind: str, new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 3 checkpoints a request, following the pages decodes every checkpoint once and
    no request decodes more than 3."""
    url = new_store(kind)
    await populate(url, extra=4)
    async with CheckpointManager(open_storage(url)) as manager:
        total = 0
        for workflow_id in await manager.list_workflows():
            total += len(await manager.storage.scan(workflow_id))
    monkeypatch.setattr(store, "VERIFY_RECORDS", 3)
    async with client(url) as http:
        seen, text = await walk(http, "/store?verify=1")
    assert all(checked <= 3 for checked, *_ in seen)
    assert sum(checked for checked, *_ in seen) == total
    assert sum(bad + locked for _, _, bad, locked in seen) == 0
    assert "verified to its end" in text


def rows(text: str, css: str) -> list[tuple[str, str, str]]:
    """The (workflow, step, why) rows of every page's table of class ``css``."""
    found = []
    for table in text.split(f'<table class="list {css}">')[1:]:
        body = table.split("</table>", 1)[0]
        for row in re.findall(r"<tr><td>(.*?)</td></tr>", body):
            cells = re.split(r"</td><td[^>]*>", row)
            found.append(tuple(html.unescape(re.sub(r"<[^>]+>", "", c)) for c in cells))
    return found  # type: ignore[return-value]


async def test_verify_lists_damaged_and_unreadable_records_apart(new_store: NewStore) -> None:
    """A flipped byte is listed as corrupted (which checkpoint, why) with the keys; without
    them every record, the damaged one too (it cannot be authenticated), is listed in the
    unreadable list with the key it needs, and none as corrupted."""
    url = new_store("sqlite")
    await populate(url, keys=KEYS)
    async with CheckpointManager(open_storage(url), encryption=KEYS) as manager:
        stored = await manager.storage.load("done", 1)
        assert stored is not None
        flipped = stored.data[:-1] + bytes([stored.data[-1] ^ 1])
        await manager.storage.save("done", 1, flipped)
    async with client(url, keys=KEYS) as http:
        seen, text = await walk(http, "/store?verify=1")
    [(workflow, step, why)] = rows(text, "corrupted")
    assert (workflow, step) == ("done", "1") and why.startswith("corrupted")
    assert rows(text, "unreadable") == [] and sum(s[3] for s in seen) == 0
    async with client(url) as http:
        seen, text = await walk(http, "/store?verify=1")
    unreadable = rows(text, "unreadable")
    assert rows(text, "corrupted") == [] and sum(s[2] for s in seen) == 0
    assert len(unreadable) == sum(s[3] for s in seen) == sum(s[0] for s in seen) > 3
    assert ("done", "1") in {(w, s) for w, s, _ in unreadable}
    assert all(why.startswith("locked") for _, _, why in unreadable)
