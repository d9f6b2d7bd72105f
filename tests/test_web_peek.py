"""A large state's step page reads part of it: the nodes on the way to the value shown and
the chunks of one page of entries, each checked against its hash; what it shows is what
the whole read shows (sizes and bytes read asserted, never times: bench/web.py)."""

from __future__ import annotations

import datetime as dt
import html
import re
import sqlite3
from typing import Any

import pytest

from aiocheckpoint import CheckpointManager, ResumableWorkflow, open_storage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.web import data
from tests.test_cli import NewStore, new_store
from tests.web_support import HOSTILE_VALUE, client
from tests.web_support import KEYS as WEB_KEYS

__all__ = ["new_store"]

#: 2,000 keys of 1,000 characters: about 2 MB, cut into a few hundred blobs.
KEYS = 2000


def fill(state: Any) -> None:
    """The large state: long strings, a nested list, typed values, hostile text."""
    for n in range(KEYS):
        state.set(f"k{n:05}", f"{n}:" + "x" * 1000)
    state.set("nested", {"items": list(range(5000)), "hostile": HOSTILE_VALUE})
    state.set("when", dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc))
    state.set("raw", b"\x00\x01" * 3000)
    state.set("pair", tuple(range(3000)))


async def big(url: str) -> None:
    async with (
        CheckpointManager(open_storage(url)) as manager,
        ResumableWorkflow("big", manager) as wf,
    ):
        async with wf.step(0, agent_id="a"):
            fill(wf.state)


def fetched(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes of every blob fetch, as they happen."""
    sizes: list[int] = []
    original = SQLiteCheckpointStorage.fetch_blobs

    async def counted(self: SQLiteCheckpointStorage, hashes: Any) -> Any:
        got = await original(self, hashes)
        sizes.append(sum(map(len, got.values())))
        return got

    monkeypatch.setattr(SQLiteCheckpointStorage, "fetch_blobs", counted)
    return sizes


def keys_shown(page: str) -> list[str]:
    return [html.unescape(k) for k in re.findall(r'<span class="key">([^<]*)</span>', page)]


async def whole(http: Any, params: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The page as the whole read draws it."""

    async def never(*_: Any) -> None:
        return None

    with monkeypatch.context() as patch:
        patch.setattr(data, "_peek", never)
        return str((await http.get("/step", params=params)).text)


def same(peeked: str, read: str) -> bool:
    """Equal but for what only the whole read knows: a large container's length."""
    counts = re.compile(r"\d+\+? items|>(\d+ )?more</a>")
    return counts.sub("N", peeked) == counts.sub("N", read)


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "file"])
async def test_a_large_state_is_read_a_page_at_a_time(
    kind: str, new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The top page shows the first 200 keys, reading a small part of the state's bytes; its
    "more" link shows the next 200; a nested list opens at its path and offset; each page
    is the one the whole read draws (bytes read counted on SQLite)."""
    url = new_store(kind)
    await big(url)
    sizes = fetched(monkeypatch)
    async with client(url) as http:
        top = (await http.get("/step", params={"id": "big", "step": "0"})).text
        read = sum(sizes)
        assert 0 < read < 300_000 if kind == "sqlite" else read == 0, read  # of ~2.1 MB
        shown = keys_shown(top)
        assert shown[:3] == ["state", "k00000", "k00001"] and shown[-1] == "k00199"
        assert "200+ items" in top
        more = re.search(r'<li class="more"><a href="([^"]+)">more</a>', top)
        assert more is not None
        sizes.clear()
        second = (await http.get(html.unescape(more.group(1)))).text
        assert keys_shown(second)[1:3] == ["k00200", "k00201"]
        nested = {"id": "big", "step": "0", "path": '["nested", "items"]', "offset": "4900"}
        items = (await http.get("/step", params=nested)).text
        assert keys_shown(items)[1:3] == ["4900", "4901"] and keys_shown(items)[-1] == "4999"
        for params in [
            {"id": "big", "step": "0"},
            {"id": "big", "step": "0", "path": "[]", "offset": "200"},
            nested,
            {"id": "big", "step": "0", "path": '["nested"]'},
            {"id": "big", "step": "0", "path": '["k01999"]'},
        ]:
            peeked = (await http.get("/step", params=params)).text
            assert same(peeked, await whole(http, params, monkeypatch)), params
        gone = await http.get("/step", params={"id": "big", "step": "0", "path": '["nope"]'})
        assert gone.status_code == 400
    monkeypatch.setattr(data, "EXPAND", 0)
    async with client(url) as http:
        inside = await http.get("/step", params={"id": "big", "step": "0", "path": '["nested"]'})
        # With no bytes to spend, the long list inside stays stored apart: a link to its page.
        assert re.search(r'items</span> <span class="type">stored apart</span>', inside.text)
        assert "path=%5B%22nested%22%2C+%22items%22%5D" in inside.text


async def test_typed_and_hostile_values_read_in_part_show_as_the_whole_read_does(
    new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A datetime and bytes among the entries shown by type, a long tuple stored apart as a
    link to its page (which reads it whole), and a hostile string escaped."""
    url = new_store("sqlite")
    await big(url)
    async with client(url) as http:
        params = {"id": "big", "step": "0", "path": "[]", "offset": "1800"}
        peeked = (await http.get("/step", params=params)).text
        assert same(peeked, await whole(http, params, monkeypatch))
        params["offset"] = "2000"
        last = (await http.get("/step", params=params)).text
        shown = keys_shown(last)
        assert shown[1:3] == ["nested", "items"] and {"hostile", "when", "raw", "pair"} <= set(
            shown
        )
        assert "datetime" in last and "bytes (6000 bytes, base64)" in last
        assert "tuple</span>" in last and "3000 items" not in last  # a Cut: "200+ items"
        pair = {"id": "big", "step": "0", "path": '["pair"]', "offset": "2900"}
        shown = (await http.get("/step", params=pair)).text  # read whole: a typed container
        assert keys_shown(shown)[1:3] == ["2900", "2901"]
        hostile = await http.get("/step", params={"id": "big", "step": "0", "path": '["nested"]'})
        assert "<script>window" not in hostile.text and "&lt;script&gt;" in hostile.text


async def test_a_damaged_blob_is_reported_not_shown(new_store: NewStore) -> None:
    """A blob whose bytes no longer match its hash: the page says corrupted, naming it."""
    url = new_store("sqlite")
    await big(url)
    storage = open_storage(url)
    assert isinstance(storage, SQLiteCheckpointStorage)
    path = storage.path
    async with client(url) as http:
        before = (await http.get("/step", params={"id": "big", "step": "0"})).text
    assert "k00000" in before
    with sqlite3.connect(path) as con:
        for name, blob in con.execute("SELECT hash, data FROM blobs").fetchall():
            if b"0:xxxx" in blob:  # the chunk holding k00000
                damaged = blob.replace(b"0:xxxx", b"0:xxxy", 1)
                con.execute("UPDATE blobs SET data = ? WHERE hash = ?", (damaged, name))
    async with client(url) as http:
        after = (await http.get("/step", params={"id": "big", "step": "0"})).text
    assert "corrupted: blob" in after and "does not match its hash" in after
    assert "k00000" not in after


async def sealed(url: str, edit: str = "") -> None:
    """Workflow "big", encrypted: 300 keys of 1,000 characters; ``edit`` in k00150 at step 1."""
    async with (
        CheckpointManager(open_storage(url), encryption=WEB_KEYS) as manager,
        ResumableWorkflow("big", manager) as wf,
    ):
        async with wf.step(0, agent_id="a"):
            for n in range(300):
                wf.state.set(f"k{n:05}", "x" * 1000)
        if edit:
            async with wf.step(1, agent_id="a"):
                wf.state.set("k00150", edit)


async def test_an_encrypted_large_state_is_read_in_part_or_locked(
    new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without keys the page says locked (not corrupted); with them it reads a page of the
    sealed tree, each blob unsealed under its name, and shows what the whole read shows."""
    url = new_store("sqlite")
    await sealed(url)
    async with client(url) as http:
        locked = (await http.get("/step", params={"id": "big", "step": "0"})).text
    assert 'class="problem locked"' in locked and "corrupted" not in locked
    sizes = fetched(monkeypatch)
    async with client(url, WEB_KEYS) as http:
        params = {"id": "big", "step": "0"}
        opened = (await http.get("/step", params=params)).text
        read = sum(sizes)
        shown = keys_shown(opened)
        assert "k00199" in shown and "k00299" not in shown and "200+ items" in opened
        assert 0 < read < 260_000, read  # of ~300 KB sealed: the chunks of 200 keys
        assert same(opened, await whole(http, params, monkeypatch))
