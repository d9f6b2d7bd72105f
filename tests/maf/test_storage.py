"""``AioCheckpointStorage`` against the ``CheckpointStorage`` protocol's documented behaviour.

On every backend, plain and encrypted: ``save`` stores a copy and returns its id; ``load``
returns a copy, and raises ``WorkflowCheckpointException`` for an unknown id (also from a
new storage object, which must find it in the store); ``list_checkpoints`` and
``list_checkpoint_ids`` give one workflow name's checkpoints in the order saved;
``get_latest`` the last saved; ``delete`` says whether it existed.
"""

from __future__ import annotations

import anyio
import pytest
from agent_framework import WorkflowCheckpoint
from agent_framework.exceptions import WorkflowCheckpointException

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    DecryptionError,
    InvalidArgumentError,
)
from aiocheckpoint.integrations.agent_framework import AioCheckpointStorage


def checkpoint(name: str, previous: str | None = None, **state: object) -> WorkflowCheckpoint:
    return WorkflowCheckpoint(
        workflow_name=name, graph_signature_hash="h", previous_checkpoint_id=previous, state=state
    )


async def test_save_load_round_trip_and_copies(manager: CheckpointManager) -> None:
    storage = AioCheckpointStorage(manager)
    original = checkpoint("w", n=1, nested={"a": [1, 2]})
    assert await storage.save(original) == original.checkpoint_id
    original.state["n"] = 2
    loaded = await storage.load(original.checkpoint_id)
    assert loaded.state == {"n": 1, "nested": {"a": [1, 2]}}
    assert loaded.to_dict() | {"state": {}} == original.to_dict() | {"state": {}}
    loaded.state["n"] = 3
    assert (await storage.load(original.checkpoint_id)).state["n"] == 1


async def test_unknown_ids_are_reported(manager: CheckpointManager) -> None:
    storage = AioCheckpointStorage(manager)
    with pytest.raises(WorkflowCheckpointException):
        await storage.load("nope")
    assert not await storage.delete("nope")
    assert await storage.get_latest(workflow_name="w") is None
    assert await storage.list_checkpoints(workflow_name="w") == []
    with pytest.raises(InvalidArgumentError):
        await storage.load("")


async def test_lists_keep_the_order_and_the_chain(manager: CheckpointManager) -> None:
    storage = AioCheckpointStorage(manager)
    first = checkpoint("w", n=0)
    chain = [first]
    for n in range(1, 4):
        chain.append(checkpoint("w", chain[-1].checkpoint_id, n=n))
    for cp in chain:
        await storage.save(cp)
    await storage.save(checkpoint("other"))
    ids = [cp.checkpoint_id for cp in chain]
    assert await storage.list_checkpoint_ids(workflow_name="w") == ids
    listed = await storage.list_checkpoints(workflow_name="w")
    assert [cp.previous_checkpoint_id for cp in listed] == [None, *ids[:-1]]
    latest = await storage.get_latest(workflow_name="w")
    assert latest is not None
    assert latest.checkpoint_id == ids[-1]


async def test_a_new_storage_object_finds_any_id(manager: CheckpointManager) -> None:
    saved = [checkpoint("w", n=n) for n in range(3)] + [checkpoint("v", n=9)]
    for cp in saved:
        await AioCheckpointStorage(manager).save(cp)
    assert (await AioCheckpointStorage(manager).load(saved[1].checkpoint_id)).state == {"n": 1}
    assert (await AioCheckpointStorage(manager).load(saved[3].checkpoint_id)).state == {"n": 9}
    assert await AioCheckpointStorage(manager).delete(saved[1].checkpoint_id)
    assert not await AioCheckpointStorage(manager).delete(saved[1].checkpoint_id)
    with pytest.raises(WorkflowCheckpointException):
        await AioCheckpointStorage(manager).load(saved[1].checkpoint_id)
    remaining = await AioCheckpointStorage(manager).list_checkpoint_ids(workflow_name="w")
    assert remaining == [saved[0].checkpoint_id, saved[2].checkpoint_id]


async def test_saving_an_id_again_replaces_it(manager: CheckpointManager) -> None:
    storage = AioCheckpointStorage(manager)
    cp = checkpoint("w", n=1)
    await storage.save(cp)
    cp.state["n"] = 2
    await storage.save(cp)
    assert await storage.list_checkpoint_ids(workflow_name="w") == [cp.checkpoint_id]
    assert (await storage.load(cp.checkpoint_id)).state == {"n": 2}


async def test_concurrent_saves_lose_nothing(manager: CheckpointManager) -> None:
    saved: list[str] = []

    async def saver() -> None:
        storage = AioCheckpointStorage(manager)
        for n in range(5):
            saved.append(await storage.save(checkpoint("w", n=n)))

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(saver)
    ids = await AioCheckpointStorage(manager).list_checkpoint_ids(workflow_name="w")
    assert sorted(ids) == sorted(saved)
    assert len(ids) == 40


async def test_a_type_outside_the_allowed_ones_is_refused_at_save(
    manager: CheckpointManager,
) -> None:
    storage = AioCheckpointStorage(manager)
    with pytest.raises(WorkflowCheckpointException):
        await storage.save(checkpoint("w", bad=InvalidArgumentError("x")))
    assert await storage.list_checkpoints(workflow_name="w") == []
    allowing = AioCheckpointStorage(
        manager, allowed_checkpoint_types=["aiocheckpoint.errors:InvalidArgumentError"]
    )
    cp = checkpoint("w", bad=InvalidArgumentError("x"))
    await allowing.save(cp)
    assert isinstance((await allowing.load(cp.checkpoint_id)).state["bad"], InvalidArgumentError)
    with pytest.raises(WorkflowCheckpointException):
        await storage.load(cp.checkpoint_id)


async def test_a_changed_record_is_refused_before_decoding(
    manager: CheckpointManager, sealed: bool
) -> None:
    storage = AioCheckpointStorage(manager)
    cp = checkpoint("w", n=1)
    await storage.save(cp)
    workflow_id = storage.workflow_id("w")
    stored = await manager.storage.load(workflow_id, 0)
    assert stored is not None
    data = bytearray(stored.data)
    data[len(data) // 2] ^= 0x01
    await manager.storage.save(workflow_id, 0, bytes(data))
    with pytest.raises(CheckpointCorruptedError) as raised:
        await storage.load(cp.checkpoint_id)
    assert isinstance(raised.value, DecryptionError) == sealed
