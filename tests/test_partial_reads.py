"""The manager's partial reads of encrypted trees: with the keys, a look at one value and
the diff of two steps read only the blobs they need, each unsealed under its keyed name;
what they return is what the whole read returns; a wrong key, a missing key, a tampered
or moved blob or a plaintext blob raise the typed errors the whole read raises."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointManager,
    DecryptionError,
    Keyring,
    PlaintextRecordError,
    ResumableWorkflow,
    UnknownKeyError,
    open_storage,
)
from aiocheckpoint.codec import Apart, Cut
from aiocheckpoint.errors import CheckpointCorruptedError, InvalidArgumentError
from aiocheckpoint.format.statediff import Change, iter_changes
from aiocheckpoint.storage.base import StoredCheckpoint
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.test_cli import NewStore, new_store
from tests.test_web_peek import fetched

__all__ = ["new_store"]

KEY = os.urandom(32)
KEYS = Keyring(keys={"k1": KEY}, primary="k1")
OTHER = Keyring(keys={"k2": os.urandom(32)}, primary="k2")


async def story(url: str, keys: Keyring | None = KEYS) -> None:
    """Workflow "big": 600 keys of ~1 KB and a long list at step 0; one key edited at step
    1; a key removed, one added and the list grown at step 2."""
    async with (
        CheckpointManager(open_storage(url), encryption=keys) as manager,
        ResumableWorkflow("big", manager) as wf,
    ):
        async with wf.step(0, agent_id="a"):
            for n in range(600):
                wf.state.set(f"k{n:04}", f"{n}:" + "x" * 1000)
            wf.state.set("items", list(range(3000)))
        async with wf.step(1, agent_id="a"):
            wf.state.set("k0300", "edited")
        async with wf.step(2, agent_id="a"):
            wf.state.delete("k0010")
            wf.state.set("zz", {"new": [1, 2]})
            wf.state.set("items", [*range(3000), "more"])


async def records(manager: CheckpointManager, *steps: int) -> list[StoredCheckpoint]:
    out = []
    for step in steps:
        stored = await manager.storage.load("big", step)
        assert stored is not None
        out.append(stored)
    return out


async def whole_changes(manager: CheckpointManager, old: int, new: int) -> list[Change]:
    a, b = await records(manager, old, new)
    states = [
        (await manager.decode_record("big", r, view="stored")).state_snapshot.data for r in (a, b)
    ]
    return list(iter_changes(states[0], states[1]))


async def walked(manager: CheckpointManager, old: int | None, new: int) -> list[Change] | None:
    a = None if old is None else (await records(manager, old))[0]
    [b] = await records(manager, new)
    changes = await manager.diff_records("big", a, b)
    return None if changes is None else [c async for c in changes]


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "file"])
async def test_an_encrypted_tree_is_read_in_part_with_its_keys(
    kind: str, new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look and every diff return what the whole read does; on SQLite the look at one key
    and the one-key diff read a small part of the sealed blobs (bytes counted)."""
    url = new_store(kind)
    await story(url)
    sizes = fetched(monkeypatch)
    async with CheckpointManager(open_storage(url), encryption=KEYS) as manager:
        [zero] = await records(manager, 0)
        sizes.clear()
        peeked = await manager.peek_record("big", zero, ["k0599"], 0, 10)
        assert peeked is not None and peeked[1] == "599:" + "x" * 1000
        assert peeked[0].state_snapshot.data == {} and peeked[0].step == 0
        top = await manager.peek_record("big", zero, [], 0, 5)
        assert top is not None and isinstance(top[1], Cut)
        assert [k for k, _ in top[1].entries] == [f"k{n:04}" for n in range(5)] and top[1].more
        items = await manager.peek_record("big", zero, ["items"], 2990, 20)
        assert items is not None and isinstance(items[1], Cut)
        assert items[1].entries == [(n, n) for n in range(2990, 3000)] and not items[1].more
        with pytest.raises(InvalidArgumentError, match="nope"):
            await manager.peek_record("big", zero, ["nope"], 0, 5)
        sizes.clear()
        one = await walked(manager, 0, 1)
        if kind == "sqlite":
            # ~40 KB as a rule (of ~640 KB sealed a state); never both states: one side's
            # dict chunks may be read before the other side's index nodes show them shared.
            assert 0 < sum(sizes) < 700_000, sum(sizes)
        assert one == await whole_changes(manager, 0, 1)
        assert one is not None and [c.path for c in one] == ["k0300"]
        for old, new in [(1, 2), (0, 2)]:
            changes = await walked(manager, old, new)
            assert changes == await whole_changes(manager, old, new), (old, new)
            assert changes is not None and len(changes) >= 3
        first = await walked(manager, None, 0)
        assert first is not None and len(first) == 601 and first[0].op == "added"


async def test_what_a_partial_read_shows_names_blobs_by_their_keyed_names(
    new_store: NewStore,
) -> None:
    """A value left stored apart is named by the blob's keyed name, as the store holds it,
    never by the SHA-256 of its plain node (which would confirm a guess of the content)."""
    url = new_store("sqlite")
    await story(url)
    storage = open_storage(url)
    assert isinstance(storage, SQLiteCheckpointStorage)
    with sqlite3.connect(storage.path) as con:
        names = {bytes(h).hex() for (h,) in con.execute("SELECT hash FROM blobs")}
    async with CheckpointManager(open_storage(url), encryption=KEYS) as manager:
        [zero] = await records(manager, 0)
        peeked = await manager.peek_record("big", zero, [], 595, 10, expand=0)
        assert peeked is not None and isinstance(peeked[1], Cut)
        apart = [v for _, v in peeked[1].entries if isinstance(v, Apart)]
        assert apart and {a.name for a in apart} <= names


async def test_wrong_and_missing_keys_raise_as_the_whole_read_does(new_store: NewStore) -> None:
    """Another keyring: UnknownKeyError naming the key; no keys: None (the whole read says
    it is encrypted); a plaintext tree under an encrypting manager: PlaintextRecordError."""
    url = new_store("sqlite")
    await story(url)
    async with CheckpointManager(open_storage(url), encryption=OTHER) as manager:
        zero, one = await records(manager, 0, 1)
        with pytest.raises(UnknownKeyError) as raised:
            await manager.peek_record("big", zero, [], 0, 5)
        assert raised.value.key_id == "k1"
        with pytest.raises(UnknownKeyError):
            await manager.diff_records("big", zero, one)
    async with CheckpointManager(open_storage(url)) as manager:
        zero, one = await records(manager, 0, 1)
        assert await manager.peek_record("big", zero, [], 0, 5) is None
        assert await manager.diff_records("big", zero, one) is None
    plain = new_store("sqlite")
    await story(plain, keys=None)
    async with CheckpointManager(open_storage(plain), encryption=KEYS) as manager:
        [zero] = await records(manager, 0)
        with pytest.raises(PlaintextRecordError):
            await manager.peek_record("big", zero, [], 0, 5)
    async with CheckpointManager(
        open_storage(plain), encryption=KEYS, allow_plaintext=True
    ) as manager:
        zero, one = await records(manager, 0, 1)
        peeked = await manager.peek_record("big", zero, ["k0001"], 0, 5)
        assert peeked is not None and peeked[1] == "1:" + "x" * 1000
        changes = await manager.diff_records("big", zero, one)
        assert changes is not None and [c.path async for c in changes] == ["k0300"]


def _tamper(path: str, find: Any) -> None:
    """Rewrite the sealed blobs ``find`` picks (by name and bytes) in the SQLite store."""
    with sqlite3.connect(path) as con:
        rows = con.execute("SELECT hash, data FROM blobs").fetchall()
        for name, blob in rows:
            changed = find(bytes(name), bytes(blob), rows)
            if changed is not None:
                con.execute("UPDATE blobs SET data = ? WHERE hash = ?", (changed, name))


async def test_a_tampered_or_moved_blob_does_not_authenticate(new_store: NewStore) -> None:
    """A flipped byte in a sealed blob the diff reads, and a blob replaced by another one's
    sealed bytes: DecryptionError (a CheckpointCorruptedError) naming the checkpoint."""
    url = new_store("sqlite")
    await story(url)
    storage = open_storage(url)
    assert isinstance(storage, SQLiteCheckpointStorage)
    async with CheckpointManager(open_storage(url), encryption=KEYS) as manager:
        zero, one = await records(manager, 0, 1)
        changes = await manager.diff_records("big", zero, one)
        assert changes is not None
        assert [c.path async for c in changes] == ["k0300"]

    def flip(name: bytes, blob: bytes, rows: Any) -> bytes | None:
        return blob[:-1] + bytes([blob[-1] ^ 1])

    _tamper(storage.path, flip)
    async with CheckpointManager(open_storage(url), encryption=KEYS) as manager:
        zero, one = await records(manager, 0, 1)
        with pytest.raises(DecryptionError) as raised:
            await manager.peek_record("big", zero, ["k0599"], 0, 5)
        assert isinstance(raised.value, CheckpointCorruptedError)
        assert raised.value.workflow_id == "big" and raised.value.step == 0
        changes = await manager.diff_records("big", zero, one)
        assert changes is not None
        with pytest.raises(DecryptionError):
            [c async for c in changes]


async def test_a_blob_swapped_under_another_name_does_not_authenticate(
    new_store: NewStore,
) -> None:
    """Each blob sealed under its name: one blob's bytes stored under another's name (both
    authentic) fail, as do a plaintext node put in a sealed blob's place."""
    url = new_store("sqlite")
    await story(url)
    storage = open_storage(url)
    assert isinstance(storage, SQLiteCheckpointStorage)
    with sqlite3.connect(storage.path) as con:
        rows = [(bytes(h), bytes(d)) for h, d in con.execute("SELECT hash, data FROM blobs")]
    leaves = [(h, d) for h, d in rows if d[1:5] == b"\x00\x00\x00\x00"]  # no children
    assert len(leaves) >= 2
    (a, _), (_, b_data) = leaves[0], leaves[1]
    with sqlite3.connect(storage.path) as con:
        con.execute("UPDATE blobs SET data = ? WHERE hash = ?", (b_data, a))
    async with CheckpointManager(open_storage(url), encryption=KEYS) as manager:
        [zero] = await records(manager, 0)
        with pytest.raises(DecryptionError, match="does not authenticate"):
            await manager.peek_record("big", zero, [], 0, 10_000)  # every blob, read
        with sqlite3.connect(storage.path) as con:
            con.execute("UPDATE blobs SET data = ? WHERE hash = ?", (b"V\x00\x00\x00\x00[1]", a))
        with pytest.raises(DecryptionError, match="not sealed"):
            await manager.peek_record("big", zero, [], 0, 10_000)
