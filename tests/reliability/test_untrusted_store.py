"""An untrusted store: crafted records execute nothing, and oversized ones are refused."""

from __future__ import annotations

import base64
import json
import pickle
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointError,
    CheckpointManager,
    CheckpointStorage,
)
from aiocheckpoint.format.header import HEADER_SIZE

from ._support import dump_store, record
from .conftest import Backend

WF = "target"


class _Bait:
    """Unpickling this creates the marker file: proof that a pickle was executed."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.marker, "w"))


def _baits(marker: Path) -> dict[str, Any]:
    payload = pickle.dumps(_Bait(marker))
    call = f"__import__('builtins').open({str(marker)!r}, 'w')"
    return {
        "__reduce__": [call, [str(marker), "w"]],
        "pickle_b64": base64.b64encode(payload).decode(),
        "pickle_latin1": payload.decode("latin-1"),
        "yaml": f"!!python/object/apply:builtins.open [{str(marker)!r}, w]",
        "jsonpickle": {
            "py/reduce": [{"py/function": "builtins.open"}, {"py/tuple": [str(marker)]}]
        },
        "__class__": "builtins.open",
        "$type": "System.IO.File, mscorlib",
        "eval": call,
        "template": "{{ self.__init__.__globals__ }}",
        "__proto__": {"polluted": True},
    }


async def _crafted(manager: CheckpointManager, storage: CheckpointStorage, bait: Any) -> bytes:
    """A checksum-valid record whose state, metadata and agent id carry ``bait``."""
    await manager.create_checkpoint(WF, 1, "agent", "completed", {"x": 1})
    stored = await storage.load(WF, 1)
    assert stored is not None
    body = json.loads(stored.data[HEADER_SIZE:])
    body["state"]["data"] = bait
    body["metadata"] = bait
    body["state"]["metadata"] = bait
    body["agent_id"] = bait["eval"]
    return record(json.dumps(body).encode())


def test_the_pickle_bait_is_live(tmp_path: Path) -> None:
    """Control: unpickling the bait really creates the marker, so its absence below means
    something."""
    marker = tmp_path / "control"
    pickle.loads(pickle.dumps(_Bait(marker)))
    assert marker.exists()


async def test_pickle_and_eval_bait_loads_as_plain_data(
    manager: CheckpointManager, storage: CheckpointStorage, tmp_path: Path
) -> None:
    """A crafted record full of pickle, YAML, jsonpickle and eval bait loads as the plain strings
    and dicts it holds."""
    marker = tmp_path / "pwned"
    bait = _baits(marker)
    await storage.save(WF, 1, await _crafted(manager, storage, bait))
    checkpoint = await manager.get_checkpoint(WF, 1)
    assert checkpoint.state_snapshot.data == bait
    assert checkpoint.state_snapshot.metadata == bait
    assert checkpoint.metadata == bait
    assert checkpoint.agent_id == bait["eval"]
    point = await manager.get_resume_point(WF)
    assert point is not None
    assert point[1].data == bait
    assert not marker.exists()


@pytest.mark.parametrize("framed", [False, True], ids=["bare", "with-valid-header"])
async def test_a_pickle_stored_as_a_record_is_refused_unexecuted(
    manager: CheckpointManager, storage: CheckpointStorage, tmp_path: Path, framed: bool
) -> None:
    """A pickle stored in place of a record, bare or behind a valid header, raises
    CheckpointCorruptedError and runs nothing."""
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Bait(marker))
    await storage.save(WF, 1, record(payload) if framed else payload)
    with pytest.raises(CheckpointCorruptedError):
        await manager.get_checkpoint(WF, 1)
    with pytest.raises(CheckpointCorruptedError):
        await manager.get_resume_point(WF)
    assert not marker.exists()


@pytest.mark.parametrize("claimed", [2**31, 2**40, 2**62, 2**64 - 1])
async def test_a_header_claiming_a_huge_body_is_refused_without_allocating_it(
    manager: CheckpointManager, storage: CheckpointStorage, claimed: int
) -> None:
    """A header announcing a giant body raises CheckpointCorruptedError while reading allocates
    under 4 MB.
    """
    await storage.save(WF, 1, record(b'{"a": 1}', length=claimed))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointCorruptedError):
            await manager.get_checkpoint(WF, 1)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024


LIMIT = 64 * 1024


async def test_records_above_max_record_bytes_are_refused_on_write(
    backend: Backend, tmp_path: Path
) -> None:
    """With max_record_bytes set, a larger record raises a CheckpointError and nothing is stored."""
    async with backend.open(tmp_path, max_record_bytes=LIMIT) as storage:
        # Whole records: an incremental store would cut this state into small blobs instead.
        manager = CheckpointManager(storage, incremental=False)
        await manager.create_checkpoint(WF, 1, "agent", "completed", {"small": "x" * 100})
        before = await dump_store(storage)
        with pytest.raises(CheckpointError):
            await manager.create_checkpoint(WF, 2, "agent", "completed", {"big": "x" * LIMIT})
        with pytest.raises(CheckpointError):
            await storage.save(WF, 1, b"\x00" * (LIMIT + 1))
        assert await dump_store(storage) == before
        assert (await manager.get_checkpoint(WF, 1)).state_snapshot.data == {"small": "x" * 100}


async def test_records_above_max_record_bytes_are_refused_on_read(
    durable_backend: Backend, tmp_path: Path
) -> None:
    """A stored record larger than the reader's max_record_bytes raises a CheckpointError instead
    of being read.
    """
    async with durable_backend.open(tmp_path) as storage:
        await CheckpointManager(storage).create_checkpoint(
            WF, 1, "agent", "completed", {"big": "x" * (4 * LIMIT)}
        )
    async with durable_backend.open(tmp_path, max_record_bytes=LIMIT) as storage:
        with pytest.raises(CheckpointError):
            await CheckpointManager(storage).get_checkpoint(WF, 1)
