"""The sub-tree cache under the edits tests/test_subtrees.py leaves out (issue 21's review).

Typed values (datetimes, bytes, sets, tuples, dicts with keys of other types, registered
models) and "$"-prefixed keys at every depth; a state rebuilt by ``from_snapshot``;
several SharedStates checkpointed into one workflow's cache; lists replaced by equal lists
that are other objects; lists appended to after a restore took them back to an older
version. First split by split against a split from scratch with the same memory, byte for
byte; then through managers and ``ResumableWorkflow`` steps (failed ones rolled back, runs
resumed) on the memory, SQLite and file stores, each checkpoint read back by a manager
without a cache and compared with the state, type for type.
"""

from __future__ import annotations

import enum
import gc
import operator
import tempfile
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aiocheckpoint import CheckpointManager, ResumableWorkflow, SharedState, TypeRegistry
from aiocheckpoint.codec.copy import json_copy, to_storable
from aiocheckpoint.codec.jsonwrite import dumps
from aiocheckpoint.codec.pipeline import RecordCodec
from aiocheckpoint.codec.sizes import text_bound
from aiocheckpoint.codec.sliced import finish
from aiocheckpoint.codec.stages import TypedValues
from aiocheckpoint.codec.tree.split import split_work
from aiocheckpoint.codec.tree.subtrees import shared_split_work
from aiocheckpoint.codec.typed import Decoder
from aiocheckpoint.format.tags import MARK
from aiocheckpoint.format.tree import SplitMemory, SplitResult
from aiocheckpoint.storage.base import BlobCheckpointStorage
from aiocheckpoint.storage.file.store import FileCheckpointStorage
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.test_subtrees import PARAMS, CountingValues, _apply, _same
from tests.test_subtrees import SCALARS as PLAIN_SCALARS
from tests.test_typed import Message, Role, registry
from tests.tiered import examples
from tests.typed_values import same, values

TYPES = registry()
MOMENT = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)

# Keys that read as tags when alone in a dict, at every depth of a path.
KEYS = st.sampled_from(["a", "b", "$", "$dt", "$map", "$x"])
PATHS = st.lists(KEYS, min_size=1, max_size=3).map(".".join)
TYPED = st.one_of(
    st.datetimes(
        min_value=datetime(2000, 1, 1),
        max_value=datetime(2100, 1, 1),
        timezones=st.just(timezone.utc),
    ),
    st.binary(max_size=90),  # over inline_limit once in base64
    st.uuids(),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.timedeltas(max_value=timedelta(days=900)),
    st.sets(st.integers(0, 50), max_size=4),
    st.builds(
        Message,
        role=st.sampled_from(Role),
        text=st.text(max_size=80),
        at=st.just(MOMENT),
        payload=st.binary(max_size=20),
    ),
)
SCALARS = st.one_of(PLAIN_SCALARS, TYPED)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=20),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(KEYS, inner, max_size=4),
        st.dictionaries(st.integers(0, 9), inner, min_size=1, max_size=3),  # a "$map"
    ),
    max_leaves=40,
)
CHAT = ["base", "a.$x", "$.log"]
OPS = st.one_of(
    st.tuples(st.just("set"), PATHS, VALUES),
    st.tuples(st.just("delete"), PATHS),
    st.tuples(st.just("merge"), st.dictionaries(KEYS, VALUES, max_size=2)),
    st.tuples(st.just("restore"), st.integers(0, 12)),
    st.tuples(st.just("append"), st.sampled_from(CHAT), st.lists(VALUES, max_size=3)),
    st.tuples(st.just("chat"), st.sampled_from(CHAT), st.integers(1, 8)),
    # Back to an older version, then that version's list grows again.
    st.tuples(st.just("restore_chat"), st.integers(1, 6), st.integers(1, 4)),
    st.tuples(st.just("failed"), st.sampled_from(CHAT), st.integers(1, 4)),
    st.tuples(st.just("replace"), st.sampled_from(["base", *CHAT, "a", "$"])),
    st.tuples(st.just("reorder"), st.sampled_from(CHAT)),
)


def _message(n: int) -> Any:
    """A chat message: the first 40 plain, then some typed, some of one "$" key."""
    if n < 40:
        return {"n": n, "$t": "m" * (n * 7 % 150)}
    if n % 7 == 3:
        return {"n": n, "at": MOMENT + timedelta(seconds=n), "raw": bytes([n % 256]) * (n % 60)}
    if n % 7 == 5:
        return {"$dt": f"not a datetime {n}"}  # one "$" key: stored as a "$map"
    if n % 11 == 4:
        return Message(role=Role.USER, text="m" * (n % 90), at=MOMENT)
    return {"n": n, "$t": "m" * (n * 7 % 150)}


def _chat(state: SharedState, path: str, count: int, offset: int = 0) -> None:
    for _ in range(count):
        current = state.get(path)
        state.append(path, _message(offset + (len(current) if isinstance(current, list) else 0)))


#: The edits of tests/test_subtrees.py, applied as there.
_PLAIN_EDITS: Final = frozenset({"set", "delete", "merge", "restore", "append"})


def apply(state: SharedState, op: tuple[Any, ...]) -> None:
    """One edit of ``op`` (one that cannot apply, as through a non-dict, changes nothing)."""
    kind = op[0]
    if kind in _PLAIN_EDITS:
        _apply(state, op)
        return
    try:
        if kind == "chat":
            _chat(state, op[1], op[2])
        elif kind == "restore_chat":
            state.restore(max(0, state.version - op[1]))
            _chat(state, "base", op[2], 5)  # not the messages restored away
        elif kind == "failed":  # a step that appended, failed and was rolled back
            mark = state._mark()
            _chat(state, op[1], op[2])
            state.set("a", {"$": "gone"})
            state._rewind(mark)
        elif kind == "replace":  # an equal value, other objects (set copies it)
            value = state.get(op[1])
            if value is not None:
                state.set(op[1], value)
        elif kind == "reorder":  # an equal list whose text differs: keys reversed, 1 -> 1.0
            value = state.get(op[1])
            if isinstance(value, list):
                state.set(op[1], [_reordered(item) for item in value])
    except (TypeError, ValueError):
        pass


def _reordered(item: Any) -> Any:
    if type(item) is dict:
        return {k: float(v) if type(v) is int else v for k, v in reversed(item.items())}
    return float(item) if type(item) is int else item


def _check_lineages(state: SharedState) -> None:
    """The state's lineages are bounded and true: each list starts with its older ones."""
    lineages = state._lineages()
    assert len(lineages) <= 16
    for key, (items, older) in lineages.items():
        assert key == id(items) and len(older) <= 8
        for base in older:
            assert len(base) <= len(items) and all(map(operator.is_, base, items))


def _initial() -> dict[str, Any]:
    # Plain: the split must find the tags the edits bring (and lose), not start with one.
    return {"base": [_message(n) for n in range(40)], "$": {"x": "x" * 100, "$": [1, 2]}}


def _scratch(data: dict[str, Any], previous: SplitMemory | None) -> SplitResult:
    storable = to_storable(data, "state", TYPES)
    return finish(split_work(storable, PARAMS, (), previous, inline=False, finite=True))


SPLIT_OPS = st.one_of(
    OPS,
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("from_snapshot")),  # a resumed run: every object new, the cache kept
    st.tuples(st.just("switch")),  # another SharedState saved into the same workflow
)


@examples(fast=50, full=150)
def test_cached_splits_of_typed_states_equal_splits_from_scratch(examples: int) -> None:
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(SPLIT_OPS, max_size=20))
    # Always: a list grown from an older version than the one last cut (its lineage does not
    # name that one), and a list equal to the one last cut but of another text.
    @example([("chat", "base", 3), ("checkpoint",), ("restore_chat", 3, 4)])
    @example([("checkpoint",), ("reorder", "base")])
    # A list at a "$"-key path grown past the typed messages: the escaped key in the cache.
    @example([("chat", "a.$x", 1), ("chat", "a.$x", 8), ("chat", "a.$x", 8)])
    def check(ops: list[tuple[Any, ...]]) -> None:
        values = TypedValues(TYPES)
        states = [SharedState(_initial()), SharedState(_initial())]
        states[1].set("other", {"$x": "second"})
        previous = _scratch(states[0]._peek()[0], None).memory
        assert previous is not None
        previous.first_chunks.clear()
        cache: dict[int | str, Any] = {}
        for op in [*ops, ("checkpoint",)]:
            if op[0] == "from_snapshot":
                states[0] = SharedState.from_snapshot(states[0].snapshot())
            elif op[0] == "switch":
                states.reverse()
            elif op[0] != "checkpoint":
                apply(states[0], op)
                _check_lineages(states[0])
                continue
            data, lineages = states[0]._peek()[0], states[0]._lineages()
            shared = finish(
                shared_split_work(data, values, PARAMS, previous, cache, None, lineages)
            )
            assert shared is not None
            _same(shared.split, _scratch(data, previous))
            assert shared.copy == to_storable(data, "state", TYPES)
            assert shared.tagged == (MARK in orjson.dumps(shared.copy))
            previous, cache = shared.split.memory, shared.entries
            assert previous is not None
            previous.first_chunks.clear()

    check()


# --- through managers, workflows and stores ------------------------------------------------


def _store(kind: str, root: Path) -> BlobCheckpointStorage:
    if kind == "memory":
        return InMemoryCheckpointStorage(blob_params=PARAMS)
    if kind == "sqlite":
        return SQLiteCheckpointStorage(root / "s.db", blob_params=PARAMS)
    return FileCheckpointStorage(root / "store", blob_params=PARAMS)


class Boom(Exception):
    """A step's failure."""


STEP = st.tuples(st.just("step"), st.lists(OPS, min_size=1, max_size=3))
WORKFLOW_OPS = st.one_of(
    STEP,
    STEP,
    st.tuples(st.just("save"), st.lists(OPS, min_size=1, max_size=3)),  # wf.checkpoint
    st.tuples(st.just("failed_step"), st.lists(OPS, min_size=1, max_size=3)),
    st.tuples(st.just("resume")),  # a new run of the same manager: from_snapshot
    st.tuples(st.just("other_manager")),  # a save by another manager, then this one again
    st.tuples(st.just("small")),  # a state under root_inline_limit: a version-1 record
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    kind=st.sampled_from(["memory", "sqlite", "file"]),
    ops=st.lists(WORKFLOW_OPS, max_size=10),
)
async def test_workflow_checkpoints_read_back_as_the_state_through_every_store(
    kind: str, ops: list[tuple[Any, ...]]
) -> None:
    """Each checkpoint a workflow writes (completed, failed, by another manager), read back
    by a manager with no cache, is the state, type for type; and so is what it returned."""
    with tempfile.TemporaryDirectory() as root:
        storage = _store(kind, Path(root))
        manager = CheckpointManager(storage, types=TYPES)
        other = CheckpointManager(storage, types=TYPES)
        try:
            await _run_workflow(manager, other, ops, _reader(storage))
        finally:
            await storage.close()


def _reader(storage: BlobCheckpointStorage) -> Callable[[int], Any]:
    async def read(step: int) -> dict[str, Any]:
        checkpoint = await CheckpointManager(storage, types=TYPES).get_checkpoint("wf", step)
        data: dict[str, Any] = checkpoint.state_snapshot.data
        return data

    return read


async def _run_workflow(
    manager: CheckpointManager,
    other: CheckpointManager,
    ops: list[tuple[Any, ...]],
    read: Callable[[int], Any],
) -> None:
    wf = ResumableWorkflow("wf", manager, _initial())
    step = 0
    returned: list[tuple[dict[str, Any], Any]] = []
    for op in [*ops, ("step", [])]:
        kind = op[0]
        if kind == "resume":
            wf = ResumableWorkflow("wf", manager)
            await wf.try_resume()
            assert same(wf.state.to_dict(), await read(step - 1)) if step else True
            continue
        if kind == "other_manager":
            saved = await other.create_checkpoint("wf", step, "b", "running", wf.state)
        elif kind == "save":  # what create_checkpoint returns, not what it stored
            for edit in op[1]:
                apply(wf.state, edit)
            saved = await wf.checkpoint(step, "a", "running")
        elif kind == "small":
            wf.state.update({"base": [1], "a": None, "$": None})
            saved = await wf.checkpoint(step, "a", "running")
        elif kind == "step":
            async with wf.step(step, "a"):
                for edit in op[1]:
                    apply(wf.state, edit)
            saved = await manager.get_checkpoint("wf", step)
        else:
            with pytest.raises(Boom):
                async with wf.step(step, "a"):
                    for edit in op[1]:
                        apply(wf.state, edit)
                    raise Boom
            saved = await manager.get_checkpoint("wf", step)
        expected = wf.state.to_dict()
        assert same(expected, saved.state_snapshot.data)
        assert same(expected, await read(step))
        returned.append((expected, saved))
        step += 1
    # Checkpoints returned share the copies of unchanged sub-trees: none was changed since.
    assert all(same(expected, saved.state_snapshot.data) for expected, saved in returned)


# --- which SharedStates take the cached path -------------------------------------------------


@given(values)
def test_the_text_bound_of_a_tree_before_its_copy_is_a_lower_bound(value: Any) -> None:
    """``exceeds`` is asked of a SharedState's tree itself (keys of any type, bytes, sets,
    tuples), not of its storable copy: its count must not raise, nor pass the copy's text."""
    copy = to_storable(value)
    bound = text_bound(value, 1 << 40)
    assert bound <= len(dumps(copy, finite=False).decode())
    # A tree that exceeds a limit makes a copy that does: a split the snapshot prepared
    # for a tree is the one the save takes.
    assert bound <= text_bound(copy, 1 << 40)


async def test_a_large_state_with_keys_of_other_types_is_checkpointed() -> None:
    """A dict of int keys in a large SharedState raised TypeError from ``exceeds`` (a key's
    ``len``) before anything was copied: no checkpoint of such a state could be written."""
    storage = InMemoryCheckpointStorage()
    manager = CheckpointManager(storage)
    state = SharedState({"text": "x" * 20_000, "by_id": {1: "a", 2: "b"}})  # counted first
    await manager.create_checkpoint("wf", 0, "a", "running", state)
    state.set("more", {(1, "k"): "c"})
    await manager.create_checkpoint("wf", 1, "a", "running", state)
    reader = CheckpointManager(storage)
    for step in (0, 1):
        assert (await reader.get_checkpoint("wf", step)).state_snapshot.data == (
            state.get_history()[1 - step].data
        )


async def test_a_state_whose_bulk_is_bytes_or_tuples_reuses_its_cached_sub_trees() -> None:
    """``exceeds`` counted a bytes value, a tuple or a set as one character: a state whose
    size is in them never took the cached path, and was copied and encoded whole at every
    checkpoint."""
    storage = InMemoryCheckpointStorage()
    manager = CheckpointManager(storage)
    values = CountingValues()
    manager._codec = RecordCodec(storage, storage, values)
    state = SharedState({"image": b"x" * 50_000, "rows": tuple(["y" * 100] * 200), "n": 0})
    for step in range(3):
        state.set("n", step)
        values.copied.clear()
        await manager.create_checkpoint("wf", step, "a", "running", state)
        if step:
            assert values.copied == ["state.n"]
    point = await CheckpointManager(storage).get_resume_point("wf")
    assert point is not None and point[1].data == state.to_dict()


class _Held:
    """A value that can be watched with a weak reference (a dict or a list cannot)."""


def test_lineages_keep_a_list_gone_from_the_state_only_until_sixteen_appends() -> None:
    """Lineages hold lists alive, also ones the state dropped (deleted, restored or rolled
    back away): at most the 16 lists appended to last, each with 8 it extends."""
    state = SharedState(max_history=1)
    for n in range(30):
        state.append("chat", {"n": n}, _Held())
    held = [weakref.ref(item) for item in state._peek()[0]["chat"] if type(item) is _Held]
    state.delete("chat")
    gc.collect()
    assert all(ref() is not None for ref in held)  # the chat's lineage still names it
    for n in range(16):
        state.append(f"other{n}", n)
    gc.collect()
    assert all(ref() is None for ref in held)
    _check_lineages(state)


# --- what create_checkpoint returns for a tagged state ------------------------------------------


def _tagged_state() -> SharedState:
    docs = {f"d{i}": {"id": i, "text": "z" * 500} for i in range(100)}  # ~55 KB, no tag
    events = [{"at": MOMENT + timedelta(seconds=i), "n": i} for i in range(100)]
    message = Message(role=Role.USER, text="hi", at=MOMENT)
    return SharedState({"docs": docs, "events": events, "message": message, "n": 0})


def _stored_forms(codec: RecordCodec) -> list[tuple[Any, bytes]]:
    """Each cached sub-tree's copy with its JSON text now (what a later split reuses)."""
    entries = {id(entry): entry for entry in codec.subtrees.get("wf").values()}
    return [(entry.copy, orjson.dumps(entry.copy)) for entry in entries.values()]


async def test_a_tagged_state_is_restored_without_walking_its_untagged_sub_trees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The returned checkpoint of a state with a tag is decoded into a copy, and a sub-tree
    its cache found no tag in is copied without looking for tags in it (it was walked to
    each of its 100 documents' values before)."""
    walked: list[Any] = []
    private = Decoder.private

    def counted(self: Decoder, value: Any, path: Any, plain: Any) -> Any:
        walked.append(path)
        return private(self, value, path, plain)

    monkeypatch.setattr(Decoder, "private", counted)
    storage = InMemoryCheckpointStorage()
    manager = CheckpointManager(storage, types=TYPES)
    state = _tagged_state()
    returned = []
    for step in range(3):
        state.set("n", step)
        walked.clear()
        returned.append(await manager.create_checkpoint("wf", step, "a", "running", state))
    assert ("state", "events") in walked  # the root, the events and their dicts
    assert not [path for path in walked if "docs" in repr(path)]  # not the documents
    datas = [checkpoint.state_snapshot.data for checkpoint in returned]
    assert datas[1]["docs"] is not datas[2]["docs"]
    assert datas[1]["docs"]["d7"] is not datas[2]["docs"]["d7"]
    for data in datas:
        assert same(data, {**state.to_dict(), "n": data["n"]})


async def test_a_tagged_state_returned_never_aliases_what_another_checkpoint_holds() -> None:
    """Restoring changes none of the cached sub-trees' copies (a later checkpoint splits
    them again), and each returned checkpoint has containers and typed values of its own:
    changing them changes no other checkpoint, nor what a later one stores."""
    storage = InMemoryCheckpointStorage()
    manager = CheckpointManager(storage, types=TYPES)
    codec = manager._codec
    state = _tagged_state()
    first = await manager.create_checkpoint("wf", 0, "a", "running", state)
    before = _stored_forms(codec)
    state.set("n", 1)
    second = await manager.create_checkpoint("wf", 1, "a", "running", state)
    assert [orjson.dumps(copy) for copy, _ in before] == [text for _, text in before]
    one, two = first.state_snapshot.data, second.state_snapshot.data
    assert one["events"] is not two["events"]
    assert one["events"][0] is not two["events"][0]
    assert one["message"] is not two["message"]
    assert one["docs"] is not two["docs"]
    assert one["docs"]["d7"] is not two["docs"]["d7"]
    one["events"][0]["at"] = None
    one["events"].append("more")
    one["message"].text = "changed"
    one["docs"]["d7"]["text"] = "changed"  # a sub-tree without tags, cached
    del one["docs"]["d8"]
    state.set("n", 2)
    third = await manager.create_checkpoint("wf", 2, "a", "running", state)
    expected = state.to_dict()
    assert same(third.state_snapshot.data, expected)
    assert same(two, {**expected, "n": 1})
    stored = await CheckpointManager(storage, types=TYPES).get_checkpoint("wf", 2)
    assert same(stored.state_snapshot.data, expected)


@given(VALUES)
def test_the_text_bound_counts_registered_values_no_longer_than_their_text(value: Any) -> None:
    """A registered type's value (a model, a dataclass, an enum) in a SharedState's tree is
    counted as the shortest "$" tag: at most its stored text."""
    copy = to_storable(value, types=TYPES)
    assert text_bound(value, 1 << 40) <= len(dumps(copy, finite=False).decode())


class _Z(enum.Enum):
    Z = 0


def test_the_shortest_registered_value_is_counted_as_its_text() -> None:
    """The count's constant for a registered value is the shortest text one can have."""
    types = TypeRegistry()
    types.register(_Z, name="N")
    text = dumps(to_storable([_Z.Z], types=types), finite=False)
    assert text == b'[{"$":["N",1,0]}]'
    assert text_bound([_Z.Z], 1 << 40) == len(text)


class _CountingTyped(TypedValues):
    """The value stage with the tests' types, noting the path of each copy in slices."""

    def __init__(self) -> None:
        super().__init__(TYPES)
        self.copied: list[tuple[str, int]] = []

    def copy_work(self, value: Any, path: str) -> Any:
        self.copied.append((path, len(value) if isinstance(value, list) else -1))
        return super().copy_work(value, path)


async def test_a_chat_of_registered_models_reuses_its_cached_sub_trees() -> None:
    """A model counted as one character made a chat of 1,000 models look small: it was
    copied and split whole at every checkpoint. Now only the appended message is copied."""
    storage = InMemoryCheckpointStorage()
    manager = CheckpointManager(storage, types=TYPES)
    values = _CountingTyped()
    manager._codec = RecordCodec(storage, storage, values)
    messages = [Message(role=Role.USER, text=str(n), at=MOMENT) for n in range(1000)]
    state = SharedState({"chat": messages})
    for step in range(3):
        state.append("chat", Message(role=Role.TOOL, text=f"more {step}", at=MOMENT))
        values.copied.clear()
        returned = await manager.create_checkpoint("wf", step, "a", "running", state)
        if step:
            assert values.copied == [("state.chat", 1)]
        assert same(returned.state_snapshot.data, state.to_dict())
    reader = CheckpointManager(storage, types=TYPES)
    assert same((await reader.get_checkpoint("wf", 2)).state_snapshot.data, state.to_dict())


@pytest.mark.parametrize("kind", ["memory", "sqlite", "file"])
async def test_a_plain_state_returned_can_be_changed_without_harm(kind: str) -> None:
    """A SharedState without tags, large enough for a tree: what ``create_checkpoint``
    returns is the caller's own. Changing it in place changes neither the state, nor the
    cached sub-trees (the next checkpoint reads back as the state), nor an earlier return."""
    with tempfile.TemporaryDirectory() as root:
        storage = _store(kind, Path(root))
        manager = CheckpointManager(storage)
        try:
            state = SharedState({"chat": [{"n": n, "text": "m" * 200} for n in range(200)]})
            first = await manager.create_checkpoint("wf", 0, "a", "running", state)
            state.append("chat", {"n": 200, "text": "new"})
            second = await manager.create_checkpoint("wf", 1, "a", "running", state)
            returned = second.state_snapshot.data
            assert returned == state.to_dict()
            assert returned["chat"][0] is not first.state_snapshot.data["chat"][0]
            returned["chat"][-1]["text"] = "changed by the caller"
            returned["chat"][5]["text"] = "changed by the caller"
            del returned["chat"][7]
            assert first.state_snapshot.data["chat"][5]["text"] == "m" * 200
            state.append("chat", {"n": 201, "text": "newer"})
            third = await manager.create_checkpoint("wf", 2, "a", "running", state)
            expected = state.to_dict()
            assert expected["chat"][5]["text"] == "m" * 200
            assert third.state_snapshot.data == expected
            stored = await CheckpointManager(storage).get_checkpoint("wf", 2)
            assert stored.state_snapshot.data == expected
        finally:
            await storage.close()


async def test_a_plain_state_returned_is_copied_at_its_first_read_only() -> None:
    """The returned snapshot holds the cache's tree until ``data`` is first read (a caller
    that never reads it pays no copy), then the copy; it equals and shows as the stored one."""
    storage = InMemoryCheckpointStorage(blob_params=PARAMS)
    manager = CheckpointManager(storage)
    state = SharedState({"chat": [{"n": n, "text": "m" * 200} for n in range(200)]})
    returned = (await manager.create_checkpoint("wf", 0, "a", "running", state)).state_snapshot
    shared = returned.__dict__["data"]
    state.append("chat", {"n": 200})
    later = (await manager.create_checkpoint("wf", 1, "a", "running", state)).state_snapshot
    assert later.__dict__["data"]["chat"][0] is shared["chat"][0]  # the cache's sub-tree
    stored = (await CheckpointManager(storage).get_checkpoint("wf", 0)).state_snapshot
    assert returned == stored and stored == returned
    assert returned.__dict__["data"] is shared  # comparing does not copy
    assert repr(returned).startswith("StateSnapshot(")
    copy = returned.data
    assert copy is not shared and copy == shared and returned.data is copy
    assert copy["chat"][3] is not shared["chat"][3]
    assert returned.model_dump()["data"] == stored.data
    lent = (await manager.create_checkpoint("wf", 2, "a", "running", state)).state_snapshot
    tree = lent.__dict__["data"]
    got = dict(lent)["data"]
    assert got is not tree and got == tree and got is lent.data


# A dict of one "$" key over a list longer than the sliced copy's batch (16 elements): the
# sliced copy of SharedState checkpoints stored it unescaped, so it was read back as a tag:
# an unknown one made the checkpoint unreadable, a known one another value.
_BASE: Final = [_message(n) for n in range(40)]  # over root_inline_limit: a tree
ONE_TAG_KEY_STATES: Final = [
    {"base": _BASE, "a": {"$x": [_message(n) for n in range(17)]}},  # unknown tag "$x"
    {"base": _BASE, "a": {"$set": list(range(20))}},  # read back as a set
    {"base": _BASE, "a": {"$map": [[n, n] for n in range(20)]}},  # a malformed "$map": unreadable
    {"$tup": list(range(20))},  # the whole state (not split: copied in slices whole)
]


@pytest.mark.parametrize("incremental", [True, False])
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("initial", ONE_TAG_KEY_STATES)
async def test_one_tag_key_dicts_of_long_lists_resume_as_saved(
    kind: str, initial: dict[str, Any], incremental: bool
) -> None:
    """SharedState checkpoints of ``{"$x": [17 items]}``, then of it appended to, resume as
    the states saved, read by a manager without a cache."""
    with tempfile.TemporaryDirectory() as root:
        storage = _store(kind, Path(root))
        try:
            manager = CheckpointManager(storage, incremental=incremental, types=TYPES)
            wf = ResumableWorkflow("wf", manager, json_copy(initial))
            saved = []
            for step in range(3):
                async with wf.step(step, "a"):
                    if step and "a" in initial:
                        wf.state.append(f"a.{next(iter(initial['a']))}", step, step)
                saved.append(wf.state.to_dict())
            assert saved[0] == initial
            for step, expected in enumerate(saved):
                resumed = await _reader(storage)(step)
                assert same(resumed, expected)
            again = ResumableWorkflow("wf", CheckpointManager(storage, types=TYPES))
            await again.try_resume()
            assert same(again.state.to_dict(), saved[-1])
        finally:
            await storage.close()
