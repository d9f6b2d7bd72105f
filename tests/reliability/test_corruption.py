"""Corruption through the storage protocol: damaged records are detected, never misread.

Each test stores damaged bytes with ``storage.save`` (any backend must keep arbitrary
bytes) and reads them back through the manager: the only acceptable outcome is
:class:`CheckpointCorruptedError` naming the workflow and step.
"""

from __future__ import annotations

import json
import logging
import struct
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    CheckpointStorage,
    ResumableWorkflow,
)
from aiocheckpoint.format.header import HEADER_SIZE

from ._support import hypothesis_settings, record

WF = "victim"
STATE = {"plan": ["a", "b", "c"], "n": 42, "text": "ünïcødé " * 8}


async def _good(manager: CheckpointManager, storage: CheckpointStorage, step: int = 3) -> bytes:
    await manager.create_checkpoint(WF, step, "agent", "completed", STATE, metadata={"s": step})
    stored = await storage.load(WF, step)
    assert stored is not None
    return stored.data


async def _assert_corrupted(manager: CheckpointManager, step: int = 3) -> None:
    """Every read path of the damaged step raises CheckpointCorruptedError naming it."""
    with pytest.raises(CheckpointCorruptedError) as info:
        await manager.get_checkpoint(WF, step)
    assert (info.value.workflow_id, info.value.step) == (WF, step)
    with pytest.raises(CheckpointCorruptedError):
        await manager.get_latest_checkpoint(WF)
    with pytest.raises(CheckpointCorruptedError):
        await manager.list_checkpoints(WF)


def _body(data: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(data[HEADER_SIZE:])
    return body


@hypothesis_settings(50)
@given(cut=st.integers(0, 10**6))
@example(cut=0)
@example(cut=HEADER_SIZE - 1)
@example(cut=HEADER_SIZE)
async def test_truncated_records_are_detected(
    manager: CheckpointManager, storage: CheckpointStorage, cut: int
) -> None:
    """A record cut short anywhere (including to zero bytes) raises CheckpointCorruptedError."""
    good = await _good(manager, storage)
    await storage.save(WF, 3, good[: cut % len(good)])
    await _assert_corrupted(manager)


@hypothesis_settings(20)
@given(extra=st.binary(min_size=1, max_size=64))
async def test_padded_records_are_detected(
    manager: CheckpointManager, storage: CheckpointStorage, extra: bytes
) -> None:
    """A record with bytes appended after its body raises CheckpointCorruptedError."""
    good = await _good(manager, storage)
    await storage.save(WF, 3, good + extra)
    await _assert_corrupted(manager)


@hypothesis_settings(80, 2000)
@given(positions=st.lists(st.integers(0, 10**7), min_size=1, max_size=3, unique=True))
async def test_flipped_bits_are_detected(
    manager: CheckpointManager, storage: CheckpointStorage, positions: list[int]
) -> None:
    """One to three flipped bits anywhere in a record raise CheckpointCorruptedError."""
    good = await _good(manager, storage)
    damaged = bytearray(good)
    bits = {p % (len(good) * 8) for p in positions}
    for bit in bits:
        damaged[bit // 8] ^= 1 << (bit % 8)
    await storage.save(WF, 3, bytes(damaged))
    await _assert_corrupted(manager)


@pytest.mark.parametrize("offset", range(HEADER_SIZE))
async def test_every_bit_flip_in_the_header_is_detected(
    manager: CheckpointManager, storage: CheckpointStorage, offset: int
) -> None:
    """Each of the 8 single-bit flips of this header byte raises CheckpointCorruptedError."""
    good = await _good(manager, storage)
    for bit in range(8):
        damaged = bytearray(good)
        damaged[offset] ^= 1 << bit
        await storage.save(WF, 3, bytes(damaged))
        with pytest.raises(CheckpointCorruptedError):
            await manager.get_checkpoint(WF, 3)


@pytest.mark.parametrize("version", [0, 2, 3, 127, 255])
async def test_unknown_format_version_is_refused(
    manager: CheckpointManager, storage: CheckpointStorage, version: int
) -> None:
    """A record claiming a format version this library does not know raises
    CheckpointCorruptedError."""
    good = await _good(manager, storage)
    await storage.save(WF, 3, record(good[HEADER_SIZE:], version=version))
    await _assert_corrupted(manager)


@pytest.mark.parametrize("which", ["other_workflow", "other_step"])
async def test_a_record_moved_from_elsewhere_is_refused(
    manager: CheckpointManager, storage: CheckpointStorage, which: str
) -> None:
    """A valid record of another workflow or another step, stored in this slot, is refused."""
    await _good(manager, storage, 3)
    await manager.create_checkpoint("other", 3, "agent", "completed", {"other": True})
    source = await storage.load("other", 3) if which == "other_workflow" else None
    if source is None:
        source = await storage.load(WF, 3)
        await storage.save(WF, 4, source.data if source else b"")
        step = 4
    else:
        await storage.save(WF, 3, source.data)
        step = 3
    with pytest.raises(CheckpointCorruptedError) as info:
        await manager.get_checkpoint(WF, step)
    assert "belongs to" in info.value.reason
    assert (await manager.get_checkpoint("other", 3)).state_snapshot.data == {"other": True}


@hypothesis_settings(60)
@given(garbage=st.binary(max_size=256))
@example(garbage=b"")
@example(garbage=b"ACKP")
@example(garbage=b"\x80\x04\x95")  # the start of a pickle
@example(garbage=b'{"workflow_id": "victim", "step": 3}')
async def test_non_record_garbage_is_refused(
    manager: CheckpointManager, storage: CheckpointStorage, garbage: bytes
) -> None:
    """Arbitrary bytes, empty bytes and bare JSON stored as a record raise
    CheckpointCorruptedError.
    """
    await _good(manager, storage)
    await storage.save(WF, 3, garbage)
    await _assert_corrupted(manager)


_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda c: st.one_of(
        st.lists(c, max_size=3), st.dictionaries(st.text(max_size=8), c, max_size=3)
    ),
    max_leaves=10,
)
_FIELDS = ["workflow_id", "step", "agent_id", "status", "timestamp", "metrics", "metadata", "state"]


@hypothesis_settings(80, 2000)
@given(
    field=st.sampled_from([*_FIELDS, "state.data", "state.version", "state.metadata", "whole"]),
    action=st.sampled_from(["replace", "delete"]),
    value=_json,
)
async def test_checksum_valid_records_with_bad_fields_never_misread(
    manager: CheckpointManager, storage: CheckpointStorage, field: str, action: str, value: Any
) -> None:
    """A record with a valid checksum but a missing or mistyped field raises
    CheckpointCorruptedError or decodes to a checkpoint of the right workflow and step, never
    anything else.
    """
    body = _body(await _good(manager, storage))
    if field == "whole":
        body = value
    else:
        parent, _, key = field.rpartition(".")
        target = body[parent] if parent else body
        if action == "delete":
            del target[key]
        else:
            target[key] = value
    await storage.save(WF, 3, record(json.dumps(body).encode()))
    try:
        checkpoint = await manager.get_checkpoint(WF, 3)
    except CheckpointCorruptedError as exc:
        where = (exc.workflow_id, exc.step)
    else:
        where = (checkpoint.workflow_id, checkpoint.step)
    assert where == (WF, 3)


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xfe not utf-8",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a": ' * 50_000 + b"1" + b"}" * 50_000,
        b"1" * 100_000,
        b"NaN",
        b"",
    ],
    ids=["not-utf8", "deep-list", "deep-dict", "huge-int", "nan", "empty"],
)
async def test_hostile_bodies_with_valid_checksums_are_refused(
    manager: CheckpointManager, storage: CheckpointStorage, body: bytes
) -> None:
    """Non-UTF-8, 100k-deep, huge-number and empty bodies with valid checksums raise
    CheckpointCorruptedError.
    """
    await _good(manager, storage)
    await storage.save(WF, 3, record(body))
    await _assert_corrupted(manager)


# --- falling back to the newest checkpoint that verifies -------------------------------


async def _history(manager: CheckpointManager, storage: CheckpointStorage, steps: int) -> None:
    for step in range(steps):
        await manager.create_checkpoint(WF, step, "agent", "completed", {"step": step})


async def test_resume_point_falls_back_to_the_newest_verifying_checkpoint(
    manager: CheckpointManager, storage: CheckpointStorage, caplog: pytest.LogCaptureFixture
) -> None:
    """With the two newest checkpoints damaged, get_resume_point resumes after the third and logs a
    warning.
    """
    await _history(manager, storage, 6)
    good = (await storage.load(WF, 5)).data  # type: ignore[union-attr]
    await storage.save(WF, 5, good[:-3])
    await storage.save(WF, 4, b"garbage")
    with caplog.at_level(logging.WARNING, logger="aiocheckpoint"):
        point = await manager.get_resume_point(WF)
    assert point is not None
    step, snapshot, _metrics = point
    assert (step, snapshot.data) == (4, {"step": 3})
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "step 5" in warnings[0].getMessage()
    assert repr(WF) in warnings[0].getMessage()


async def test_resume_fallback_pages_through_a_long_damaged_tail(
    manager: CheckpointManager, storage: CheckpointStorage, caplog: pytest.LogCaptureFixture
) -> None:
    """When the 120 newest of 130 checkpoints are damaged, resume still finds step 9."""
    await _history(manager, storage, 130)
    for step in range(10, 130):
        await storage.save(WF, step, b"\x00" * step)
    with caplog.at_level(logging.WARNING, logger="aiocheckpoint"):
        point = await manager.get_resume_point(WF)
    assert point is not None
    assert (point[0], point[1].data) == (10, {"step": 9})
    assert any("resuming from step 9" in r.getMessage() for r in caplog.records)


async def test_resume_raises_when_no_checkpoint_verifies(
    manager: CheckpointManager, storage: CheckpointStorage
) -> None:
    """When every checkpoint is damaged, get_resume_point and try_resume raise
    CheckpointCorruptedError.
    """
    await _history(manager, storage, 3)
    for step in range(3):
        await storage.save(WF, step, b"ACKP" + bytes(30))
    with pytest.raises(CheckpointCorruptedError) as info:
        await manager.get_resume_point(WF)
    assert (info.value.workflow_id, info.value.step) == (WF, 2)
    with pytest.raises(CheckpointCorruptedError):
        await ResumableWorkflow(WF, manager).try_resume()


async def test_try_resume_restores_the_newest_verifying_state(
    manager: CheckpointManager, storage: CheckpointStorage, caplog: pytest.LogCaptureFixture
) -> None:
    """ResumableWorkflow.try_resume skips a damaged latest checkpoint and restores the one before
    it.
    """
    await _history(manager, storage, 3)
    await storage.save(WF, 2, struct.pack(">I", 7) * 10)
    workflow = ResumableWorkflow(WF, manager)
    with caplog.at_level(logging.WARNING, logger="aiocheckpoint"):
        assert await workflow.try_resume() == 2
    assert workflow.state.to_dict() == {"step": 1}
    assert workflow.is_completed(1)
    assert not workflow.is_completed(2)
    assert caplog.records
