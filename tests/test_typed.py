"""Typed state: standard and registered types round-trip as themselves, on every backend."""

from __future__ import annotations

import asyncio
import dataclasses
import decimal
import enum
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from datetime import time as dt_time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from pydantic import BaseModel, field_validator

from aiocheckpoint import (
    CheckpointCorruptedError,
    CheckpointManager,
    CheckpointSerializationError,
    CheckpointTypeError,
    InMemoryCheckpointStorage,
    InvalidArgumentError,
    ResumableWorkflow,
    TaggedValue,
    TypeRegistry,
    TypeVersionError,
    UnknownTypeError,
    open_storage,
)
from aiocheckpoint.codec.copy import to_storable
from aiocheckpoint.codec.v1 import encode_checkpoint
from aiocheckpoint.models import Checkpoint, StateSnapshot
from tests.pg_support import DSN, drop_schema, new_schema_name
from tests.typed_values import same, states

MOMENT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=5, minutes=30)))


class Role(enum.Enum):
    USER = "user"
    TOOL = "tool"


class Message(BaseModel):
    role: Role
    text: str
    at: datetime
    payload: bytes = b""
    tags: frozenset[str] = frozenset()


@dataclasses.dataclass
class Plan:
    steps: tuple[str, ...]
    due: datetime
    done: set[int] = dataclasses.field(default_factory=set)


def registry() -> TypeRegistry:
    types = TypeRegistry()
    types.register(Message, name="Message")
    types.register(Role, name="Role")
    types.register(Plan, name="Plan")
    return types


def rich_state() -> dict[str, Any]:
    return {
        "message": Message(role=Role.TOOL, text="hi", at=MOMENT, payload=b"\x00\xff"),
        "history": [Message(role=Role.USER, text=str(i), at=MOMENT) for i in range(3)],
        "plan": Plan(steps=("a", "b"), due=MOMENT, done={1, 2}),
        "role": Role.USER,
        "naive": datetime(2020, 2, 29, 23, 59, 59, 999999),
        "amount": decimal.Decimal("-1.2300"),
        "id": uuid.UUID(int=7),
        "key": {(1, "a"): b"x", 2: frozenset({3})},
        "tag-like": {"$dt": "not a date"},
    }


BACKENDS = ["memory", "file", "sqlite", "postgres"]


async def _fresh_url(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a fresh store of ``kind`` (memory: the empty string)."""
    if kind == "postgres":
        schema = new_schema_name()
        yield f"{DSN}?schema={schema}"
        await drop_schema(schema)
        return
    urls = {"memory": "", "file": f"file:{tmp_path}/files", "sqlite": f"sqlite:{tmp_path}/c.db"}
    yield urls[kind]


@pytest.fixture(params=BACKENDS)
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh store of each backend."""
    async for url in _fresh_url(request.param, tmp_path):
        yield url


def _manager(url: str, memory: InMemoryCheckpointStorage, **options: Any) -> CheckpointManager:
    storage = memory if not url else open_storage(url)
    return CheckpointManager(storage, **options)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(state=states)
async def test_random_values_round_trip_exactly_on_every_backend(
    store_url: str, state: dict[str, Any]
) -> None:
    """Random nested standard values come back with their types and values, metadata too."""
    memory = InMemoryCheckpointStorage()
    manager = _manager(store_url, memory)
    try:
        await manager.create_checkpoint("wf", 0, "a", "completed", state, metadata={"m": state})
        back = await manager.get_checkpoint("wf", 0)
    finally:
        await manager.close()
    assert same(state, back.state_snapshot.data)
    assert same({"m": state}, back.metadata)


@pytest.fixture(params=["file", "sqlite", "postgres"])
async def tree_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh store of each backend that keeps blobs (incremental checkpoints)."""
    async for url in _fresh_url(request.param, tmp_path):
        yield url


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(state=states)
async def test_random_values_round_trip_through_the_incremental_format(
    tree_url: str, state: dict[str, Any]
) -> None:
    """A state over the inline limit goes into a tree of blobs and still comes back exactly."""
    padded = {"pad": ["x" * 100] * 200, "typed": state}
    storage = open_storage(tree_url)
    async with CheckpointManager(storage, incremental=True) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", padded)
        stored = await storage.load("wf", 0)
        assert stored is not None and stored.data[4] == 2  # a version-2 record
        back = await manager.get_checkpoint("wf", 0)
    assert same(padded, back.state_snapshot.data)


@pytest.mark.parametrize("micros", [1, -1, 999_999, -999_999])
async def test_offsets_of_under_a_second_round_trip(store_url: str, micros: int) -> None:
    """A datetime or time whose UTC offset is a fraction of a second keeps it (Python
    3.11's fromisoformat reads ``+00:00:00.000001`` as UTC)."""
    zone = timezone(timedelta(microseconds=micros))
    state = {"at": datetime(2020, 1, 1, 12, tzinfo=zone), "t": dt_time(1, 2, 3, tzinfo=zone)}
    async with _manager(store_url, InMemoryCheckpointStorage()) as manager:
        await manager.create_checkpoint("wf", 0, "a", "running", state)
        back = await manager.get_checkpoint("wf", 0)
    assert same(state, back.state_snapshot.data)


async def test_registered_types_round_trip_on_every_backend(store_url: str) -> None:
    """Models, dataclasses and enums come back as instances of their classes; resume too."""
    memory = InMemoryCheckpointStorage()
    state = rich_state()
    async with _manager(store_url, memory, types=registry(), app_version="2026.12.1") as manager:
        returned = await manager.create_checkpoint("wf", 0, "a", "running", state)
        assert returned.state_snapshot.data == state
        point = await manager.get_resume_point("wf")
    assert point is not None
    step, snapshot, _ = point
    assert (step, point.app_version) == (0, "2026.12.1")
    assert snapshot.data == state
    assert type(snapshot.data["history"][0]) is Message
    assert type(snapshot.data["plan"].steps) is tuple


async def test_a_workflow_resumes_with_typed_state() -> None:
    """SharedState keeps typed values through get/set, history, restore and a resume."""
    storage = InMemoryCheckpointStorage()
    manager = CheckpointManager(storage, types=registry(), app_version="1")
    async with ResumableWorkflow("wf", manager) as wf:
        wf.state.set("r", Message(role=Role.USER, text="x", at=MOMENT))
        wf.state.set("when", MOMENT)
        wf.state.merge({"ids": {uuid.UUID(int=1)}})
        wf.state.set("many", {f"k{i}": (i, MOMENT) for i in range(100)})  # copied in slices
        wf.state.set("when", MOMENT + timedelta(days=1))
        wf.state.restore(wf.state.version - 1)
        await wf.checkpoint(0, "a", "completed")
    async with ResumableWorkflow("wf", manager) as wf:
        assert wf.is_resumed and wf.resumed_app_version == "1"
        assert wf.state.get("r").at == MOMENT
        assert wf.state.get("when") == MOMENT
        assert wf.state.get("ids") == {uuid.UUID(int=1)}
        assert wf.state.get("many.k99") == (99, MOMENT)
        assert isinstance(wf.state.snapshot().data["r"], Message)


async def test_unregistered_class_on_write_names_path_and_class_and_writes_nothing() -> None:
    """A model the registry lacks is refused before anything is stored."""
    storage = InMemoryCheckpointStorage()
    manager = CheckpointManager(storage)
    message = Message(role=Role.USER, text="x", at=MOMENT)
    with pytest.raises(CheckpointSerializationError) as info:
        await manager.create_checkpoint("wf", 0, "a", "completed", {"m": [1, message]})
    assert info.value.path == "state.m[1]"
    assert "test_typed.Message" in str(info.value)
    with pytest.raises(CheckpointSerializationError, match=r"metadata\.r"):
        await manager.create_checkpoint("wf", 0, "a", "completed", {}, metadata={"r": Role.USER})
    assert await storage.load("wf") is None


async def test_unregistered_type_on_read_raises_or_reads_raw() -> None:
    """Without the class: a typed error naming path and type, or TaggedValues on request."""
    storage = InMemoryCheckpointStorage()
    writer = CheckpointManager(storage, types=registry())
    await writer.create_checkpoint("wf", 0, "a", "completed", {"r": [Role.USER]})
    reader = CheckpointManager(storage)
    with pytest.raises(UnknownTypeError) as info:
        await reader.get_checkpoint("wf", 0)
    assert (info.value.path, info.value.type_name) == ("state.r[0]", "Role")
    raw = await reader.get_checkpoint("wf", 0, raw=True)
    assert raw.state_snapshot.data == {"r": [TaggedValue("Role", 1, "user")]}
    # A raw value written back is the same stored value: a reader with the class gets it.
    await reader.create_checkpoint("wf", 1, "a", "completed", raw.state_snapshot.data)
    again = CheckpointManager(storage, types=registry())
    assert (await again.get_checkpoint("wf", 1)).state_snapshot.data == {"r": [Role.USER]}
    lenient = CheckpointManager(storage, types=TypeRegistry(raw=True))
    assert (await lenient.get_checkpoint("wf", 0)).state_snapshot.data == raw.state_snapshot.data


@dataclasses.dataclass
class Contact:
    name: str
    email: str
    verified: bool


async def test_a_version_upgrade_runs_on_older_data() -> None:
    """Data written by version 1 is upgraded step by step when version 3 reads it."""
    storage = InMemoryCheckpointStorage()
    old = TypeRegistry()
    old.register(Contact, name="Contact", encode=lambda c: [c.name], decode=lambda d: d)
    writer = CheckpointManager(storage, types=old)
    await writer.create_checkpoint("wf", 0, "a", "completed", {"c": Contact("x", "", False)})
    new = TypeRegistry()
    new.register(
        Contact,
        name="Contact",
        version=3,
        upgrade={
            1: lambda data: {"name": data[0], "email": "?"},
            2: lambda data: {**data, "verified": False},
        },
    )
    manager = CheckpointManager(storage, types=new)
    contact = (await manager.get_checkpoint("wf", 0)).state_snapshot.data["c"]
    assert contact == Contact("x", "?", False)


async def test_data_of_a_newer_version_is_a_typed_error() -> None:
    """A registry at version 1 refuses data written at version 2 (raw reads keep it)."""
    storage = InMemoryCheckpointStorage()
    newer = TypeRegistry()
    newer.register(Role, name="Role", version=2, upgrade={1: lambda data: data})
    writer = CheckpointManager(storage, types=newer)
    await writer.create_checkpoint("wf", 0, "a", "completed", {"r": Role.USER})
    with pytest.raises(TypeVersionError, match="version 2"):
        await CheckpointManager(storage, types=registry()).get_checkpoint("wf", 0)
    raw = await CheckpointManager(storage, types=registry()).get_checkpoint("wf", 0, raw=True)
    assert raw.state_snapshot.data == {"r": TaggedValue("Role", 2, "user")}
    missing = TypeRegistry()
    missing.register(Role, name="Role", version=3, upgrade={1: lambda data: data})
    with pytest.raises(TypeVersionError, match="no upgrade from version 2"):
        await CheckpointManager(storage, types=missing).get_checkpoint("wf", 0)


def _crafted(data: dict[str, Any]) -> bytes:
    """A version-1 record holding ``data`` as it is: no value stage runs (a hostile writer)."""
    snapshot = StateSnapshot(data=data)
    return encode_checkpoint(
        Checkpoint(
            workflow_id="wf", step=0, agent_id="a", status="completed", state_snapshot=snapshot
        )
    )


class Guarded(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def small(cls, value: int) -> int:
        if value > 10:
            raise ValueError("too big")
        return value


@pytest.mark.parametrize("name", ["os.system", "subprocess.Popen", "not.registered.Class"])
async def test_a_hostile_record_constructs_nothing(name: str) -> None:
    """A record naming any unregistered type imports and constructs nothing."""
    storage = InMemoryCheckpointStorage()
    await storage.save("wf", 0, _crafted({"x": {"$": [name, 1, ["echo", "owned"]]}}))
    modules = set(sys.modules)
    with pytest.raises(UnknownTypeError, match=name):
        await CheckpointManager(storage, types=registry()).get_checkpoint("wf", 0)
    raw = await CheckpointManager(storage).get_checkpoint("wf", 0, raw=True)
    assert raw.state_snapshot.data == {"x": TaggedValue(name, 1, ["echo", "owned"])}
    assert set(sys.modules) == modules


async def test_registered_models_are_built_only_through_their_validation() -> None:
    """Stored data that fails a model's validators raises a typed error, constructs nothing."""
    storage = InMemoryCheckpointStorage()
    await storage.save("wf", 0, _crafted({"g": {"$": ["Guarded", 1, {"n": 11}]}}))
    types = TypeRegistry()
    types.register(Guarded, name="Guarded")
    with pytest.raises(CheckpointTypeError, match="too big") as info:
        await CheckpointManager(storage, types=types).get_checkpoint("wf", 0)
    assert info.value.path == "state.g"


@pytest.mark.parametrize(
    "value",
    [
        {"$nope": 1},
        {"$dt": 5},
        {"$uuid": "zz"},
        {"$b": "@@@"},
        {"$": ["Role", 0, "user"]},
        {"$map": [[[1], 2]]},
        {"$tup": "abc"},
    ],
)
async def test_malformed_tags_are_corruption(value: dict[str, Any]) -> None:
    """An unknown or malformed tag is a corrupted record, never a guess."""
    storage = InMemoryCheckpointStorage()
    await storage.save("wf", 0, _crafted({"x": value}))
    with pytest.raises(CheckpointCorruptedError):
        await CheckpointManager(storage, types=registry()).get_checkpoint("wf", 0)


def test_registration_is_checked() -> None:
    """Only classes, unique names, versions >= 1 and upgrades of earlier versions."""
    types = registry()
    with pytest.raises(InvalidArgumentError):
        types.register(Role, name="Other")  # already registered
    with pytest.raises(InvalidArgumentError):
        types.register(Guarded, name="Message")  # name taken
    with pytest.raises(InvalidArgumentError):
        types.register(object)  # neither model, dataclass nor enum, and no functions
    with pytest.raises(InvalidArgumentError):
        types.register(Guarded, version=2, upgrade={2: lambda d: d})
    with pytest.raises(InvalidArgumentError):
        types.register(Guarded, version=0)
    assert types.register(Guarded) is Guarded
    assert types.by_name(f"{__name__}.Guarded") is not None


def test_the_cli_reads_and_copies_typed_stores_without_the_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """show, diff, export, import and copy run without the classes and keep values exact."""
    from aiocheckpoint.cli import main

    src, dst, dst2 = (f"file:{tmp_path}/{name}" for name in ("src", "dst", "dst2"))
    state = rich_state() | {"pad": ["y" * 100] * 200}  # a tree in the incremental store

    async def write() -> None:
        async with CheckpointManager(open_storage(src), types=registry()) as manager:
            await manager.create_checkpoint("wf", 0, "a", "completed", state)
            await manager.create_checkpoint("wf", 1, "a", "completed", {**state, "id": 5})

    async def read(url: str) -> list[dict[str, Any]]:
        async with CheckpointManager(open_storage(url), types=registry()) as manager:
            return [c.state_snapshot.data for c in await manager.list_checkpoints("wf")]

    asyncio.run(write())
    backup = tmp_path / "backup.jsonl"
    assert main(["show", src, "wf", "0", "--json"]) == 0
    assert '"$dt": "2026-01-02T03:04:05.678901+05:30"' in capsys.readouterr().out
    assert main(["diff", src, "wf", "0", "1", "--json"]) == 0
    assert '"$uuid"' in capsys.readouterr().out
    assert main(["export", src, str(backup)]) == 0
    assert main(["import", str(backup), dst]) == 0
    assert main(["copy", src, dst2]) == 0
    for url in (dst, dst2):
        assert asyncio.run(read(url)) == [state, {**state, "id": 5}]


def _store_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


async def test_typed_values_are_split_and_shared_between_incremental_checkpoints(
    tmp_path: Path,
) -> None:
    """A ~1 MB typed state saved 100 times with one changing datetime stays under 3 MB, and
    the text checksum covers its typed values."""
    words = " ".join(f"w{i}" for i in range(200))
    state = {
        "now": MOMENT,
        "docs": {
            f"d{i}": {"at": MOMENT + timedelta(seconds=i), "id": uuid.UUID(int=i), "body": words}
            for i in range(1000)
        },
    }
    storage = open_storage(f"file:{tmp_path}/store")
    async with CheckpointManager(storage) as manager:
        for step in range(100):
            state["now"] = MOMENT + timedelta(minutes=step)
            await manager.create_checkpoint("wf", step, "a", "running", state)
        stored = await storage.load("wf")
        assert stored is not None and stored.data[4] == 2
        assert b"text_crc32" in stored.data
        back = await manager.get_checkpoint("wf", 99)
    assert back.state_snapshot.data == state
    assert len(orjson.dumps(to_storable(state))) > 1_000_000
    assert _store_bytes(tmp_path / "store") < 3_000_000


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=states)
def test_random_values_survive_export_import_and_copy(
    tmp_path_factory: pytest.TempPathFactory, state: dict[str, Any]
) -> None:
    """export -> import (into SQLite) and copy (into a file store) keep every value exact."""
    from aiocheckpoint.cli import main

    root = tmp_path_factory.mktemp("cli")
    src, dst, dst2 = f"file:{root}/src", f"sqlite:{root}/dst.db", f"file:{root}/dst2"

    async def write() -> None:
        async with CheckpointManager(open_storage(src)) as manager:
            await manager.create_checkpoint("wf", 0, "a", "completed", state, metadata={"s": state})

    async def read(url: str) -> Checkpoint:
        async with CheckpointManager(open_storage(url)) as manager:
            return await manager.get_checkpoint("wf", 0)

    asyncio.run(write())
    assert main(["export", src, str(root / "backup.jsonl")]) == 0
    assert main(["import", str(root / "backup.jsonl"), dst]) == 0
    assert main(["copy", src, dst2]) == 0
    for url in (dst, dst2):
        back = asyncio.run(read(url))
        assert same(state, back.state_snapshot.data)
        assert same({"s": state}, back.metadata)


@pytest.mark.parametrize(("kind", "deepest"), [("tuple", 99), ("set", 99), ("map", 66)])
async def test_typed_nesting_up_to_the_limit_round_trips_and_beyond_is_refused(
    kind: str, deepest: int
) -> None:
    """Tags count as levels of the stored JSON: the writer refuses what a reader would."""

    def nest(levels: int) -> Any:
        value: Any = "x"
        for _ in range(levels):
            if kind == "map":
                value = {1: value}
            else:
                value = (value,) if kind == "tuple" else frozenset([value])
        return value

    manager = CheckpointManager()
    await manager.create_checkpoint("wf", 0, "a", "completed", {"v": nest(deepest)})
    assert (await manager.get_checkpoint("wf", 0)).state_snapshot.data == {"v": nest(deepest)}
    with pytest.raises(CheckpointSerializationError, match="nesting deeper"):
        await manager.create_checkpoint("wf", 1, "a", "completed", {"v": nest(deepest + 1)})


class Fragile:
    def __init__(self, n: int) -> None:
        self.n = n


@pytest.mark.parametrize("size", [10, 20_000])  # a version-1 record, and a tree
async def test_a_value_that_would_not_read_back_is_refused_before_writing(
    tmp_path: Path, size: int
) -> None:
    """An encode/decode pair that fails on its own data is found before anything is stored."""

    def decode(data: Any) -> Fragile:
        raise ValueError(f"cannot rebuild {data!r}")

    types = TypeRegistry()
    types.register(Fragile, name="Fragile", encode=lambda f: f.n, decode=decode)
    storage = open_storage(f"file:{tmp_path}/store")
    async with CheckpointManager(storage, types=types) as manager:
        state = {"pad": "x" * size, "f": [Fragile(3)]}
        with pytest.raises(CheckpointSerializationError, match="would not read back") as info:
            await manager.create_checkpoint("wf", 0, "a", "completed", state)
        assert info.value.path == "state.f[0]"
        assert not await manager.has_checkpoint("wf")


@pytest.mark.parametrize("bad", [TaggedValue("", 1, None), TaggedValue("X", 0, None)])
async def test_a_malformed_tagged_value_is_refused_on_write(bad: TaggedValue) -> None:
    """A TaggedValue the reader would refuse as corrupted is refused before writing."""
    manager = CheckpointManager()
    with pytest.raises(CheckpointSerializationError, match="TaggedValue needs") as info:
        await manager.create_checkpoint("wf", 0, "a", "completed", {"t": [bad]})
    assert info.value.path == "state.t[0]"


async def test_odd_top_level_keys_read_back_and_a_top_level_tag_is_corruption() -> None:
    """A state whose own keys are not str reads back; a record whose state is a tag does not."""
    manager = CheckpointManager()
    await manager.create_checkpoint("wf", 0, "a", "completed", {1: "x"}, metadata={"$k": 1})
    back = await manager.get_checkpoint("wf", 0)
    assert (back.state_snapshot.data, back.metadata) == ({1: "x"}, {"$k": 1})
    storage = InMemoryCheckpointStorage()
    await storage.save("wf", 0, _crafted({"$tup": [1]}))
    with pytest.raises(CheckpointCorruptedError, match="state is not an object"):
        await CheckpointManager(storage).get_checkpoint("wf", 0)


def test_one_value_through_the_managers_value_stage() -> None:
    """encode_value/decode_value: what effect results use, with the manager's registry."""
    from aiocheckpoint.format.jsonread import loads

    manager = CheckpointManager(types=registry())
    codec = manager._codec
    value = {"r": Role.TOOL, "at": MOMENT, "ids": (uuid.UUID(int=3),)}
    data, finite = codec.encode_value(value, "effect")
    assert finite
    assert codec.decode_value(loads(orjson.dumps(data)), "effect") == value
    with pytest.raises(CheckpointSerializationError, match=r"effect\.x"):
        codec.encode_value({"x": object()}, "effect")
    stored = CheckpointManager()._codec.decode_value(loads(orjson.dumps(data)), "effect", "raw")
    assert stored["r"] == TaggedValue("Role", 1, "tool")
