import asyncio
import logging
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from aiocheckpoint import (
    AgentStatus,
    CheckpointCorruptedError,
    CheckpointManager,
    CheckpointNotFoundError,
    CheckpointSerializationError,
    ExecutionMetrics,
    InMemoryCheckpointStorage,
    InvalidArgumentError,
    InvalidStepError,
    InvalidWorkflowIdError,
    SharedState,
    StateSnapshot,
    StorageClosedError,
)


@pytest.fixture
async def manager() -> Any:
    async with CheckpointManager() as m:
        yield m


async def _corrupt(manager: CheckpointManager, workflow_id: str, step: int) -> None:
    stored = await manager.storage.load(workflow_id, step)
    assert stored is not None
    await manager.storage.save(workflow_id, step, stored.data[:-5])


async def test_default_storage_is_in_memory() -> None:
    """Without a storage argument the manager keeps checkpoints in memory."""
    manager = CheckpointManager()
    assert isinstance(manager.storage, InMemoryCheckpointStorage)
    assert manager.max_checkpoints is None


async def test_create_returns_what_is_stored(manager: CheckpointManager) -> None:
    """create_checkpoint returns a Checkpoint equal to the one read back."""
    metrics = ExecutionMetrics(total_cost=1.5, total_tokens=10)
    made = await manager.create_checkpoint(
        "wf-123", 5, "researcher", AgentStatus.COMPLETED, {"k": 1}, metrics, {"note": "x"}
    )
    got = await manager.get_latest_checkpoint("wf-123")
    assert got == made
    assert got is not None
    assert (got.step, got.agent_id, got.status) == (5, "researcher", AgentStatus.COMPLETED)
    assert got.metrics.total_cost == 1.5
    assert got.metadata == {"note": "x"}
    assert got.timestamp.tzinfo is not None


async def test_state_is_copied_at_create(manager: CheckpointManager) -> None:
    """Changing the caller's state, metrics or metadata afterwards never alters the stored one."""
    state = {"list": [1]}
    metrics = ExecutionMetrics()
    meta = {"m": [1]}
    made = await manager.create_checkpoint("wf", 0, "a", "completed", state, metrics, meta)
    state["list"].append(2)
    metrics.total_steps = 9
    meta["m"].append(2)
    got = await manager.get_checkpoint("wf", 0)
    assert got.state_snapshot.data == {"list": [1]}
    assert got.metrics.total_steps == 0
    assert got.metadata == {"m": [1]}
    assert made.state_snapshot.data == {"list": [1]}


async def test_accepts_shared_state_and_snapshot(manager: CheckpointManager) -> None:
    """SharedState, StateSnapshot and dict states are all accepted; versions are kept."""
    shared = SharedState({"a": 1})
    shared.set("b", 2)
    await manager.create_checkpoint("wf", 0, "a", "completed", shared)
    snap = shared.snapshot(metadata={"source": "snap"})
    await manager.create_checkpoint("wf", 1, "a", "completed", snap)
    first = await manager.get_checkpoint("wf", 0)
    second = await manager.get_checkpoint("wf", 1)
    assert first.state_snapshot.data == {"a": 1, "b": 2}
    assert first.state_snapshot.version.version == 1
    assert second.state_snapshot.metadata == {"source": "snap"}
    with pytest.raises(InvalidArgumentError, match="state must be"):
        await manager.create_checkpoint("wf", 2, "a", "completed", [1, 2])  # type: ignore[arg-type]


async def test_rewriting_a_step_replaces_it(manager: CheckpointManager) -> None:
    """A retried step overwrites the earlier checkpoint of that step."""
    await manager.create_checkpoint("wf", 1, "a", AgentStatus.FAILED, {"try": 1})
    await manager.create_checkpoint("wf", 1, "a", AgentStatus.COMPLETED, {"try": 2})
    checkpoints = await manager.list_checkpoints("wf")
    assert [(c.step, c.status, c.state_snapshot.data) for c in checkpoints] == [
        (1, AgentStatus.COMPLETED, {"try": 2})
    ]


@pytest.mark.parametrize(
    "workflow_id", ["", "x" * 256, "日" * 86, "a\x00b", 5, None, b"bytes", "\ud800"]
)
async def test_invalid_workflow_ids(manager: CheckpointManager, workflow_id: Any) -> None:
    """Ids that are not non-empty str of <= 255 UTF-8 bytes without NUL are refused everywhere."""
    with pytest.raises(InvalidWorkflowIdError):
        await manager.create_checkpoint(workflow_id, 0, "a", "completed", {})
    with pytest.raises(InvalidWorkflowIdError):
        await manager.get_latest_checkpoint(workflow_id)
    with pytest.raises(InvalidWorkflowIdError):
        await manager.delete_checkpoints(workflow_id)
    with pytest.raises(ValueError, match="workflow id"):  # also a ValueError
        await manager.has_checkpoint(workflow_id)
    assert await manager.list_workflows() == []


@pytest.mark.parametrize("workflow_id", ["a/b", "a_b", "..", "../x", " spaced ", "wf:1", "日本語"])
async def test_odd_but_valid_ids_are_distinct(manager: CheckpointManager, workflow_id: str) -> None:
    """Unusual ids are valid and come back unchanged."""
    neighbour = "a/b" if workflow_id == "a_b" else "a_b"
    await manager.create_checkpoint(workflow_id, 0, "a", "completed", {"id": workflow_id})
    await manager.create_checkpoint(neighbour, 0, "a", "completed", {"id": neighbour})
    assert await manager.list_workflows() == sorted([workflow_id, neighbour])
    got = await manager.get_checkpoint(workflow_id, 0)
    assert got.state_snapshot.data == {"id": workflow_id}


@pytest.mark.parametrize("step", [-1, True, 1.0, "1", None, 2**63])
async def test_invalid_steps(manager: CheckpointManager, step: Any) -> None:
    """Steps must be ints in [0, 2**63); bool, float and str are refused."""
    with pytest.raises(InvalidStepError):
        await manager.create_checkpoint("wf", step, "a", "completed", {})
    assert await manager.list_workflows() == []


async def test_invalid_status_agent_and_metrics(manager: CheckpointManager) -> None:
    """Unknown statuses, non-str agents and wrong metrics types raise InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError, match="status must be one of"):
        await manager.create_checkpoint("wf", 0, "a", "done", {})
    with pytest.raises(InvalidArgumentError, match="agent_id"):
        await manager.create_checkpoint("wf", 0, 7, "completed", {})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="metrics"):
        await manager.create_checkpoint("wf", 0, "a", "completed", {}, {"cost": 1})  # type: ignore[arg-type]
    assert await manager.list_workflows() == []


async def test_unstorable_state_writes_nothing(manager: CheckpointManager) -> None:
    """A state that cannot be stored raises before anything is written; the old step stays."""
    await manager.create_checkpoint("wf", 0, "a", "completed", {"ok": True})
    with pytest.raises(CheckpointSerializationError, match=r"state\.plan\.items\[1\]"):
        await manager.create_checkpoint("wf", 0, "a", "failed", {"plan": {"items": [1, object()]}})
    with pytest.raises(CheckpointSerializationError, match=r"metadata\.x"):
        await manager.create_checkpoint("wf", 1, "a", "completed", {}, metadata={"x": object()})
    assert [c.step for c in await manager.list_checkpoints("wf")] == [0]
    assert (await manager.get_checkpoint("wf", 0)).state_snapshot.data == {"ok": True}


async def test_not_found_and_has(manager: CheckpointManager) -> None:
    """Missing steps raise CheckpointNotFoundError with the id and step; has_checkpoint answers."""
    with pytest.raises(CheckpointNotFoundError) as info:
        await manager.get_checkpoint("wf", 4)
    assert (info.value.workflow_id, info.value.step) == ("wf", 4)
    assert isinstance(info.value, LookupError)
    await manager.create_checkpoint("wf", 4, "a", "completed", {})
    assert await manager.has_checkpoint("wf")
    assert await manager.has_checkpoint("wf", 4)
    assert not await manager.has_checkpoint("wf", 5)


async def test_paging_and_iteration(manager: CheckpointManager) -> None:
    """list_checkpoints pages with limit/after/before; iter_checkpoints streams in pages."""
    for step in range(25):
        await manager.create_checkpoint("wf", step, "a", "completed", {"s": step})
    page = await manager.list_checkpoints("wf", limit=5, after=9)
    assert [c.step for c in page] == [10, 11, 12, 13, 14]
    newest = await manager.list_checkpoints("wf", limit=3, descending=True)
    assert [c.step for c in newest] == [24, 23, 22]
    assert [c.step async for c in manager.iter_checkpoints("wf", page_size=7)] == list(range(25))
    backwards = [
        c.step async for c in manager.iter_checkpoints("wf", page_size=10, descending=True)
    ]
    assert backwards == list(range(24, -1, -1))
    with pytest.raises(InvalidArgumentError):
        await manager.list_checkpoints("wf", limit=0)


async def test_delete(manager: CheckpointManager) -> None:
    """delete_checkpoints removes one step or the whole workflow."""
    for step in range(3):
        await manager.create_checkpoint("wf", step, "a", "completed", {})
    assert await manager.delete_checkpoints("wf", step=1)
    assert [c.step for c in await manager.list_checkpoints("wf")] == [0, 2]
    assert await manager.delete_checkpoints("wf")
    assert not await manager.delete_checkpoints("wf")
    assert await manager.list_workflows() == []


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (AgentStatus.COMPLETED, 6),
        (AgentStatus.FAILED, 5),
        (AgentStatus.RUNNING, 5),
        (AgentStatus.BLOCKED, 5),
        (AgentStatus.PENDING, 5),
    ],
)
async def test_resume_point(manager: CheckpointManager, status: AgentStatus, expected: int) -> None:
    """Resume at step+1 after COMPLETED, at the same step for every other status."""
    metrics = ExecutionMetrics(total_steps=5)
    await manager.create_checkpoint("wf", 5, "a", status, {"s": 5}, metrics)
    point = await manager.get_resume_point("wf")
    assert point is not None
    step, snapshot, got_metrics = point
    assert step == expected
    assert isinstance(snapshot, StateSnapshot)
    assert snapshot.data == {"s": 5}
    assert got_metrics.total_steps == 5


async def test_resume_point_falls_back_past_corruption(
    manager: CheckpointManager, caplog: pytest.LogCaptureFixture
) -> None:
    """A corrupted latest checkpoint is skipped for the newest that verifies, with a warning."""
    for step in range(3):
        await manager.create_checkpoint("wf", step, "a", "completed", {"s": step})
    await _corrupt(manager, "wf", 2)
    await _corrupt(manager, "wf", 1)
    with pytest.raises(CheckpointCorruptedError):
        await manager.get_latest_checkpoint("wf")
    with caplog.at_level(logging.WARNING, logger="aiocheckpoint"):
        point = await manager.get_resume_point("wf")
    assert point is not None
    assert point[0] == 1
    assert point[1].data == {"s": 0}
    assert "corrupted" in caplog.text
    assert "step 0" in caplog.text


async def test_resume_point_with_nothing_valid_raises(manager: CheckpointManager) -> None:
    """If no checkpoint verifies, get_resume_point raises rather than starting over silently."""
    for step in range(2):
        await manager.create_checkpoint("wf", step, "a", "completed", {})
        await _corrupt(manager, "wf", step)
    with pytest.raises(CheckpointCorruptedError):
        await manager.get_resume_point("wf")


async def test_max_checkpoints_validation() -> None:
    """max_checkpoints must be a positive int."""
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError):
            CheckpointManager(max_checkpoints=bad)  # type: ignore[arg-type]


async def test_closed_manager_refuses_use() -> None:
    """After close every call raises StorageClosedError; close is idempotent."""
    manager = CheckpointManager()
    async with manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", {})
    await manager.close()
    with pytest.raises(StorageClosedError):
        await manager.create_checkpoint("wf", 1, "a", "completed", {})
    with pytest.raises(StorageClosedError):
        await manager.get_resume_point("wf")
    with pytest.raises(StorageClosedError):
        await manager.list_workflows()


async def test_special_numbers_survive_the_fast_encoder(manager: CheckpointManager) -> None:
    """NaN, infinities and ints beyond 64 bits round-trip through create_checkpoint exactly."""
    import math

    state = {"nan": math.nan, "inf": [math.inf, -math.inf], "big": 2**64, "neg": -(2**70)}
    metrics = ExecutionMetrics(total_cost=math.nan)
    await manager.create_checkpoint("wf", 0, "a", "completed", state, metrics, {"m": math.inf})
    await manager.create_checkpoint("wf", 1, "a", "completed", {"x": None, "y": 1.5})
    got = await manager.get_checkpoint("wf", 0)
    data = got.state_snapshot.data
    assert math.isnan(data["nan"])
    assert data["inf"] == [math.inf, -math.inf]
    assert (data["big"], data["neg"]) == (2**64, -(2**70))
    assert math.isnan(got.metrics.total_cost)
    assert got.metadata == {"m": math.inf}
    plain = await manager.get_checkpoint("wf", 1)
    assert plain.state_snapshot.data == {"x": None, "y": 1.5}


async def test_returned_checkpoint_is_a_normal_model(manager: CheckpointManager) -> None:
    """The checkpoint built on the fast path equals the same data validated by pydantic."""
    from aiocheckpoint import Checkpoint

    shared = SharedState({"a": [1, {"b": None}]})
    shared.set("c", 2.5, agent_id="x")
    made = await manager.create_checkpoint(
        "wf", 0, "a", "completed", shared, ExecutionMetrics(total_tokens=3), {"m": 1}
    )
    again = Checkpoint.model_validate(made.model_dump())
    assert again == made
    assert made.model_dump() == again.model_dump()
    assert made.model_fields_set == again.model_fields_set
    assert made.state_snapshot.version.changed_fields == ["c"]


async def test_a_large_shared_state_is_copied_in_slices_as_of_the_call(
    manager: CheckpointManager,
) -> None:
    """A SharedState's tree is copied while other tasks run; their changes are not saved.

    The copy yields to the loop (the other task runs many times before the save returns),
    yet the checkpoint holds the data and version of the moment of the call.
    """
    state = SharedState({"docs": [{"id": i, "tags": ["a", "b"]} for i in range(20_000)]})
    state.set("n", 1)
    changes = 0

    async def meddle() -> None:
        nonlocal changes
        while not save.done():
            changes += 1
            state.set(f"docs_{changes}", changes)
            state.set("n", -changes)
            await asyncio.sleep(0)

    save = asyncio.ensure_future(manager.create_checkpoint("wf", 1, "a", "running", state))
    await asyncio.gather(save, meddle())
    assert changes > 1
    for checkpoint in (save.result(), await manager.get_checkpoint("wf", 1)):
        data = checkpoint.state_snapshot.data
        assert list(data) == ["docs", "n"] and data["n"] == 1 and len(data["docs"]) == 20_000
        assert checkpoint.state_snapshot.version.version == 1
    data["docs"][0]["tags"].append("c")  # the returned copy is the caller's own
    assert state.to_dict()["docs"][0]["tags"] == ["a", "b"]


async def test_split_memories_are_bounded_and_dropped_with_their_workflow(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manager keeps one split memory per recently saved workflow, within its bounds."""
    from aiocheckpoint.codec.tree import splitmemory as manager_module
    from aiocheckpoint.storage.file import FileCheckpointStorage

    monkeypatch.setattr(manager_module, "_MEMORY_WORKFLOWS", 3)
    big = {"docs": [{"id": i, "body": f"document {i} " * 40} for i in range(300)]}
    async with CheckpointManager(FileCheckpointStorage(tmp_path)) as manager:
        for n in range(5):
            await manager.create_checkpoint(f"wf{n}", 0, "a", "running", big)
        cache = manager._codec.memory
        memories = cache.entries
        assert list(memories) == ["wf2", "wf3", "wf4"]  # least recently saved dropped
        assert all(len(memory) > 0 for memory in memories.values())
        await manager.create_checkpoint("wf2", 1, "a", "running", big)
        assert list(memories) == ["wf3", "wf4", "wf2"]
        assert await manager.delete_checkpoints("wf4")
        assert list(memories) == ["wf3", "wf2"]
        await manager.delete_checkpoints("wf3", 0)  # deleting a step keeps the memory
        assert list(memories) == ["wf3", "wf2"]
        one = len(memories["wf2"])
        monkeypatch.setattr(manager_module, "_MEMORY_ENTRIES", one + 1)
        await manager.create_checkpoint("wf1", 1, "a", "running", big)
        assert list(memories) == ["wf1"]  # two would not fit
        assert cache.size == one
        # A small state (stored whole in its record) leaves the memory as it was.
        await manager.create_checkpoint("wf1", 2, "a", "running", {"n": 1})
        assert list(memories) == ["wf1"]


async def test_large_version_1_records_are_decoded_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large record is parsed in a worker thread, a small one on the loop (no hop)."""
    import threading

    from aiocheckpoint.codec import reading as manager_module

    threads: list[bool] = []
    decode = manager_module.decode_checkpoint

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return decode(*args, **kwargs)

    monkeypatch.setattr(manager_module, "decode_checkpoint", recording)
    big = {"text": "x" * (manager_module._DECODE_ON_LOOP + 1)}
    async with CheckpointManager(incremental=False) as manager:  # version-1 records only
        await manager.create_checkpoint("wf", 0, "a", "running", {"n": 1})
        await manager.create_checkpoint("wf", 1, "a", "running", big)
        assert (await manager.get_checkpoint("wf", 0)).state_snapshot.data == {"n": 1}
        assert (await manager.get_checkpoint("wf", 1)).state_snapshot.data == big
    assert threading.current_thread() is threading.main_thread()
    assert threads == [True, False]


@pytest.mark.parametrize(
    ("metrics", "metadata", "app_version"),
    [
        (None, None, None),
        (ExecutionMetrics(total_tokens=3, start_time=datetime(2026, 1, 2, 3, 4, 5)), {"m": 1}, "7"),
        (
            ExecutionMetrics(start_time=datetime(2026, 1, 2, tzinfo=timezone(timedelta(hours=2)))),
            {},
            None,
        ),
    ],
)
async def test_a_plain_state_is_stored_as_its_built_checkpoint_encodes(
    metrics: ExecutionMetrics | None, metadata: dict[str, Any] | None, app_version: str | None
) -> None:
    """The record of a plain dict (encoded without models) is byte for byte the built one's.

    The returned checkpoint, built only once stored, equals what pydantic validates from it.
    """
    from aiocheckpoint import Checkpoint
    from aiocheckpoint.codec.v1 import encode_checkpoint

    state = {"a": [1, {"b": None}], "c": "text", "d": 2.5}
    async with CheckpointManager(app_version=app_version) as manager:
        made = await manager.create_checkpoint("wf", 3, "a", "running", state, metrics, metadata)
        stored = await manager.storage.load("wf", 3)
    assert stored is not None
    assert stored.data == encode_checkpoint(made, finite=True)
    again = Checkpoint.model_validate(made.model_dump())
    assert again == made
    for model, validated in (
        (made, again),
        (made.state_snapshot, again.state_snapshot),
        (made.state_snapshot.version, again.state_snapshot.version),
    ):
        assert model.model_fields_set == validated.model_fields_set
    # As ExecutionMetrics() leaves it (nothing set), or a copy of the caller's (every field).
    fields_set = set() if metrics is None else set(ExecutionMetrics.model_fields)
    assert made.metrics.model_fields_set == fields_set
    assert made.app_version == app_version


async def test_a_save_keeps_none_of_the_callers_objects_while_it_is_stored(tmp_path: Any) -> None:
    """While a write waits for the store, the library holds copies, not the caller's objects.

    A plain dict (its refcount: nothing of ours refers to it), a tagged value in it (a set;
    the returned checkpoint holds an equal one) and a dict subclass (another code path) die
    once the caller drops them, before the save returns.
    """
    import sys
    import weakref

    from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage

    class Held(dict[str, Any]):
        pass

    async with CheckpointManager(SQLiteCheckpointStorage(tmp_path / "s.db")) as manager:
        plain = {"a": [1, 2], "b": "x"}
        counts = sys.getrefcount(plain), sys.getrefcount(plain["a"])
        tagged = {1, 2}
        subclass = Held(a=[3])
        refs = weakref.ref(tagged), weakref.ref(subclass)
        metrics = ExecutionMetrics(total_tokens=1)
        saves = [
            asyncio.create_task(manager.create_checkpoint("wf", 0, "a", "running", plain)),
            asyncio.create_task(
                manager.create_checkpoint("wf", 1, "a", "running", {"t": tagged}, metrics)
            ),
            asyncio.create_task(manager.create_checkpoint("wf", 2, "a", "running", subclass)),
        ]
        await asyncio.sleep(0)  # each save runs up to its wait for the writer thread
        del tagged, subclass
        assert not any(save.done() for save in saves)  # else this test would prove nothing
        assert (sys.getrefcount(plain), sys.getrefcount(plain["a"])) == counts
        assert [ref() for ref in refs] == [None, None]
        made = await asyncio.gather(*saves)
    assert [m.state_snapshot.data for m in made] == [plain, {"t": {1, 2}}, {"a": [3]}]
    assert made[1].metrics == metrics
