"""Huge ints: writers refuse an int longer than a store keeps, readers refuse one as corruption.

Turning decimal digits into an int takes time that grows faster than their count: a
checksum-valid 8 MB record holding one 8,000,000-digit int would hold a reader (and the
event loop's GIL) for minutes. ``MAX_INT_DIGITS`` bounds it on both sides, on every backend,
whatever the interpreter's own digit limit (``sys.set_int_max_str_digits``) says.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    CheckpointSerializationError,
    CheckpointStorage,
    EffectRecord,
    EffectState,
    ResumableWorkflow,
)
from aiocheckpoint.codec.effects import encode_effect
from aiocheckpoint.format import MAX_INT_DIGITS, MAX_SHARED_HASH, SplitResult
from aiocheckpoint.format.header import HEADER_SIZE
from aiocheckpoint.format.jsonread import loads
from tests.backend_support import ALL, make_storage
from tests.hostile.test_decoder import WF, body_of, meta_of, record_v1, record_v2, value_node
from tests.pg_support import pg_schema

__all__ = ["pg_schema"]

#: The longest int a store keeps, and the shortest it refuses.
LONGEST = 10**MAX_INT_DIGITS - 1
TOO_LONG = 10**MAX_INT_DIGITS
#: Digit counts a reader must refuse: one past the limit, and eight million (an 8 MB record).
REFUSED = [MAX_INT_DIGITS + 1, 8_000_000]


@pytest.fixture(params=ALL)
async def storage(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[CheckpointStorage]:
    async with make_storage(request.param, tmp_path, pg_schema) as store:
        yield store


@pytest.fixture(params=["interpreter-limit", "no-interpreter-limit"])
def interpreter_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    """Python's own digit limit as it is by default, and lifted (0: ints of any length)."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit if request.param == "interpreter-limit" else 0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(limit)


def digits(count: int, sign: bytes = b"") -> bytes:
    """An int's JSON text: ``count`` digits (a 9, then zeros, then a 7)."""
    return sign + b"9" + b"0" * (count - 2) + b"7"


def number(count: int) -> int:
    """The int :func:`digits` writes."""
    return 9 * 10 ** (count - 1) + 7


def with_int(template: dict[str, Any], number: bytes) -> bytes:
    """``template`` as JSON text, its ``7`` placeholder value replaced by ``number``."""
    text = json.dumps(template, separators=(",", ":")).encode()
    assert text.count(b":7}") == 1
    return text.replace(b":7}", b":" + number + b"}")


# --- writing -------------------------------------------------------------------------------


async def test_writers_refuse_an_int_longer_than_a_store_keeps_naming_its_path(
    storage: CheckpointStorage,
) -> None:
    """State, metadata, a step's metadata and an effect's result: a typed error naming the
    path, nothing stored; an int of exactly MAX_INT_DIGITS digits round-trips."""
    manager = CheckpointManager(storage)
    refused = {
        "state.plan[1]": {"state": {"plan": [1, TOO_LONG]}},
        "state.t[0]": {"state": {"t": (-TOO_LONG,)}},
        "metadata.m": {"state": {}, "metadata": {"m": {"n": TOO_LONG}}},
    }
    for path, args in refused.items():
        with pytest.raises(CheckpointSerializationError) as info:
            await manager.create_checkpoint(WF, 0, "a", "completed", **args)
        assert info.value.path.startswith(path), info.value.path
        assert str(MAX_INT_DIGITS) in info.value.reason
    with pytest.raises(CheckpointSerializationError, match=r"metadata\.n"):
        async with ResumableWorkflow(WF, manager) as wf:
            async with wf.step(0, "a", metadata={"n": TOO_LONG}):
                pytest.fail("the step's body runs after its metadata was refused")
    assert await manager.get_latest_checkpoint(WF) is None

    async def huge() -> int:
        return TOO_LONG

    with pytest.raises(CheckpointSerializationError, match="effect 'call' result"):
        async with ResumableWorkflow(WF, manager) as wf:
            async with wf.step(0, "a"):
                await wf.effect("call", huge)
    await manager.create_checkpoint(
        WF, 1, "a", "completed", {"n": LONGEST}, metadata={"m": -LONGEST}
    )
    back = await manager.get_checkpoint(WF, 1)
    assert (back.state_snapshot.data, back.metadata) == ({"n": LONGEST}, {"m": -LONGEST})


async def test_a_large_state_with_a_too_long_int_is_refused_before_its_tree_is_written(
    tmp_path: Path,
) -> None:
    """The incremental path (a tree of blobs) copies through the same check."""
    async with make_storage("file", tmp_path, "") as storage:
        manager = CheckpointManager(storage, incremental=True)
        state = {"pad": ["x" * 100] * 2000, "deep": {"n": [TOO_LONG]}}
        with pytest.raises(CheckpointSerializationError, match=r"state\.deep\.n\[0\]"):
            await manager.create_checkpoint(WF, 0, "a", "completed", state)
        assert not await storage.exists(WF)


# --- reading -------------------------------------------------------------------------------


@pytest.mark.parametrize("count", REFUSED)
@pytest.mark.parametrize("where", ["state", "metadata", "state.metadata"])
@pytest.mark.usefixtures("interpreter_limit")
async def test_a_version_1_record_holding_a_too_long_int_is_corruption(
    storage: CheckpointStorage, where: str, count: int
) -> None:
    """A checksum-valid record holding one int of ``count`` digits is refused at once (the
    resume point falls back to the step before); at the limit a forged record still reads."""
    manager = CheckpointManager(storage)
    await manager.create_checkpoint(WF, 0, "agent", "completed", {"n": 0})
    await storage.save(WF, 1, record_v1_text(with_int(holding(1, where), digits(count, b"-"))))
    with pytest.raises(CheckpointCorruptedError, match=f"int of {count} digits"):
        await manager.get_checkpoint(WF, 1)
    step, snapshot, _ = await manager.get_resume_point(WF)  # type: ignore[misc]
    assert (step, snapshot.data) == (1, {"n": 0})
    at_limit = with_int(holding(2, where), digits(MAX_INT_DIGITS))
    await storage.save(WF, 2, record_v1_text(at_limit))
    read = await manager.get_checkpoint(WF, 2)
    holder = read.state_snapshot.data if where == "state" else read.metadata
    if where == "state.metadata":
        holder = read.state_snapshot.metadata
    assert holder == {"x": number(MAX_INT_DIGITS)}


def holding(step: int, where: str) -> dict[str, Any]:
    """A genuine record body of ``step`` whose ``where`` is ``{"x": 7}``."""
    body = body_of(step, {"n": step})
    target = {"state": body["state"], "metadata": body, "state.metadata": body["state"]}[where]
    target["data" if where == "state" else "metadata"] = {"x": 7}
    return body


def record_v1_text(body: bytes) -> bytes:
    """A version-1 record with a valid checksum around the JSON text ``body``."""
    record = record_v1({})
    return record[: HEADER_SIZE - 8] + struct.pack(">II", len(body), zlib.crc32(body)) + body


@pytest.mark.parametrize("count", REFUSED)
@pytest.mark.usefixtures("interpreter_limit")
async def test_a_tree_holding_a_too_long_int_is_corruption(
    storage: CheckpointStorage, count: int
) -> None:
    """A version-2 record whose root holds the int: the rebuilt text is refused the same way."""
    manager = CheckpointManager(storage)
    await manager.create_checkpoint(WF, 0, "agent", "completed", {"n": 0})
    root = b"\x00" + value_node(with_int({"x": 7}, digits(count)))
    await storage.save_tree(WF, 1, record_v2(meta_of(1), root), SplitResult(b"", {}, {}, ()))
    with pytest.raises(CheckpointCorruptedError, match=f"int of {count} digits"):
        await manager.get_checkpoint(WF, 1)
    step, snapshot, _ = await manager.get_resume_point(WF)  # type: ignore[misc]
    assert (step, snapshot.data) == (1, {"n": 0})


@pytest.mark.parametrize("count", REFUSED)
@pytest.mark.usefixtures("interpreter_limit")
async def test_an_effect_record_holding_a_too_long_int_is_corruption(
    storage: CheckpointStorage, count: int
) -> None:
    """An effect's stored result holding the int: reading the journal is refused."""
    manager = CheckpointManager(storage)
    now = datetime.now(timezone.utc)
    record = EffectRecord(WF, 0, "call", "tool", EffectState.IN_DOUBT, 1, now, "idem")
    data, _ = encode_effect(record.finished(EffectState.DONE, result={"x": 7}))
    head, body = data[:9], data[9:]
    body = body.replace(b'{"x":7}', b'{"x":' + digits(count) + b"}")
    forged = head[:5] + struct.pack(">I", zlib.crc32(body)) + body
    await storage.put_effect(WF, 0, "call", forged, in_doubt=False)  # type: ignore[attr-defined]
    with pytest.raises(CheckpointCorruptedError, match=f"int of {count} digits"):
        await manager.get_effects(WF, 0)


@pytest.mark.usefixtures("interpreter_limit")
def test_the_json_reader_refuses_long_ints_and_reads_shorter_ones_exactly() -> None:
    """The reader itself: every number kind keeps its value, a too-long int is refused."""
    longest = digits(MAX_INT_DIGITS, b"-")
    text = b'{"n":' + longest + b',"f":1.' + b"5" * 100_000 + b',"e":1e999999999}'
    value = loads(text)
    assert value["n"] == -number(MAX_INT_DIGITS)
    assert value["f"] == 1.5555555555555556 and value["e"] == float("inf")
    with pytest.raises(CheckpointCorruptedError, match=f"int of {MAX_INT_DIGITS + 1} digits"):
        loads(b"[1," + digits(MAX_INT_DIGITS + 1, b"-") + b"]")


# --- sets and maps whose items share a hash ------------------------------------------------

#: Ints that differ by a multiple of this hash alike.
MODULUS = 2**61 - 1


def alike(count: int) -> list[int]:
    """``count`` distinct ints of one hash value."""
    return [7 + k * MODULUS for k in range(count)]


async def test_writers_refuse_sets_and_maps_whose_items_share_a_hash(
    storage: CheckpointStorage,
) -> None:
    """A set, frozenset or non-str-keyed dict with more than MAX_SHARED_HASH items of one
    hash is refused naming its path; at the limit (and with tuples of them) it round-trips."""
    manager = CheckpointManager(storage)
    crowd = alike(MAX_SHARED_HASH + 1)
    refused = {
        "state.s": {"s": set(crowd)},
        "state.deep.f": {"deep": {"f": frozenset(crowd)}},
        "state.m": {"m": dict.fromkeys(crowd, 1)},
        "state.t[0]": {"t": [{(n,) for n in crowd}]},
    }
    for path, state in refused.items():
        with pytest.raises(CheckpointSerializationError, match="share one hash") as info:
            await manager.create_checkpoint(WF, 0, "a", "completed", state)
        assert info.value.path == path
    assert await manager.get_latest_checkpoint(WF) is None
    fits = alike(MAX_SHARED_HASH)
    state = {"s": set(fits) | set(range(100)), "m": dict.fromkeys(fits, 1), "t": tuple(crowd)}
    await manager.create_checkpoint(WF, 1, "a", "completed", state)
    assert (await manager.get_checkpoint(WF, 1)).state_snapshot.data == state


@pytest.mark.parametrize(
    "count", [MAX_SHARED_HASH + 1, pytest.param(200_000, marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("tag", ["$set", "$fset", "$map"])
async def test_a_record_holding_a_set_of_items_sharing_a_hash_is_corruption(
    storage: CheckpointStorage, tag: str, count: int
) -> None:
    """A checksum-valid record whose set (or map) holds ``count`` items of one hash is
    refused before the set is built (200,000 of them, a 6 MB record, would take many
    minutes to build); the resume point falls back to the step before."""
    manager = CheckpointManager(storage)
    await manager.create_checkpoint(WF, 0, "agent", "completed", {"n": 0})
    items: list[Any] = alike(count)
    if tag == "$map":
        items = [[n, 1] for n in items]
    crafted = json.dumps(body_of(1, {"x": {tag: items}}), separators=(",", ":"))
    await storage.save(WF, 1, record_v1_text(crafted.encode()))
    with pytest.raises(CheckpointCorruptedError, match=rf"state\.x: \{tag}: .*share one hash"):
        await manager.get_checkpoint(WF, 1)
    step, snapshot, _ = await manager.get_resume_point(WF)  # type: ignore[misc]
    assert (step, snapshot.data) == (1, {"n": 0})


async def test_an_effect_result_holding_a_set_of_items_sharing_a_hash_is_corruption(
    storage: CheckpointStorage,
) -> None:
    """An effect's stored result goes through the same reader."""
    manager = CheckpointManager(storage)
    now = datetime.now(timezone.utc)
    record = EffectRecord(WF, 0, "call", "tool", EffectState.IN_DOUBT, 1, now, "idem")
    data, _ = encode_effect(record.finished(EffectState.DONE, result={"x": 7}))
    head, body = data[:9], data[9:]
    crowd = json.dumps({"$set": alike(MAX_SHARED_HASH + 1)}, separators=(",", ":"))
    body = body.replace(b'{"x":7}', crowd.encode())
    forged = head[:5] + struct.pack(">I", zlib.crc32(body)) + body
    await storage.put_effect(WF, 0, "call", forged, in_doubt=False)  # type: ignore[attr-defined]
    with pytest.raises(CheckpointCorruptedError, match="share one hash"):
        await manager.get_effects(WF, 0)
