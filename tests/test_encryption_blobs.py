"""Encrypted incremental checkpoints (docs/encryption.md): sealed blobs under keyed names.

On every backend that keeps blobs: equal content still deduplicates (as many blobs as
without encryption), no name is a plain content hash, and a blob changed, swapped or
replaced at rest is refused with DecryptionError naming the checkpoint, while resuming
falls back to the newest checkpoint that authenticates.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from aiocheckpoint import (
    BlobCheckpointStorage,
    CheckpointCorruptedError,
    CheckpointManager,
    DecryptionError,
    EncryptionError,
    Keyring,
    SharedState,
    UnknownKeyError,
)
from aiocheckpoint.codec.pipeline import RecordCodec
from aiocheckpoint.codec.tree.join import areferenced_hashes
from aiocheckpoint.format import node_children, record_format_version, record_root_refs
from aiocheckpoint.format.sealed import (
    BLOB_SEALED,
    is_sealed_tree_record,
    sealed_blob_children,
)
from aiocheckpoint.format.tree import PLAIN_LEAF
from tests.backend_support import WITH_BLOBS, make_storage
from tests.pg_support import DSN, pg_schema
from tests.test_encryption import (
    CANARY,
    K1,
    K2,
    Provider,
    assert_no_canary,
    chat,
    dump_store,
    reachable,
    ring,
)
from tests.test_subtrees import CountingValues

__all__ = ["pg_schema"]


async def history(manager: CheckpointManager, workflow_id: str, steps: int) -> dict[str, Any]:
    """A growing chat, one checkpoint per step; the last state."""
    state = chat(2000)
    for step in range(steps):
        state["chat"].append({"role": "agent", "text": f"{CANARY} reply {step}"})
        await manager.create_checkpoint(workflow_id, step, "agent", "running", state)
    return state


async def blob_rows(kind: str, tmp_path: Path, schema: str) -> int:
    """How many blobs a database store holds."""
    if kind == "sqlite":
        with sqlite3.connect(tmp_path / "store.db") as con:
            count: int = con.execute("SELECT count(*) FROM blobs").fetchone()[0]
            return count
    con = await asyncpg.connect(DSN)
    try:
        count = await con.fetchval(f'SELECT count(*) FROM "{schema}".blobs')
        return int(count)
    finally:
        await con.close()


def leaves(blobs: dict[bytes, bytes], at: int) -> int:
    """How many blobs reference nothing (sealed: no names in the clear; plain: a leaf)."""
    head = bytes(4) if at == 5 else PLAIN_LEAF[1:5]
    return sum(1 for b in blobs.values() if b[1 : 1 + len(head)] == head and (at == 5 or b[0] == 0))


@pytest.mark.parametrize("kind", WITH_BLOBS)
async def test_equal_content_deduplicates_under_names_that_are_not_content_hashes(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    async with make_storage(kind, tmp_path, pg_schema) as store:
        assert isinstance(store, BlobCheckpointStorage)
        state = chat(3000)
        plain = CheckpointManager(store, incremental=True)
        await plain.create_checkpoint("wf-p", 0, "a", "running", state)
        # Two managers (two processes, say) with the same keyring share every blob.
        for workflow_id in ("wf-e", "wf-e2"):
            manager = CheckpointManager(store, incremental=True, encryption=ring())
            await manager.create_checkpoint(workflow_id, 0, "a", "running", state)
        stored = await store.load("wf-e", 0)
        assert stored is not None and is_sealed_tree_record(stored.data)
        names, again = await reachable(store, "wf-e", 0), await reachable(store, "wf-e2", 0)
        hashes = await reachable(store, "wf-p", 0)
        assert names == again and len(hashes) > 5
        assert not names & hashes  # a name is keyed: it is no content hash
        sealed, clear = await store.fetch_blobs(names), await store.fetch_blobs(hashes)
        assert all(b[0] == BLOB_SEALED for b in sealed.values())
        # The same chunks as without encryption; index nodes group children by name, so
        # their number varies a little (as between any two sets of names).
        assert leaves(sealed, 5) == leaves(clear, 1) and len(names) <= 1.25 * len(hashes)
        if kind != "file":
            assert await blob_rows(kind, tmp_path, pg_schema) == len(names) + len(hashes)
        # Every count is released through the names in the clear: nothing is left.
        reader = CheckpointManager(store, incremental=True, encryption=ring())
        assert (await reader.get_checkpoint("wf-e2", 0)).state_snapshot.data == state
        for workflow_id in ("wf-p", "wf-e", "wf-e2"):
            await reader.delete_checkpoints(workflow_id)
        await store.collect_garbage(**({"grace": 0} if kind == "file" else {}))
        assert await store.fetch_blobs(names | hashes) == {}


def flipped(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 0x01]) + blob[at + 1 :]


def tampered_blob(how: str, blob: bytes, other: bytes) -> bytes:
    """What replaces a sealed blob: each kind of tampering."""
    if how == "flip-ciphertext":
        return flipped(blob, len(blob) - 30)
    if how == "flip-tag":
        return flipped(blob, len(blob) - 1)
    if how == "flip-children":  # a name in the clear (what the backend counts)
        return flipped(blob, 6)
    if how == "swap":  # another blob's sealed bytes, under this name
        return other
    if how == "plaintext":
        return PLAIN_LEAF + b'"forged"'
    raise AssertionError(how)


async def replace_blob(
    kind: str, tmp_path: Path, schema: str, name: bytes, old: bytes, new: bytes
) -> None:
    """Overwrite a stored blob at rest (the file store: in place in its pack)."""
    if kind == "file":
        assert len(new) == len(old)
        packs = [p for p in (tmp_path / "store").rglob("*.pack") if old in p.read_bytes()]
        assert len(packs) == 1
        packs[0].write_bytes(packs[0].read_bytes().replace(old, new))
    elif kind == "sqlite":
        with sqlite3.connect(tmp_path / "store.db") as con:
            con.execute("UPDATE blobs SET data = ? WHERE hash = ?", (new, name))
    else:
        con = await asyncpg.connect(DSN)
        try:
            await con.execute(f'UPDATE "{schema}".blobs SET data = $1 WHERE hash = $2', new, name)
        finally:
            await con.close()


TAMPERING = [
    (kind, how)
    for kind in WITH_BLOBS
    for how in ("flip-ciphertext", "flip-tag", "flip-children", "swap", "plaintext")
    if kind != "file" or how.startswith("flip")  # a pack is rewritten in place only
]


@pytest.mark.parametrize(("kind", "how"), TAMPERING)
async def test_a_changed_blob_is_refused_and_resume_falls_back(
    kind: str, how: str, tmp_path: Path, pg_schema: str
) -> None:
    async with make_storage(kind, tmp_path, pg_schema) as store:
        assert isinstance(store, BlobCheckpointStorage)
        await history(CheckpointManager(store, incremental=True, encryption=ring()), "wf", 4)
        new = sorted((await reachable(store, "wf", 3)) - (await reachable(store, "wf", 2)))
        found = await store.fetch_blobs(new)
    with_children = [n for n in new if found[n][1:5] != bytes(4)]
    name = with_children[0] if how == "flip-children" else new[0]
    other = next(found[n] for n in new if found[n] != found[name])
    await replace_blob(
        kind, tmp_path, pg_schema, name, found[name], tampered_blob(how, found[name], other)
    )
    async with make_storage(kind, tmp_path, pg_schema) as store:
        manager = CheckpointManager(store, incremental=True, encryption=ring())
        with pytest.raises(DecryptionError) as caught:
            await manager.get_checkpoint("wf", 3)
        assert (caught.value.workflow_id, caught.value.step) == ("wf", 3)
        point = await manager.get_resume_point("wf")
        assert point is not None and point[0] == 2


async def test_encrypted_trees_need_their_keys(tmp_path: Path, pg_schema: str) -> None:
    async with make_storage("sqlite", tmp_path, pg_schema) as store:
        state = await history(
            CheckpointManager(store, incremental=True, encryption=ring()), "wf", 2
        )
        with pytest.raises(EncryptionError, match="encrypted"):
            await CheckpointManager(store).get_checkpoint("wf", 1)
        other = Keyring(keys={"k1": K2}, primary="k1")  # the same id, another key
        with pytest.raises(DecryptionError) as caught:
            await CheckpointManager(store, encryption=other).get_checkpoint("wf", 1)
        assert (caught.value.workflow_id, caught.value.step) == ("wf", 1)
        # After a rotation the old checkpoints read, new ones are named under the new key.
        rotated = CheckpointManager(store, incremental=True, encryption=ring("k2", k1=K1, k2=K2))
        assert (await rotated.get_checkpoint("wf", 1)).state_snapshot.data == state
        await rotated.create_checkpoint("wf", 2, "a", "running", state)
        assert not (await reachable(store, "wf", 2)) & (await reachable(store, "wf", 1))
        assert (await rotated.get_checkpoint("wf", 2)).state_snapshot.data == state


async def test_a_key_provider_without_a_name_key_names_blobs_per_manager(
    tmp_path: Path, pg_schema: str
) -> None:
    async with make_storage("sqlite", tmp_path, pg_schema) as store:
        provider = Provider()
        first = CheckpointManager(store, incremental=True, encryption=provider)
        state = chat(2000)
        for step in (0, 1):
            await first.create_checkpoint("wf", step, "a", "running", state)
        assert (await reachable(store, "wf", 0)) == (await reachable(store, "wf", 1))
        second = CheckpointManager(store, incremental=True, encryption=provider)
        await second.create_checkpoint("wf", 2, "a", "running", state)
        assert not (await reachable(store, "wf", 2)) & (await reachable(store, "wf", 1))
        reader = CheckpointManager(store, encryption=ring())
        assert (await reader.get_checkpoint("wf", 0)).state_snapshot.data == state
        assert (await reader.get_checkpoint("wf", 2)).state_snapshot.data == state


async def test_the_name_key_follows_the_primary_key_only() -> None:
    names = await ring().blob_name_key()
    assert len(names) == 32 and names != K1
    assert await ring("k1", k1=K1, k2=K2).blob_name_key() == names  # other keys: no change
    assert await ring("k2", k1=K1, k2=K2).blob_name_key() != names  # rotation: new names
    assert await Keyring(keys={"k1": K2}, primary="k1").blob_name_key() != names


async def test_a_shared_state_keeps_its_cached_sub_trees_when_encrypted(
    tmp_path: Path, pg_schema: str
) -> None:
    """Only what changed is copied and encoded, encrypted as plain; nothing readable stored."""
    async with make_storage("sqlite", tmp_path, pg_schema) as store:
        assert isinstance(store, BlobCheckpointStorage)
        manager = CheckpointManager(store, encryption=ring())
        values = CountingValues()
        sealer = manager._codec.sealer
        manager._codec = RecordCodec(store, store, values, sealer)
        docs = [{"id": i, "text": f"{CANARY} {i} " + "z" * 1000} for i in range(300)]
        state = SharedState({"documents": docs, "notes": {"a": "q" * 3000, "b": 1}})
        for step in range(3):
            state.set("notes.b", step)
            values.copied.clear()
            await manager.create_checkpoint("wf", step, "agent", "running", state)
            if step:
                assert "state.notes.b" in values.copied
                assert "state.documents" not in values.copied and "state" not in values.copied
        reader = CheckpointManager(store, encryption=ring())
        assert (await reader.get_checkpoint("wf", 2)).state_snapshot.data == state.to_dict()
        stored = await store.load("wf", 2)
        assert stored is not None and is_sealed_tree_record(stored.data)
        dumps = await dump_store("sqlite", store, tmp_path, pg_schema)
    assert_no_canary(dumps)


async def test_sealed_layouts_name_their_references_and_refuse_damage(
    tmp_path: Path, pg_schema: str
) -> None:
    async with make_storage("sqlite", tmp_path, pg_schema) as store:
        assert isinstance(store, BlobCheckpointStorage)
        await history(CheckpointManager(store, encryption=ring()), "wf", 1)
        stored = await store.load("wf", 0)
        assert stored is not None
        refs = record_root_refs(stored.data)
        assert refs and set(refs) <= await reachable(store, "wf", 0)
        blob = (await store.fetch_blobs(refs[:1]))[refs[0]]
        assert node_children(blob, 16) == sealed_blob_children(blob, 16)
        tops = list((await store.fetch_blobs(refs)).values())
        below = await areferenced_hashes(tops, store.fetch_blobs)
        assert below | set(refs) == await reachable(store, "wf", 0)
        for damaged in (stored.data[:30], stored.data[:24] + b"\xff" * 4 + stored.data[28:]):
            with pytest.raises(CheckpointCorruptedError):
                record_root_refs(damaged)
            await store.save("wf", 0, damaged)
            with pytest.raises(DecryptionError) as caught:
                await CheckpointManager(store, encryption=ring()).get_checkpoint("wf", 0)
            assert (caught.value.workflow_id, caught.value.step) == ("wf", 0)
        with pytest.raises(CheckpointCorruptedError):
            node_children(blob[:3], 16)


@pytest.mark.parametrize("kind", ["memory", *WITH_BLOBS])
async def test_a_fork_made_while_migrating_is_sealed(
    kind: str, tmp_path: Path, pg_schema: str
) -> None:
    """A migrating manager (``allow_plaintext=True``) forks a plaintext incremental history:
    each of the fork's records is sealed whole, so a strict reader reads every step and no
    record of the fork holds plaintext."""
    async with make_storage(kind, tmp_path, pg_schema) as store:
        plain = CheckpointManager(store, incremental=True)
        await history(plain, "wf", 2)
        states = [c.state_snapshot.data for c in await plain.list_checkpoints("wf")]
        source = await store.load("wf", 1)
        assert source is not None and record_format_version(source.data) == 2
        migrating = CheckpointManager(
            store, incremental=True, encryption=ring(), allow_plaintext=True
        )
        assert await migrating.fork_workflow("wf", 1, "fork") == 2
        strict = CheckpointManager(store, encryption=ring())
        for step, state in enumerate(states):
            assert (await strict.get_checkpoint("fork", step)).state_snapshot.data == state
            stored = await store.load("fork", step)
            assert stored is not None and CANARY.encode() not in stored.data


async def test_a_blob_under_a_key_the_reader_lacks_is_an_unknown_key(
    tmp_path: Path, pg_schema: str
) -> None:
    """A fork made after a rotation: its record is under the new key, its blobs the old."""
    async with make_storage("sqlite", tmp_path, pg_schema) as store:
        state = await history(CheckpointManager(store, encryption=ring()), "wf", 1)
        rotated = CheckpointManager(store, encryption=ring("k2", k1=K1, k2=K2))
        await rotated.fork_workflow("wf", 0, "fork")
        assert (await rotated.get_checkpoint("fork", 0)).state_snapshot.data == state
        only_new = CheckpointManager(store, encryption=Keyring(keys={"k2": K2}, primary="k2"))
        with pytest.raises(UnknownKeyError) as caught:
            await only_new.get_checkpoint("fork", 0)
        assert (caught.value.workflow_id, caught.value.step) == ("fork", 0)
        with pytest.raises(UnknownKeyError):  # no checkpoint of it authenticates
            await only_new.get_resume_point("fork")
