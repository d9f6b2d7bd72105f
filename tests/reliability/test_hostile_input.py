"""Hostile input: every call either round-trips exactly or raises the documented typed error.

A refused call must change nothing stored, must not touch another workflow, and (for
durable backends) must not create anything outside the store directory.
"""

from __future__ import annotations

import string
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import date, datetime, time, timezone
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel

from aiocheckpoint import (
    CheckpointManager,
    CheckpointSerializationError,
    CheckpointStorage,
    ExecutionMetrics,
    InvalidArgumentError,
    InvalidStepError,
    InvalidWorkflowIdError,
    ResumableWorkflow,
    StateSnapshot,
)
from aiocheckpoint.format.limits import MAX_DEPTH
from tests.typed_values import same as exactly

from ._support import dump_store, hypothesis_settings, outside
from .conftest import Backend

SENTINEL = "sentinel/../workflow"
SENTINEL_STATE = {"keep": ["me", 1, 2.5, None], "nested": {"x": True}}


def _root(tmp_path: Path) -> Path:
    # Nested so that "../" traversals of up to four levels still land inside tmp_path,
    # where the containment walk sees them.
    return tmp_path / "r1" / "r2" / "r3"


@pytest.fixture
async def storage(backend: Backend, tmp_path: Path) -> AsyncIterator[CheckpointStorage]:
    """A store of the current backend, nested below tmp_path, holding one sentinel workflow."""
    store = backend.open(_root(tmp_path))
    await CheckpointManager(store).create_checkpoint(
        SENTINEL, 7, "agent", "completed", SENTINEL_STATE
    )
    yield store
    await store.close()


@pytest.fixture
def contained(backend: Backend, tmp_path: Path) -> Callable[[], None]:
    """Asserts that nothing exists under tmp_path except the store and its parents."""

    def check() -> None:
        assert outside(tmp_path, backend.store_dir(_root(tmp_path))) == set()

    return check


# --- strategies ---------------------------------------------------------------------------

SEPARATORS = ["/", "\\", "..", ".", ":", "%2F", "%", "~", " ", "\t", "\n", "'", '"', "*", "?"]
RESERVED = ["CON", "PRN", "AUX", "NUL", "COM1", "LPT1", "con", "nul.txt", "CON.", "com1.json"]


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _is_valid_id(text: str) -> bool:
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return 0 < size <= 255 and "\x00" not in text


def _fill(unit: str, size: int) -> str:
    """``unit`` repeated, then padded with 'a', to exactly ``size`` UTF-8 bytes."""
    count = size // _utf8_len(unit)
    text = unit * count
    return text + "a" * (size - _utf8_len(text))


_segment = st.one_of(st.sampled_from(SEPARATORS + RESERVED), st.text(min_size=1, max_size=8))
_units = st.sampled_from(["a", "é", "日", "😀", "ß", "Å"])
_boundary_ids = st.builds(_fill, _units, st.integers(250, 255))
_traversal_ids = st.builds(
    lambda k, sep, name: (".." + sep) * k + name,
    st.integers(1, 4),
    st.sampled_from(["/", "\\"]),
    st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=6),
)
valid_ids = st.one_of(
    st.lists(_segment, min_size=1, max_size=6).map("".join),
    st.text(min_size=1, max_size=40),
    _boundary_ids,
    _traversal_ids,
    st.sampled_from(["/abs", "/etc/passwd", "//server/share", "C:\\x", "\\\\?\\C:\\x", ".", ".."]),
).filter(_is_valid_id)

invalid_ids = st.one_of(
    st.just(""),
    st.builds(lambda a, b: a + "\x00" + b, st.text(max_size=5), st.text(max_size=5)),
    st.builds(_fill, _units, st.integers(256, 300)).filter(lambda s: _utf8_len(s) > 255),
    st.builds(lambda c: c * 128, st.sampled_from(["é", "ß"])),  # 256 bytes, 128 characters
    st.builds(lambda a: a + "\ud800", st.text(max_size=5)),  # a lone surrogate
    st.sampled_from([None, 1, 2.5, b"wf", ["wf"], ("wf",), {"wf": 1}, Path("wf"), True]),
)

valid_steps = st.one_of(st.integers(0, 2**63 - 1), st.sampled_from([0, 1, 2**31, 2**63 - 1]))
invalid_steps = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**63),
    st.sampled_from([2**63, 2**64, 10**100, -(2**63), True, False, 1.0, 0.5, float("nan")]),
    st.floats(),
    st.text(max_size=4),
    st.just(b"1"),
)

_huge_ints = st.builds(
    lambda digits, low, sign: sign * (10**digits + low),
    st.integers(4300, 12_000),
    st.integers(0, 10**30),
    st.sampled_from([1, -1]),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**200), 2**200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
)
json_values = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=5).map(tuple),
        st.dictionaries(st.text(max_size=10), children, max_size=5),
    ),
    max_leaves=30,
)
json_states = st.dictionaries(st.text(max_size=10), json_values, max_size=6)


class Color(Enum):
    RED = "red"


class _Payload(BaseModel):
    name: str
    when: datetime
    tags: list[str]
    score: float


class _Opaque:
    pass


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr exploded")

    def __hash__(self) -> int:
        return 7


class _BadDump(BaseModel):
    x: int = 1

    def model_dump(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("model_dump exploded")


class _Str(str):
    pass


UNSTORABLE: list[Any] = [
    memoryview(b"mv"),
    1 + 2j,
    Color.RED,
    _Opaque(),
    object,
    print,
    _Str("subclass of str"),
    range(3),
    iter([1]),
]

# A path through the state: str keys (identifiers or not) and list indexes.
_keys = st.one_of(
    st.sampled_from(["plan", "items", "a_b", "x1"]),
    st.text(min_size=1, max_size=6),
    st.integers(0, 3),
)


def _place(path: list[str | int], leaf: Any) -> tuple[dict[str, Any], str]:
    """Build a state holding ``leaf`` at ``path``; return it and the documented path text."""
    node: Any = leaf
    for key in reversed(path):
        node = [None] * key + [node] if isinstance(key, int) else {key: node}
    text = "state"
    for key in path:
        if isinstance(key, int):
            text += f"[{key}]"
        elif key and not key[0].isdigit() and set(key) <= set(string.ascii_letters + "_0123456789"):
            text += f".{key}"
        else:
            text += f"[{key!r}]"
    if not isinstance(node, dict):
        node, text = {"root": node}, "state.root" + text[len("state") :]
    return node, text


async def _create(manager: CheckpointManager, wf: Any, step: Any, state: Any, **kw: Any) -> Any:
    return await manager.create_checkpoint(wf, step, "agent", "completed", state, **kw)


# --- workflow ids --------------------------------------------------------------------------


@hypothesis_settings(40)
@given(ids=st.lists(valid_ids, min_size=1, max_size=3, unique=True))
@example(ids=["é", "e\u0301"])  # NFC and NFD spellings are different ids
@example(ids=["a/b", "a_b", "a%2Fb", "a\\b"])
@example(ids=["CON", "con", "Con.txt"])
@example(ids=["A", "a"])
@example(ids=[_fill("é", 255), _fill("😀", 255), _fill("日", 255)])
async def test_valid_workflow_ids_round_trip_and_stay_isolated(
    manager: CheckpointManager,
    storage: CheckpointStorage,
    contained: Callable[[], None],
    ids: list[str],
) -> None:
    """Any valid id, however hostile, is its own workflow, comes back unchanged and touches nothing
    else.
    """
    before = await dump_store(storage)
    for n, wf in enumerate(ids):
        await _create(manager, wf, n, {"id": wf, "n": n})
    assert set(ids) <= set(await manager.list_workflows())
    for n, wf in enumerate(ids):
        checkpoint = await manager.get_latest_checkpoint(wf)
        assert checkpoint is not None
        assert (checkpoint.workflow_id, checkpoint.step) == (wf, n)
        assert checkpoint.state_snapshot.data == {"id": wf, "n": n}
        assert [c.step for c in await manager.list_checkpoints(wf)] == [n]
    contained()
    for wf in ids:
        assert await manager.delete_checkpoints(wf)
    assert await dump_store(storage) == before
    contained()


@hypothesis_settings(40)
@given(wf=invalid_ids)
async def test_invalid_workflow_ids_are_refused_by_every_call(
    manager: CheckpointManager,
    storage: CheckpointStorage,
    contained: Callable[[], None],
    wf: Any,
) -> None:
    """Empty, NUL, over-255-byte, unencodable and non-str ids raise InvalidWorkflowIdError
    everywhere and store nothing.
    """
    before = await dump_store(storage)
    calls = [
        _create(manager, wf, 0, {"a": 1}),
        manager.get_checkpoint(wf, 0),
        manager.get_latest_checkpoint(wf),
        manager.has_checkpoint(wf),
        manager.list_checkpoints(wf),
        manager.delete_checkpoints(wf),
        manager.get_resume_point(wf),
    ]
    for call in calls:
        with pytest.raises(InvalidWorkflowIdError):
            await call
    with pytest.raises(InvalidWorkflowIdError):
        ResumableWorkflow(wf, manager)
    assert await dump_store(storage) == before
    contained()


async def test_absolute_and_traversal_ids_write_nothing_outside_the_store(
    manager: CheckpointManager,
    storage: CheckpointStorage,
    contained: Callable[[], None],
    tmp_path: Path,
) -> None:
    """Ids naming absolute paths or climbing out of the store create no file where they point."""
    targets = [tmp_path / "abs-escape", tmp_path / "r1" / "up-escape"]
    ids = [
        str(targets[0]),
        "../../../../up-escape",
        "..\\..\\..\\..\\up-escape",
        "/" + str(targets[0]),
    ]
    for wf in ids:
        await _create(manager, wf, 1, {"wf": wf})
        assert (await manager.get_checkpoint(wf, 1)).state_snapshot.data == {"wf": wf}
    for target in targets:
        assert not target.exists()
    contained()


# --- steps ---------------------------------------------------------------------------------


@hypothesis_settings(30)
@given(step=valid_steps)
async def test_valid_steps_round_trip(
    manager: CheckpointManager, storage: CheckpointStorage, step: int
) -> None:
    """Every int step in [0, 2**63) is stored, found as latest and deleted exactly."""
    before = await dump_store(storage)
    await _create(manager, "steps", step, {"step": step})
    latest = await manager.get_latest_checkpoint("steps")
    assert latest is not None
    assert latest.step == step
    assert latest.state_snapshot.data == {"step": step}
    assert await manager.has_checkpoint("steps", step)
    assert await manager.delete_checkpoints("steps", step)
    assert await dump_store(storage) == before


@hypothesis_settings(40)
@given(step=invalid_steps)
async def test_invalid_steps_are_refused_by_every_call(
    manager: CheckpointManager, storage: CheckpointStorage, step: Any
) -> None:
    """Negative, bool, float, non-int and >= 2**63 steps raise InvalidStepError, storing nothing."""
    before = await dump_store(storage)
    calls = [
        _create(manager, SENTINEL, step, {"a": 1}),
        manager.get_checkpoint(SENTINEL, step),
        manager.has_checkpoint(SENTINEL, step),
        manager.delete_checkpoints(SENTINEL, step),
        manager.list_checkpoints(SENTINEL, after=step),
        manager.list_checkpoints(SENTINEL, before=step),
    ]
    for call in calls:
        with pytest.raises(InvalidStepError):
            await call
    assert await dump_store(storage) == before


# --- state and metadata values --------------------------------------------------------------


@hypothesis_settings(60)
@given(state=json_states, metadata=json_states)
@example(state={"nan": float("nan"), "inf": float("inf"), "-0": -0.0, "t": (1, (2,))}, metadata={})
@example(state={"big": 2**64, "neg": -(2**63)}, metadata={"": {"": [[]]}})
async def test_json_values_round_trip_exactly(
    manager: CheckpointManager,
    storage: CheckpointStorage,
    state: dict[str, Any],
    metadata: dict[str, Any],
) -> None:
    """JSON-compatible states and metadata (NaN, infinities, -0.0, big ints, tuples) come back
    exactly, tuples as tuples.
    """
    await _create(manager, "values", 1, state, metadata=metadata)
    checkpoint = await manager.get_checkpoint("values", 1)
    assert exactly(state, checkpoint.state_snapshot.data)
    assert exactly(metadata, checkpoint.metadata)


@hypothesis_settings(10, 100)
@given(big=_huge_ints)
async def test_ints_beyond_the_str_digit_limit_round_trip(
    manager: CheckpointManager, big: int
) -> None:
    """Ints with more digits than Python's 4300-digit str limit are stored and read back exactly."""
    await _create(manager, "bigint", 1, {"v": big, "l": [big, -big]}, metadata={"m": big})
    checkpoint = await manager.get_checkpoint("bigint", 1)
    assert checkpoint.state_snapshot.data == {"v": big, "l": [big, -big]}
    assert checkpoint.metadata == {"m": big}


@hypothesis_settings(30)
@given(
    moment=st.datetimes(timezones=st.sampled_from([None, timezone.utc])),
    day=st.dates(),
    clock=st.times(),
    ident=st.uuids(),
    name=st.text(max_size=10),
)
async def test_datetimes_and_uuids_come_back_as_themselves_and_models_need_registering(
    manager: CheckpointManager,
    storage: CheckpointStorage,
    moment: datetime,
    day: date,
    clock: time,
    ident: uuid.UUID,
    name: str,
) -> None:
    """Datetimes, dates, times and UUIDs come back with their types; an unregistered pydantic
    model is refused naming its path, storing nothing.
    """
    state = {"dt": moment, "d": day, "t": clock, "u": ident, "l": [ident]}
    await _create(manager, "convert", 1, state, metadata={"u": ident})
    checkpoint = await manager.get_checkpoint("convert", 1)
    assert exactly(state, checkpoint.state_snapshot.data)
    assert exactly({"u": ident}, checkpoint.metadata)
    before = await dump_store(storage)
    model = _Payload(name=name, when=moment, tags=[name], score=1.5)
    with pytest.raises(CheckpointSerializationError, match=r"state\.m: .*_Payload is not a"):
        await _create(manager, "convert", 2, {"m": model})
    assert await dump_store(storage) == before


@hypothesis_settings(60)
@given(
    path=st.lists(_keys, max_size=5),
    bad=st.sampled_from(UNSTORABLE),
    where=st.sampled_from(["state", "metadata", "snapshot.metadata"]),
)
async def test_unstorable_values_raise_naming_the_path_and_store_nothing(
    manager: CheckpointManager,
    storage: CheckpointStorage,
    path: list[str | int],
    bad: Any,
    where: str,
) -> None:
    """Unregistered enums, str subclasses and other objects anywhere raise
    CheckpointSerializationError naming the exact path.
    """
    before = await dump_store(storage)
    tree, text = _place(path, bad)
    if where == "state":
        call = _create(manager, "bad", 1, tree)
    elif where == "metadata":
        call = _create(manager, "bad", 1, {}, metadata=tree)
    else:
        snapshot = StateSnapshot.model_construct(
            data={}, version=StateSnapshot().version, metadata=tree
        )
        call = _create(manager, "bad", 1, snapshot)
    with pytest.raises(CheckpointSerializationError) as info:
        await call
    prefix = {"state": "state", "metadata": "metadata", "snapshot.metadata": "state.metadata"}[
        where
    ]
    assert info.value.path == prefix + text[len("state") :]
    assert await dump_store(storage) == before


@hypothesis_settings(30)
@given(
    path=st.lists(_keys, max_size=4),
    key=st.sampled_from([Color.RED, _Str("k"), 1 + 2j, (1, _Opaque())]),
)
async def test_keys_of_unregistered_classes_raise_naming_the_container(
    manager: CheckpointManager, storage: CheckpointStorage, path: list[str | int], key: Any
) -> None:
    """A dict key of an unregistered class raises CheckpointSerializationError at its
    container's path (keys of the standard types are stored: docs/serialization.md).
    """
    before = await dump_store(storage)
    tree, text = _place(path, {key: "v"})
    with pytest.raises(CheckpointSerializationError) as info:
        await _create(manager, "bad", 1, tree)
    assert info.value.path.startswith(text)
    assert await dump_store(storage) == before


@pytest.mark.parametrize("kind", ["list", "dict", "deep"])
async def test_cycles_are_refused(
    manager: CheckpointManager, storage: CheckpointStorage, kind: str
) -> None:
    """A value that contains itself raises CheckpointSerializationError instead of recursing
    forever.
    """
    before = await dump_store(storage)
    loop: Any
    if kind == "list":
        loop = []
        loop.append(loop)
    elif kind == "dict":
        loop = {}
        loop["self"] = loop
    else:
        loop = {"a": [{"b": []}]}
        loop["a"][0]["b"].append(loop)
    with pytest.raises(CheckpointSerializationError) as info:
        await _create(manager, "bad", 1, {"x": loop})
    assert info.value.path.startswith("state.x")
    assert await dump_store(storage) == before


def _nest(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


async def test_nesting_up_to_the_depth_limit_round_trips(manager: CheckpointManager) -> None:
    """A state nested to just under serde.MAX_DEPTH levels is stored and read back exactly."""
    deepest = {"x": _nest(MAX_DEPTH - 1)}
    await _create(manager, "deep", 1, deepest)
    assert (await manager.get_checkpoint("deep", 1)).state_snapshot.data == deepest


@pytest.mark.parametrize("extra", [0, 1, 50, 5000])
async def test_nesting_beyond_the_depth_limit_is_refused(
    manager: CheckpointManager, storage: CheckpointStorage, extra: int
) -> None:
    """Nesting at or beyond serde.MAX_DEPTH raises CheckpointSerializationError, never
    RecursionError.
    """
    before = await dump_store(storage)
    with pytest.raises(CheckpointSerializationError) as info:
        await _create(manager, "deep", 1, {"x": _nest(MAX_DEPTH + extra)})
    assert info.value.path.startswith("state.x")
    with pytest.raises(CheckpointSerializationError):
        await _create(manager, "deep", 1, {}, metadata={"x": _nest(MAX_DEPTH + extra)})
    assert await dump_store(storage) == before


@pytest.mark.parametrize("where", ["key", "model", "nested_model"])
async def test_objects_that_raise_during_serialization_get_a_typed_error(
    manager: CheckpointManager, storage: CheckpointStorage, where: str
) -> None:
    """A key whose __repr__ raises or a model whose model_dump raises gives
    CheckpointSerializationError, not the object's error.
    """
    before = await dump_store(storage)
    state: dict[Any, Any] = {
        "key": {"items": {_BadRepr(): 1}},
        "model": {"items": [_BadDump()]},
        "nested_model": {"items": {"m": _BadDump()}},
    }[where]
    with pytest.raises(CheckpointSerializationError) as info:
        await _create(manager, "bad", 1, state)
    assert info.value.path.startswith("state.items")
    assert await dump_store(storage) == before


@pytest.mark.parametrize(
    ("state", "path"),
    [
        ({"s": "ok\ud800"}, "state.s"),
        ({"l": ["a", "\udfff"]}, "state.l[1]"),
        ({"k\ud800": 1}, "state"),
    ],
)
async def test_lone_surrogates_are_refused_naming_the_path(
    manager: CheckpointManager, storage: CheckpointStorage, state: dict[str, Any], path: str
) -> None:
    """Strings that cannot be UTF-8 encoded raise CheckpointSerializationError naming where they
    are.
    """
    before = await dump_store(storage)
    with pytest.raises(CheckpointSerializationError) as info:
        await _create(manager, "bad", 1, state)
    assert info.value.path.startswith(path)
    assert await dump_store(storage) == before


@pytest.mark.parametrize("metadata", ["ab", 5, [("a", 1)], ["ab"], 2.5, b"xy"])
async def test_metadata_that_is_not_a_mapping_is_refused(
    manager: CheckpointManager, storage: CheckpointStorage, metadata: Any
) -> None:
    """Metadata that is not a mapping raises InvalidArgumentError; it is never converted."""
    before = await dump_store(storage)
    with pytest.raises(InvalidArgumentError):
        await _create(manager, "bad", 1, {}, metadata=metadata)
    assert await dump_store(storage) == before


_BAD_ARGUMENTS: list[tuple[str, dict[str, Any]]] = [
    ("agent_id", {"agent_id": 5}),
    ("agent_id", {"agent_id": None}),
    ("status", {"status": "finished"}),
    ("status", {"status": None}),
    ("status", {"status": ["completed"]}),
    ("state", {"state": [1, 2]}),
    ("state", {"state": "text"}),
    ("state", {"state": None}),
    ("metrics", {"metrics": {"total_cost": 1.0}}),
    ("metrics", {"metrics": 5}),
]


@pytest.mark.parametrize(("what", "override"), _BAD_ARGUMENTS)
async def test_bad_arguments_are_refused_with_invalid_argument_error(
    manager: CheckpointManager, storage: CheckpointStorage, what: str, override: dict[str, Any]
) -> None:
    """A wrong agent id, status, state or metrics type raises InvalidArgumentError and stores
    nothing.
    """
    before = await dump_store(storage)
    args: dict[str, Any] = {
        "workflow_id": "bad",
        "step": 1,
        "agent_id": "agent",
        "status": "completed",
        "state": {},
        "metrics": ExecutionMetrics(),
    }
    args.update(override)
    with pytest.raises(InvalidArgumentError):
        await manager.create_checkpoint(**args)
    assert await dump_store(storage) == before


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "3", 2**70 * 0.5])
async def test_bad_page_limits_are_refused(manager: CheckpointManager, limit: Any) -> None:
    """A limit that is not an int >= 1 raises InvalidArgumentError from list_checkpoints."""
    with pytest.raises(InvalidArgumentError):
        await manager.list_checkpoints(SENTINEL, limit=limit)


@pytest.mark.parametrize("keep", [0, -1, True, 1.0, "2"])
def test_bad_retention_is_refused(keep: Any) -> None:
    """max_checkpoints that is not an int >= 1 raises InvalidArgumentError at construction."""
    with pytest.raises(InvalidArgumentError):
        CheckpointManager(max_checkpoints=keep)
