"""Conformance of content-addressed blob stores and their tree reads."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from ..codec import Keyring, encode_checkpoint_v2
from ..errors import CheckpointCorruptedError
from ..format.header import record_format_version
from ..manager import CheckpointManager
from ..storage.base import BlobCheckpointStorage, BlobReads, CheckpointStorage
from ._support import big_state


def _keyring() -> Keyring:
    """A keyring of one fresh key (skips the test without the ``crypto`` extra)."""
    pytest.importorskip("cryptography", reason="encryption needs the 'crypto' extra")
    return Keyring(keys={"k1": os.urandom(32)}, primary="k1")


class BlobStorageConformance:
    """What a :class:`~aiocheckpoint.storage.base.BlobCheckpointStorage` must show.

    Every test goes through :class:`~aiocheckpoint.CheckpointManager`, which writes states
    over ``blob_params.root_inline_limit`` as version-2 records plus blobs.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_is_a_blob_storage(self, storage: CheckpointStorage) -> None:
        """The storage implements the blob protocol, so the manager goes incremental."""
        assert isinstance(storage, BlobCheckpointStorage)
        assert CheckpointManager(storage).incremental

    async def test_large_state_round_trips_as_version_2(self, storage: CheckpointStorage) -> None:
        """A large state is stored as a version-2 record and reads back equal."""
        manager = CheckpointManager(storage)
        state = big_state(1)
        written = await manager.create_checkpoint("wf", 0, "a", "running", state)
        stored = await storage.load("wf", 0)
        assert stored is not None and record_format_version(stored.data) == 2
        got = await manager.get_checkpoint("wf", 0)
        assert got == written and got.state_snapshot.data == state

    async def test_small_state_stays_version_1(self, storage: CheckpointStorage) -> None:
        """A small state is written as a plain version-1 record."""
        manager = CheckpointManager(storage)
        await manager.create_checkpoint("wf", 0, "a", "running", {"k": 1})
        stored = await storage.load("wf", 0)
        assert stored is not None and record_format_version(stored.data) == 1
        assert (await manager.get_checkpoint("wf", 0)).state_snapshot.data == {"k": 1}

    async def test_fetch_returns_only_stored_blobs(self, storage: CheckpointStorage) -> None:
        """fetch_blobs returns stored blobs and leaves unknown hashes out."""
        assert isinstance(storage, BlobCheckpointStorage)
        manager = CheckpointManager(storage)
        checkpoint = await manager.create_checkpoint("wf", 0, "a", "running", big_state(2))
        _record, split = encode_checkpoint_v2(checkpoint, storage.blob_params)
        wanted = list(split.blobs)[:5]
        unknown = b"\x00" * storage.blob_params.digest_size
        got = await storage.fetch_blobs([*wanted, unknown])
        assert set(got) == set(wanted)
        assert all(got[h] == split.blobs[h] for h in wanted)

    async def test_mixed_versions_list_in_order(self, storage: CheckpointStorage) -> None:
        """list/iter/latest read a history that mixes version-1 and version-2 records."""
        manager = CheckpointManager(storage)
        states = [{"small": i} if i % 2 else big_state(i) for i in range(6)]
        for i, state in enumerate(states):
            await manager.create_checkpoint("wf", i, "a", "running", state)
        listed = await manager.list_checkpoints("wf")
        assert [c.state_snapshot.data for c in listed] == states
        iterated = [
            c.state_snapshot.data async for c in manager.iter_checkpoints("wf", page_size=4)
        ]
        assert iterated == states
        latest = await manager.get_latest_checkpoint("wf")
        assert latest is not None and latest.state_snapshot.data == states[-1]

    async def test_replacing_a_step_reads_the_new_state(self, storage: CheckpointStorage) -> None:
        """Writing a step again with another large state replaces it."""
        manager = CheckpointManager(storage)
        await manager.create_checkpoint("wf", 0, "a", "running", big_state(1))
        await manager.create_checkpoint("wf", 0, "a", "running", big_state(2))
        got = await manager.get_checkpoint("wf", 0)
        assert got.state_snapshot.data == big_state(2)

    async def test_retention_keeps_newest_loadable(self, storage: CheckpointStorage) -> None:
        """max_checkpoints prunes old incremental checkpoints; the kept ones still load."""
        manager = CheckpointManager(storage, max_checkpoints=2)
        for i in range(5):
            await manager.create_checkpoint("wf", i, "a", "running", big_state(i))
        await storage.collect_garbage()  # type: ignore[attr-defined]
        listed = await manager.list_checkpoints("wf")
        assert [c.step for c in listed] == [3, 4]
        assert [c.state_snapshot.data for c in listed] == [big_state(3), big_state(4)]

    async def test_gc_keeps_blobs_shared_with_remaining(self, storage: CheckpointStorage) -> None:
        """Deleting one of two checkpoints that share blobs, then collecting, keeps the other."""
        assert isinstance(storage, BlobCheckpointStorage)
        manager = CheckpointManager(storage)
        await manager.create_checkpoint("a", 0, "x", "running", big_state(1))
        await manager.create_checkpoint("b", 0, "x", "running", big_state(2))
        await manager.delete_checkpoints("a")
        assert await storage.collect_garbage() >= 0
        got = await manager.get_checkpoint("b", 0)
        assert got.state_snapshot.data == big_state(2)

    async def test_gc_frees_blobs_of_deleted_checkpoints(self, storage: CheckpointStorage) -> None:
        """After every checkpoint is deleted, the blobs they alone used are gone."""
        assert isinstance(storage, BlobCheckpointStorage)
        manager = CheckpointManager(storage)
        checkpoint = await manager.create_checkpoint("wf", 0, "a", "running", big_state(7))
        _record, split = encode_checkpoint_v2(checkpoint, storage.blob_params)
        await manager.delete_checkpoints("wf")
        await storage.collect_garbage()
        assert await storage.fetch_blobs(list(split.blobs)) == {}

    @pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
    async def test_a_fork_reads_whole_after_its_source_is_collected(
        self, storage: CheckpointStorage, encrypted: bool
    ) -> None:
        """Fork, delete the source, collect garbage: every step of the fork still reads.

        Encrypted, the fork's records are sealed again for the new workflow with the root's
        references in the clear: those must name every blob the tree relies on, or the
        store frees one with the source.
        """
        assert isinstance(storage, BlobCheckpointStorage)
        keyring = _keyring() if encrypted else None
        manager = CheckpointManager(storage, encryption=keyring)
        states = [big_state(i, f"v{i % 2}") for i in range(3)]
        for i, state in enumerate(states):
            await manager.create_checkpoint("src", i, "a", "completed", state)
        assert await manager.fork_workflow("src", 2, "fork") == 3
        await manager.delete_checkpoints("src")
        await storage.collect_garbage()
        for i, state in enumerate(states):
            got = await manager.get_checkpoint("fork", i)
            assert got.state_snapshot.data == state, i
        point = await manager.get_resume_point("fork")
        assert point is not None and (point[0], point[1].data) == (3, states[2])

    async def test_record_with_missing_blobs_is_corrupted(self, storage: CheckpointStorage) -> None:
        """A version-2 record whose blobs are missing is corrupted; resume falls back.

        The error names the workflow and step, and the resume point is the previous step.
        """
        manager = CheckpointManager(storage)
        await manager.create_checkpoint("wf", 0, "a", "completed", big_state(1))
        orphan = await manager.create_checkpoint(
            "other", 1, "a", "running", big_state(99, "orphan")
        )
        record, _split = encode_checkpoint_v2(
            orphan.model_copy(update={"workflow_id": "wf"}),
            storage.blob_params,  # type: ignore[attr-defined]
        )
        await manager.delete_checkpoints("other")
        await storage.collect_garbage()  # type: ignore[attr-defined]
        await storage.save("wf", 1, record)
        with pytest.raises(CheckpointCorruptedError) as info:
            await manager.get_checkpoint("wf", 1)
        assert (info.value.workflow_id, info.value.step) == ("wf", 1)
        resume = await manager.get_resume_point("wf")
        assert resume is not None and resume[0] == 1
        assert resume[1].data == big_state(1)


class BlobReadsConformance:
    """What a blob store that also offers :class:`~aiocheckpoint.storage.base.BlobReads` must show.

    Optional: the manager reads a tree through ``read_blobs_in_thread`` when a store has it,
    else through ``fetch_blobs``. Subclass it beside :class:`BlobStorageConformance`.
    """

    pytestmark: ClassVar = [pytest.mark.asyncio]

    async def test_thread_reads_answer_like_fetch_blobs(self, storage: CheckpointStorage) -> None:
        """read_blobs_in_thread runs off the loop and fetches like fetch_blobs.

        What its function raises is passed on.
        """
        assert isinstance(storage, BlobReads)
        assert isinstance(storage, BlobCheckpointStorage)
        manager = CheckpointManager(storage)
        checkpoint = await manager.create_checkpoint("wf", 0, "a", "running", big_state(2))
        _record, split = encode_checkpoint_v2(checkpoint, storage.blob_params)
        wanted = list(split.blobs)
        unknown = b"\x00" * storage.blob_params.digest_size
        loop_thread = threading.get_ident()

        def read(fetch: Callable[[list[bytes]], Any]) -> tuple[int, Any, Any]:
            return threading.get_ident(), fetch(wanted[:3]), fetch([*wanted[3:], unknown])

        thread, first, rest = await storage.read_blobs_in_thread(read)
        assert thread != loop_thread
        assert {**first, **rest} == split.blobs

        def fail(_fetch: Any) -> None:
            raise KeyError("from fn")

        with pytest.raises(KeyError, match="from fn"):
            await storage.read_blobs_in_thread(fail)
