"""Checkpoint ids that share a step: the saver refuses the second, and never mixes their data.

A checkpoint's step is its id's 60-bit timestamp, so ids that differ only in the UUID's
version digit or its low 64 bits share one. Two savers over one store stand for two
processes (each with its own caches).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)

from aiocheckpoint import InvalidArgumentError
from aiocheckpoint.integrations.langgraph import (
    AioCheckpointSaver,
    CheckpointIdCollisionError,
    keys,
)
from tests.langgraph.conftest import BACKENDS, open_backend
from tests.pg_support import drop_schema, new_schema_name

THREAD = "t"


def twins(checkpoint_id: str) -> list[str]:
    """Ids with ``checkpoint_id``'s timestamp: another version digit, other low 64 bits."""
    value = uuid.UUID(checkpoint_id).int
    other_version = value ^ (0x7 << 76)  # version 6 -> 1
    other_low = value ^ 0x0123_4567_89AB
    return [str(uuid.UUID(int=v)) for v in (other_version, other_low)]


@pytest.fixture(params=BACKENDS)
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    schema = new_schema_name()
    opened = open_backend(request.param, tmp_path, schema)
    async with opened:
        yield opened
    if request.param == "postgres":
        await drop_schema(schema)


async def put(saver: AioCheckpointSaver, checkpoint_id: str) -> None:
    checkpoint = generate_checkpoint(checkpoint_id=checkpoint_id)
    await saver.aput(generate_config(THREAD), checkpoint, generate_metadata(), {})


def config(checkpoint_id: str) -> Any:
    return generate_config(THREAD, checkpoint_id=checkpoint_id)


async def stored(saver: AioCheckpointSaver) -> list[tuple[str, int, bytes]]:
    workflow_id = keys.workflow_id(THREAD, "")
    records = await saver.manager.storage.scan(workflow_id, limit=100)
    return [(workflow_id, r.step, r.data) for r in records]


def test_twins_share_a_step() -> None:
    first = generate_checkpoint()["id"]
    for twin in twins(first):
        assert twin != first
        assert keys.checkpoint_step(twin) == keys.checkpoint_step(first)


async def test_second_id_of_a_step_is_refused_and_nothing_is_written(storage: Any) -> None:
    async with AioCheckpointSaver(storage) as saver:
        first = generate_checkpoint()["id"]
        await put(saver, first)
        await saver.aput_writes(config(first), [("channel", "mine")], "task-1")
        before = await stored(saver)
        for twin in twins(first):
            with pytest.raises(CheckpointIdCollisionError) as caught:
                await put(saver, twin)
            assert isinstance(caught.value, InvalidArgumentError)
            assert (caught.value.checkpoint_id, caught.value.stored_id) == (twin, first)
            with pytest.raises(CheckpointIdCollisionError):
                await saver.aput_writes(config(twin), [("channel", "theirs")], "task-2")
            assert await saver.aget_tuple(config(twin)) is None
        assert await stored(saver) == before
        found = await saver.aget_tuple(config(first))
        assert found is not None
        assert found.pending_writes == [("task-1", "channel", "mine")]


async def test_another_saver_refuses_writes_for_a_twin(storage: Any) -> None:
    """A saver that did not store the checkpoint checks the stored one (and its writes)."""
    first = generate_checkpoint()["id"]
    twin = twins(first)[1]
    async with AioCheckpointSaver(storage) as writer:
        await put(writer, first)
    async with AioCheckpointSaver(storage) as other:
        before = await stored(other)
        with pytest.raises(CheckpointIdCollisionError):  # the checkpoint names first
            await other.aput_writes(config(twin), [("channel", "theirs")], "task-2")
        assert await stored(other) == before
    async with AioCheckpointSaver(storage) as writer:
        await writer.aput_writes(config(first), [("channel", "mine")], "task-1")
    async with AioCheckpointSaver(storage) as other:
        before = await stored(other)
        with pytest.raises(CheckpointIdCollisionError):  # its writes name first
            await other.aput_writes(config(twin), [("channel", "theirs")], "task-2")
        assert await stored(other) == before
        await other.aput_writes(config(first), [("channel", "more")], "task-3")
        found = await other.aget_tuple(config(first))
    assert found is not None
    assert found.pending_writes == [("task-1", "channel", "mine"), ("task-3", "channel", "more")]


async def test_writes_of_one_id_never_show_as_a_twins(storage: Any) -> None:
    """Two savers that each stored one of the twins: neither sees the other's writes."""
    first = generate_checkpoint()["id"]
    twin = twins(first)[0]
    async with AioCheckpointSaver(storage) as one, AioCheckpointSaver(storage) as two:
        await put(one, first)
        await put(two, twin)  # two has never seen first: its checkpoint takes the step
        await one.aput_writes(config(first), [("channel", "for first")], "task-1")
        found = await two.aget_tuple(config(twin))
        assert found is not None and found.checkpoint["id"] == twin
        assert found.pending_writes == []
        assert await one.aget_tuple(config(first)) is None
        [latest] = [t async for t in two.alist(generate_config(THREAD))]
        assert latest.pending_writes == []


async def test_an_id_of_timestamp_zero_is_stored_and_read(storage: Any) -> None:
    """The first step (an id whose timestamp is 0) reads back, with its writes."""
    first = "00000000-0000-6000-8000-000000000001"
    assert keys.checkpoint_step(first) == 0
    async with AioCheckpointSaver(storage) as saver:
        await put(saver, first)
        await saver.aput_writes(config(first), [("channel", "mine")], "task-1")
        found = await saver.aget_tuple(config(first))
        assert found is not None and found.checkpoint["id"] == first
        assert found.pending_writes == [("task-1", "channel", "mine")]
        with pytest.raises(CheckpointIdCollisionError):
            await put(saver, twins(first)[1])
