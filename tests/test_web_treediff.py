"""The diff of two tree records walks both trees, reading only where they differ, and yields
the changes the diff of the whole states yields, in the same order (bytes read counted on
SQLite, never times: bench/web.py)."""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
from typing import Any

import pytest

from aiocheckpoint import CheckpointManager, ResumableWorkflow, open_storage
from aiocheckpoint.codec import diff_trees
from aiocheckpoint.errors import CheckpointCorruptedError
from aiocheckpoint.format.limits import DEFAULT_MAX_RECORD_BYTES
from aiocheckpoint.format.statediff import Change, iter_changes
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.web import diff, tree
from tests.test_cli import NewStore, new_store
from tests.test_web_peek import KEYS, fetched, fill, same, sealed
from tests.web_support import KEYS as WEB_KEYS
from tests.web_support import client

__all__ = ["new_store"]

#: test_web_peek's large state's datetime.
WHEN = dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)


async def history(url: str) -> int:
    """test_web_peek's large state, then one kind of edit a step; the number of steps."""
    edits: list[Any] = [
        lambda s: s.set("k01000", "edited"),  # deep in a big dict
        lambda s: (s.delete("k00500"), s.set("k99999", {"new": [1, 2]})),  # removed, added
        lambda s: s.set("nested", {**s.get("nested"), "items": [*range(5000), 1, 2, 3]}),
        lambda s: s.set("nested", {**s.get("nested"), "items": [0, *range(1, 4000)]}),
        lambda s: (s.set("when", WHEN + dt.timedelta(days=1)), s.set("raw", b"\x02" * 3000)),
        lambda s: (s.set("pair", tuple(range(2999))), s.set("flag", 1.0)),
        lambda s: (s.set("flag", True), s.set("nested", ["now", "a", "list"])),
        lambda s: s.set("docs", [{"n": n, "text": f"{n}" + "y" * 20_000} for n in range(40)]),
        lambda s: s.set("docs", [*s.get("docs")[:20], {"n": -1}, *s.get("docs")[21:]]),
        lambda s: s.set("nested", {"items": [*range(2500), "mid", *range(2501, 4000)]}),
        lambda s: [s.set(f"k{n:05}", n) for n in range(0, KEYS, 7)],  # many changes: pages
    ]
    async with (
        CheckpointManager(open_storage(url)) as manager,
        ResumableWorkflow("big", manager) as wf,
    ):
        async with wf.step(0, agent_id="a"):
            fill(wf.state)
            wf.state.set("flag", 1)
        for step, edit in enumerate(edits, 1):
            async with wf.step(step, agent_id="a"):
                edit(wf.state)
    return len(edits) + 1


async def both_ways(
    manager: CheckpointManager,
    old: int | None,
    new: int,
    read: dict[int, tuple[Any, Any]] | None = None,
) -> tuple[list[Change] | None, list[Change]]:
    """The tree diff's changes (None: it cannot walk these) and the whole states' ones.

    ``read`` keeps each step's record and whole state once read (a test diffing many pairs
    of the same steps reads each step's ~2.1 MB state once, not once per pair).
    """
    storage: Any = manager.storage
    read = {} if read is None else read
    for step in (old, new):
        if step is not None and step not in read:
            record = await storage.load("big", step)
            decoded = await manager.decode_record("big", record, view="stored")
            read[step] = record, decoded.state_snapshot.data
    records = [None if s is None else read[s][0] for s in (old, new)]
    states = [{} if s is None else read[s][1] for s in (old, new)]
    whole = list(iter_changes(states[0], states[1], tree.is_typed))
    walk = diff_trees(
        None if records[0] is None else records[0].data,
        records[1].data,
        storage.fetch_blobs,
        workflow_id="big",
        old_step=old,
        step=new,
        max_bytes=DEFAULT_MAX_RECORD_BYTES,
        atomic=tree.is_typed,
    )
    return (None if walk is None else [c async for c in walk]), whole


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "file"])
async def test_the_tree_diff_yields_the_whole_states_changes(
    kind: str, new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step against the one before and against the first, and the first against
    nothing: the same changes, in the same order; a deep edit reads a small part."""
    url = new_store(kind)
    steps = await history(url)
    sizes = fetched(monkeypatch)
    async with CheckpointManager(open_storage(url)) as manager:
        pairs = [(s - 1, s) for s in range(1, steps)] + [(0, s) for s in range(2, steps)]
        read: dict[int, tuple[Any, Any]] = {}
        for old, new in [*pairs, (None, 0)]:
            sizes.clear()
            walked, whole = await both_ways(manager, old, new, read)
            assert walked is not None, (old, new)
            assert whole, (old, new)
            assert walked == whole, (old, new)
            if (old, new) == (0, 1) and kind == "sqlite":
                assert [c.path for c in walked] == ["k01000"]
                assert 0 < sum(sizes) < 100_000, sum(sizes)  # of the ~2.1 MB each state holds


async def test_a_diff_page_of_tree_records_is_the_whole_reads(
    new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step's diff page, and the next page of the one with many changes, as the whole
    read draws them; the deep edit's page reads a small part of the states."""
    url = new_store("sqlite")
    steps = await history(url)
    sizes = fetched(monkeypatch)

    async def never(*_: Any) -> None:
        return None

    async with client(url) as http:
        for step in range(steps):
            for offset in (0, 200) if step == steps - 1 else (0,):
                params = {"id": "big", "step": str(step), "offset": str(offset)}
                sizes.clear()
                walked = (await http.get("/diff", params=params)).text
                read = sum(sizes)
                with monkeypatch.context() as patch:
                    patch.setattr(diff, "_tree_page", never)
                    whole = (await http.get("/diff", params=params)).text
                # Equal but for a large container's length, unknown without reading it.
                assert same(walked, whole), params
                if step == 0:  # against nothing: the added keys streamed, a page's worth
                    assert 0 < read < 700_000, read  # of ~2.1 MB
                if step == 1:
                    assert 0 < read < 100_000, read
                    assert re.search(r"k01000", walked)
                if step == steps - 1:
                    assert "More changes" in walked if offset == 0 else "More" not in walked


async def test_records_it_cannot_walk_are_diffed_whole(new_store: NewStore) -> None:
    """A state kept inline (a small one) is no tree: None, and the page reads it whole."""
    url = new_store("sqlite")
    async with (
        CheckpointManager(open_storage(url)) as manager,
        ResumableWorkflow("big", manager) as wf,
    ):
        async with wf.step(0, agent_id="a"):
            wf.state.set("a", 1)
        async with wf.step(1, agent_id="a"):
            wf.state.set("a", 2)
        walked, whole = await both_ways(manager, 0, 1)
        assert walked is None
        assert [c.path for c in whole] == ["a"]
    async with client(url) as http:
        page = (await http.get("/diff", params={"id": "big", "step": "1"})).text
        assert ">a<" in page or "a</" in page


async def test_sealed_trees_are_walked_with_their_keys_or_locked(new_store: NewStore) -> None:
    """A record still sealed is not walked by diff_trees (None); the manager walks it once
    unsealed (tests/test_partial_reads.py); without keys the diff page says locked, with
    them it shows the change."""
    url = new_store("sqlite")
    await sealed(url, "sealed edit")
    async with CheckpointManager(open_storage(url), encryption=WEB_KEYS) as manager:
        walked, whole = await both_ways(manager, 0, 1)
        assert walked is None
        assert [c.path for c in whole] == ["k00150"]
        records = [await manager.storage.load("big", s) for s in (0, 1)]
        assert records[0] is not None and records[1] is not None
        changes = await manager.diff_records("big", records[0], records[1], atomic=tree.is_typed)
        assert changes is not None and [c async for c in changes] == whole
    async with client(url) as http:
        locked = (await http.get("/diff", params={"id": "big", "step": "1"})).text
    assert 'class="problem locked"' in locked and "sealed edit" not in locked
    async with client(url, WEB_KEYS) as http:
        opened = (await http.get("/diff", params={"id": "big", "step": "1"})).text
    assert "k00150" in opened and "sealed edit" in opened


async def test_a_damaged_chunk_is_reported_not_shown(new_store: NewStore) -> None:
    """The chunk that differs no longer matches its hash: the walk raises a typed error and
    the page says corrupted (the whole read names the step), showing no change."""
    url = new_store("sqlite")
    await history(url)
    storage = open_storage(url)
    assert isinstance(storage, SQLiteCheckpointStorage)
    with sqlite3.connect(storage.path) as con:
        for name, blob in con.execute("SELECT hash, data FROM blobs").fetchall():
            if b'"edited"' in blob:  # the chunk holding step 1's k01000
                damaged = blob.replace(b'"edited"', b'"editex"', 1)
                con.execute("UPDATE blobs SET data = ? WHERE hash = ?", (damaged, name))
    async with CheckpointManager(open_storage(url)) as manager:
        opened = manager.storage
        assert isinstance(opened, SQLiteCheckpointStorage)
        records = [await opened.load("big", s) for s in (0, 1)]
        assert records[0] is not None and records[1] is not None
        walk = diff_trees(
            records[0].data,
            records[1].data,
            opened.fetch_blobs,
            workflow_id="big",
            old_step=0,
            step=1,
            max_bytes=DEFAULT_MAX_RECORD_BYTES,
        )
        assert walk is not None
        with pytest.raises(CheckpointCorruptedError, match="does not match its hash"):
            [c async for c in walk]
    async with client(url) as http:
        page = (await http.get("/diff", params={"id": "big", "step": "1"})).text
    assert "step 1: corrupted" in page and "edite" not in page
