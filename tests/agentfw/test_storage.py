"""``AioCheckpointStorage`` against the ``CheckpointStorage`` protocol's documented behaviour.

On every backend, plain and encrypted: ``save`` stores a copy and returns its id; ``load``
returns a copy, and raises ``WorkflowCheckpointException`` for an unknown id (also from a
new storage object, which must find it in the store); ``list_checkpoints`` and
``list_checkpoint_ids`` give one workflow name's checkpoints in the order saved;
``get_latest`` the last saved; ``delete`` says whether it existed. Typed values come back
as themselves; what cannot be stored without pickle is refused before anything is written;
a changed record is refused before it is decoded.
"""

from __future__ import annotations

import dataclasses
import decimal
import uuid
from collections.abc import AsyncIterator
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from agent_framework import (
    Message,
    WorkflowBuilder,
    WorkflowCheckpoint,
    WorkflowContext,
    WorkflowEvent,
    WorkflowMessage,
    executor,
)
from agent_framework.exceptions import WorkflowCheckpointException

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    CheckpointSerializationError,
    DecryptionError,
    InvalidArgumentError,
    TaggedValue,
    TypeRegistry,
    TypeVersionError,
    UnknownTypeError,
)
from aiocheckpoint.integrations.agent_framework import AioCheckpointStorage
from tests.backend_support import make_storage
from tests.integrations.managers import keyring

from .workflows import COUNTER, START, Order, build_counter, registry


def checkpoint(name: str, previous: str | None = None, **state: object) -> WorkflowCheckpoint:
    return WorkflowCheckpoint(
        workflow_name=name, graph_signature_hash="h", previous_checkpoint_id=previous, state=state
    )


async def test_save_load_round_trip_and_copies(manager: CheckpointManager) -> None:
    storage = AioCheckpointStorage(manager)
    original = checkpoint("w", n=1, nested={"a": [1, 2]})
    original.metadata = {"superstep": 3}
    original.iteration_count = 7
    assert await storage.save(original) == original.checkpoint_id
    original.state["n"] = 2
    loaded = await storage.load(original.checkpoint_id)
    assert loaded.state == {"n": 1, "nested": {"a": [1, 2]}}
    assert loaded.to_dict() | {"state": {}} == original.to_dict() | {"state": {}}
    loaded.state["n"] = 3
    assert (await storage.load(original.checkpoint_id)).state["n"] == 1


async def test_typed_values_and_framework_messages_come_back_as_themselves(
    manager: CheckpointManager,
) -> None:
    storage = AioCheckpointStorage(manager)
    order = Order("o1", 2, ("a", "b"), START)
    request = WorkflowEvent.request_info("r1", "ask", order, str)
    message = WorkflowMessage(data=order, source_id="intake", target_id="price")
    state: dict[str, Any] = {
        "at": START,
        "naive": datetime(2026, 1, 2, 3, 4, 5),
        "day": date(2026, 1, 2),
        "wait": timedelta(minutes=5),
        "id": uuid.UUID(int=7),
        "price": decimal.Decimal("19.90"),
        "blob": b"\x00\xff",
        "pair": ("a", 1),
        "seen": {1, 2},
        "frozen": frozenset({"x"}),
        "by_id": {1: "one", (2, 3): "pair"},
        "dollar": {"$dt": "not a date"},
        "order": order,
        "buffered": {"price": [message]},
    }
    cp = checkpoint("w", **state)
    cp.messages = {"intake": [message, WorkflowMessage(data=("t", 1), source_id="intake")]}
    cp.pending_request_info_events = {"r1": request}
    await storage.save(cp)
    loaded = await AioCheckpointStorage(manager).load(cp.checkpoint_id)
    assert loaded.state == state
    assert all(type(loaded.state[k]) is type(v) for k, v in state.items())
    assert loaded.messages == cp.messages
    event = loaded.pending_request_info_events["r1"]
    assert (event.type, event.request_id, event.source_executor_id) == ("request_info", "r1", "ask")
    assert (event.data, event.request_type, event.response_type) == (order, Order, str)
    assert event.origin == request.origin


async def test_unknown_ids_are_reported(manager: CheckpointManager) -> None:
    storage = AioCheckpointStorage(manager)
    with pytest.raises(WorkflowCheckpointException):
        await storage.load("nope")
    assert not await storage.delete("nope")
    assert await storage.get_latest(workflow_name="w") is None
    assert await storage.list_checkpoints(workflow_name="w") == []
    assert await storage.list_checkpoint_ids(workflow_name="w") == []
    with pytest.raises(InvalidArgumentError):
        await storage.load("")
    with pytest.raises(InvalidArgumentError):
        await storage.list_checkpoints(workflow_name="")


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
    assert [cp.state for cp in listed] == [{"n": n} for n in range(4)]
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


async def test_another_prefix_is_another_namespace(manager: CheckpointManager) -> None:
    cp = checkpoint("w", n=1)
    await AioCheckpointStorage(manager, prefix="a/").save(cp)
    other = AioCheckpointStorage(manager, prefix="b/")
    assert await other.list_checkpoint_ids(workflow_name="w") == []
    with pytest.raises(WorkflowCheckpointException):
        await other.load(cp.checkpoint_id)


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


@dataclasses.dataclass
class Unregistered:
    x: int


class Plain:
    pass


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("state", Plain(), "Plain is not a registered type"),
        ("state", Unregistered(1), "Unregistered is not a registered type"),
        ("state", Message("user", ["hi"]), "would need pickle"),
        ("state", {"deep": [WorkflowMessage(data=Plain(), source_id="s")]}, "Plain"),
        ("state", TaggedValue("aiocheckpoint.agent_framework.WorkflowMessage", 1, {}), "reserved"),
        (
            "messages",
            {"s": [WorkflowMessage(data=Message("user", ["x"]), source_id="s")]},
            "pickle",
        ),
        (
            "events",
            WorkflowEvent.request_info("r", "s", "text", Unregistered),
            "neither a standard",
        ),
        ("events", WorkflowEvent.request_info("r", "s", Unregistered(1), str), "Unregistered"),
        ("events", WorkflowEvent.request_info("r", "s", "text", list[str]), "neither"),
        ("events", WorkflowEvent("superstep_started", iteration=1), "only request_info"),
    ],
)
async def test_what_needs_pickle_is_refused_before_anything_is_written(
    manager: CheckpointManager, where: str, value: Any, says: str
) -> None:
    storage = AioCheckpointStorage(manager)
    cp = checkpoint("w")
    if where == "state":
        cp.state = {"bad": value}
    elif where == "messages":
        cp.messages = value
    else:
        cp.pending_request_info_events = {"r": value}
    with pytest.raises(CheckpointSerializationError, match=says) as raised:
        await storage.save(cp)
    assert raised.value.path.startswith("checkpoint.")
    assert await storage.list_checkpoints(workflow_name="w") == []
    assert await manager.list_workflows() == []
    if manager.supports_workflow_records():  # no record was made for the refused save
        assert await manager.get_workflow(storage.workflow_id("w")) is None


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("timestamp", START, "checkpoint.timestamp"),
        ("iteration_count", "1", "checkpoint.iteration_count"),
        ("previous_checkpoint_id", 5, "checkpoint.previous_checkpoint_id"),
        ("graph_signature_hash", None, "checkpoint.graph_signature_hash"),
        ("messages", {"s": [WorkflowMessage(data=1, source_id=2)]}, "checkpoint.messages.s[0]"),
    ],
)
async def test_a_field_the_reader_would_refuse_is_refused_at_save(
    manager: CheckpointManager, field: str, value: Any, path: str
) -> None:
    storage = AioCheckpointStorage(manager)
    cp = checkpoint("w")
    setattr(cp, field, value)
    with pytest.raises(CheckpointSerializationError) as raised:
        await storage.save(cp)
    assert raised.value.path.startswith(path)
    assert await manager.list_workflows() == []


async def test_the_runner_goes_on_when_a_checkpoint_is_refused(
    manager: CheckpointManager, caplog: pytest.LogCaptureFixture
) -> None:
    """The framework logs a refused save and runs on (docs/agent-framework.md): the
    checkpoints taken while the state held an unstorable object are missing, the others
    are kept and chained to the last one saved."""

    @executor(id="step")
    async def step(n: int, ctx: WorkflowContext[int, int]) -> None:
        ctx.set_state("held", Plain() if n == 2 else n)
        if n < 4:
            await ctx.send_message(n + 1)
        else:
            await ctx.yield_output(n)

    @executor(id="echo")
    async def echo(n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)

    storage = AioCheckpointStorage(manager)
    workflow = (
        WorkflowBuilder(name="refusing", start_executor=step, checkpoint_storage=storage)
        .add_edge(step, echo)
        .add_edge(echo, step)
        .build()
    )
    result = await workflow.run(1)
    assert list(result.get_outputs()) == [4]
    assert "is not a registered type" in caplog.text
    kept = await storage.list_checkpoints(workflow_name="refusing")
    held = [cp.state.get("held") for cp in kept]
    assert 1 in held and 3 in held and 4 in held
    assert all(isinstance(value, int) or value is None for value in held)
    assert [cp.previous_checkpoint_id for cp in kept[1:]] == [cp.checkpoint_id for cp in kept[:-1]]


async def test_a_registry_may_not_use_the_reserved_names(manager: CheckpointManager) -> None:
    types = TypeRegistry()
    types.register(Unregistered, name="aiocheckpoint.agent_framework.Mine")
    with pytest.raises(InvalidArgumentError, match="reserves"):
        AioCheckpointStorage(CheckpointManager(manager.storage, types=types))
    with pytest.raises(InvalidArgumentError):
        AioCheckpointStorage(object())  # type: ignore[arg-type]


async def test_a_reader_without_the_registered_class_is_refused(
    backend: str, tmp_path: Path, pg_schema: str
) -> None:
    cp = checkpoint("w", order=Order("o", 0, (), START))
    async with make_storage(backend, tmp_path, pg_schema) as store:
        await AioCheckpointStorage(CheckpointManager(store, types=registry())).save(cp)
        bare = AioCheckpointStorage(CheckpointManager(store))
        with pytest.raises(UnknownTypeError) as raised:
            await bare.load(cp.checkpoint_id)
        assert raised.value.type_name == "tests.Order"


async def test_a_changed_record_is_refused_before_decoding(
    manager: CheckpointManager, sealed: bool
) -> None:
    storage = AioCheckpointStorage(manager)
    cp = checkpoint("w", n=1)
    await storage.save(cp)
    workflow_id = storage.workflow_id("w")
    stored = await manager.storage.load(workflow_id, 0)
    assert stored is not None
    if not sealed:
        assert b"__pickled__" not in stored.data and b"__type__" not in stored.data
    data = bytearray(stored.data)
    data[len(data) // 2] ^= 0x01
    await manager.storage.save(workflow_id, 0, bytes(data))
    for reader in (storage, AioCheckpointStorage(manager)):
        with pytest.raises(CheckpointCorruptedError) as raised:
            await reader.load(cp.checkpoint_id)
        assert isinstance(raised.value, DecryptionError) == sealed
    with pytest.raises(CheckpointCorruptedError):
        await storage.get_latest(workflow_name="w")


async def test_the_runner_refuses_to_resume_from_a_changed_record(
    manager: CheckpointManager, sealed: bool
) -> None:
    storage = AioCheckpointStorage(manager)
    await build_counter(storage).run(1)
    ids = await storage.list_checkpoint_ids(workflow_name=COUNTER)
    workflow_id = storage.workflow_id(COUNTER)
    stored = await manager.storage.load(workflow_id, 2)
    assert stored is not None
    data = bytearray(stored.data)
    data[-3] ^= 0x20
    await manager.storage.save(workflow_id, 2, bytes(data))
    with pytest.raises(WorkflowCheckpointException) as raised:
        await build_counter(storage).run(checkpoint_id=ids[2])
    assert isinstance(raised.value.__cause__, CheckpointCorruptedError)
    assert isinstance(raised.value.__cause__, DecryptionError) == sealed
    # The checkpoints around it still resume.
    result = await build_counter(AioCheckpointStorage(manager)).run(checkpoint_id=ids[3])
    assert list(result.get_outputs()) == ["total=10 seen=(1, 2, 3, 4)"]


def test_the_integration_imports_no_pickle_nor_the_framework_encoding() -> None:
    import aiocheckpoint.integrations.agent_framework as package

    for source in Path(package.__file__).parent.glob("*.py"):
        text = source.read_text(encoding="utf-8")
        assert "import pickle" not in text and "_checkpoint_encoding" not in text, source


CorruptedError = CheckpointCorruptedError


@pytest.fixture(params=[("memory", False), ("sqlite", True)], ids=["memory", "sqlite-sealed"])
async def two_managers(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[CheckpointManager]:
    """The record's shape does not depend on the backend: two of them, one encrypting."""
    backend, sealed = request.param
    storage = make_storage(backend, tmp_path, "unused")
    keys = keyring() if sealed else None
    async with storage, CheckpointManager(storage, encryption=keys) as manager:
        yield manager


MESSAGE = "aiocheckpoint.agent_framework.WorkflowMessage"
REQUEST = "aiocheckpoint.agent_framework.RequestInfoEvent"
GOOD_MESSAGE = {
    "data": "text",
    "source_id": "s",
    "target_id": None,
    "type": "standard",
    "trace_contexts": None,
    "source_span_ids": None,
    "original_request_info_event": None,
}
GOOD_EVENT = {
    "data": "text",
    "origin": "EXECUTOR",
    "request_id": "r",
    "source_executor_id": "s",
    "request_type": ["standard", "builtins.str"],
    "response_type": ["standard", "builtins.str"],
    "executor_id": None,
    "iteration": None,
}


@pytest.mark.parametrize(
    ("state", "error"),
    [
        ({"format": 2}, CheckpointCorruptedError),
        ({"iteration_count": "7"}, CheckpointCorruptedError),
        ({"previous_checkpoint_id": 5}, CheckpointCorruptedError),
        ({"state": []}, CheckpointCorruptedError),
        (
            {"messages": {"s": [TaggedValue(MESSAGE, 1, {"source_id": 1})]}},
            CheckpointCorruptedError,
        ),
        ({"messages": {"s": [TaggedValue(MESSAGE, 1, [])]}}, CorruptedError),
        ({"messages": {"s": [TaggedValue(MESSAGE, 1, GOOD_MESSAGE | {"x": 1})]}}, CorruptedError),
        (
            {"messages": {"s": [TaggedValue(MESSAGE, 1, GOOD_MESSAGE | {"source_id": 3})]}},
            CorruptedError,
        ),
        (
            {"messages": {"s": [TaggedValue(MESSAGE, 1, GOOD_MESSAGE | {"type": "odd"})]}},
            CheckpointCorruptedError,
        ),
        ({"state": {"x": TaggedValue(MESSAGE, 2, {})}}, TypeVersionError),
        ({"state": {"x": TaggedValue("os.system", 1, "echo")}}, UnknownTypeError),
        (
            {
                "pending_request_info_events": {
                    "r": TaggedValue(
                        REQUEST, 1, GOOD_EVENT | {"request_type": ["standard", "os.system"]}
                    )
                }
            },
            UnknownTypeError,
        ),
        (
            {
                "pending_request_info_events": {
                    "r": TaggedValue(
                        REQUEST, 1, GOOD_EVENT | {"request_type": ["standard", "builtins.int"]}
                    )
                }
            },
            CheckpointCorruptedError,
        ),
        (
            {
                "pending_request_info_events": {
                    "r": TaggedValue(REQUEST, 1, GOOD_EVENT | {"origin": "ELSEWHERE"})
                }
            },
            CheckpointCorruptedError,
        ),
    ],
)
async def test_a_record_of_the_wrong_shape_is_refused(
    two_managers: CheckpointManager, state: dict[str, Any], error: type[Exception]
) -> None:
    """A record written by something other than this storage (with the store's own seal)
    is refused with a typed error, nothing constructed but the framework's fixed classes."""
    manager = two_managers
    storage = AioCheckpointStorage(manager)
    cp = checkpoint("w", n=1)
    await storage.save(cp)
    record = await manager.get_checkpoint(storage.workflow_id("w"), 0, raw=True)
    forged = dict(record.state_snapshot.data) | state
    await manager.create_checkpoint(
        storage.workflow_id("w"), 0, "x", "completed", forged, metadata=record.metadata
    )
    with pytest.raises(error):
        await AioCheckpointStorage(manager).load(cp.checkpoint_id)
    good = dict(record.state_snapshot.data) | {
        "messages": {"s": [TaggedValue(MESSAGE, 1, GOOD_MESSAGE)]},
        "pending_request_info_events": {"r": TaggedValue(REQUEST, 1, GOOD_EVENT)},
    }
    await manager.create_checkpoint(
        storage.workflow_id("w"), 0, "x", "completed", good, metadata=record.metadata
    )
    loaded = await storage.load(cp.checkpoint_id)
    assert loaded.messages == {"s": [WorkflowMessage(data="text", source_id="s")]}
    event = loaded.pending_request_info_events["r"]
    assert (event.data, event.request_type, event.response_type) == ("text", str, str)


async def test_a_record_under_another_id_is_refused(manager: CheckpointManager) -> None:
    storage = AioCheckpointStorage(manager)
    cp = checkpoint("w", n=1)
    await storage.save(cp)
    record = await manager.get_checkpoint(storage.workflow_id("w"), 0, raw=True)
    await manager.create_checkpoint(
        storage.workflow_id("w"),
        0,
        "x",
        "completed",
        record.state_snapshot.data,
        metadata={"checkpoint_id": "other"},
    )
    with pytest.raises(CheckpointCorruptedError):
        await AioCheckpointStorage(manager).list_checkpoints(workflow_name="w")
