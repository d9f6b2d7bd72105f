"""Cached sub-tree encodings of SharedState checkpoints (issue 21).

The cache must be invalidated exactly when a sub-tree changes: random edit sequences
through a SharedState (set, delete, merge, restore, the rollback of a failed step) are
split with the cache and from scratch with the same split memory, and must agree byte for
byte; and through a manager, only what changed goes through the value stage.
"""

from __future__ import annotations

import contextlib
import operator
import sqlite3
import zlib
from collections.abc import AsyncIterator, Generator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiocheckpoint import CheckpointManager, CheckpointStorage, SharedState, open_storage
from aiocheckpoint.codec.copy import to_storable
from aiocheckpoint.codec.pipeline import RecordCodec
from aiocheckpoint.codec.sliced import finish
from aiocheckpoint.codec.stages import TypedValues
from aiocheckpoint.codec.tree import subtrees
from aiocheckpoint.codec.tree.crc import _bits_shift, crc_combine, crc_shift
from aiocheckpoint.codec.tree.nodes import Node, NodeSet
from aiocheckpoint.codec.tree.split import Splitter as _Splitter
from aiocheckpoint.codec.tree.split import split_work
from aiocheckpoint.codec.tree.subtrees import shared_split_work
from aiocheckpoint.format.tags import MARK
from aiocheckpoint.format.tree import SplitMemory, SplitResult, TreeParams
from aiocheckpoint.storage.base import BlobCheckpointStorage
from tests.pg_support import DSN, pg_schema
from tests.tiered import examples

__all__ = ["pg_schema"]

# Small nodes, so that a few KB of state is cut into chunks, regions and index levels.
PARAMS = TreeParams(
    inline_limit=64,
    root_inline_limit=256,
    chunk_min=32,
    chunk_avg=128,
    chunk_max=512,
    bundle_chunks=4,
    bundle_max=1024,
)


@given(st.binary(max_size=3000), st.binary(max_size=3000))
def test_crc_combine_is_the_crc_of_the_concatenation(a: bytes, b: bytes) -> None:
    assert crc_combine(zlib.crc32(a), zlib.crc32(b), crc_shift(len(b))) == zlib.crc32(a + b)


@given(st.integers(0, 2**48))
def test_crc_shift_by_bytes_is_the_shift_by_bits(length: int) -> None:
    """The operator made of memoized per-byte factors is the one made bit by bit."""
    assert crc_shift(length) == _bits_shift(length)


def test_crc_shift_of_a_long_text() -> None:
    head, zeros = b"head", bytes(5_000_123)  # three bytes of length, none of them zero
    combined = crc_combine(zlib.crc32(head), zlib.crc32(zeros), crc_shift(len(zeros)))
    assert combined == zlib.crc32(head + zeros)
    assert crc_shift(0) == 1 << 31  # no bytes: the identity


KEYS = st.sampled_from(["a", "b", "c", "d"])
PATHS = st.lists(KEYS, min_size=1, max_size=3).map(".".join)
SCALARS = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.integers(70, 300).map(lambda n: "x" * n),  # over inline_limit: a node of its own
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=30), st.dictionaries(KEYS | st.text(max_size=3), inner)
    ),
    max_leaves=60,
)
OPS = st.one_of(
    st.tuples(st.just("set"), PATHS, VALUES),
    st.tuples(st.just("delete"), PATHS),
    st.tuples(st.just("merge"), st.dictionaries(KEYS, VALUES, max_size=2)),
    st.tuples(st.just("restore"), st.integers(0, 30)),
    st.tuples(st.just("failed_step"), PATHS, VALUES),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("append"), st.sampled_from(["base", "a.log", "b"]), st.lists(VALUES)),
    st.tuples(st.just("chat"), st.integers(1, 6)),
)


def _apply(state: SharedState, op: tuple[Any, ...]) -> None:
    kind = op[0]
    try:
        if kind == "set":
            state.set(op[1], op[2])
        elif kind == "delete":
            state.delete(op[1])
        elif kind == "merge":
            state.merge(op[1])
        elif kind == "restore":
            state.restore(max(0, state.version - op[1]))
        elif kind == "append":
            state.append(op[1], *op[2])
        elif kind == "chat":  # the growing chat: a long list, appended to one by one
            _chat(state, op[1])
        elif kind == "failed_chat":  # a step that appended, failed and was rolled back
            mark = state._mark()
            _chat(state, op[1])
            state._rewind(mark)
        elif kind == "failed_step":
            # What a workflow does when a step fails: its changes are rolled back.
            mark = state._mark()
            state.set(op[1], op[2])
            state._rewind(mark)
    except (TypeError, ValueError):  # a path through a non-dict, a version out of history
        pass


def _chat(state: SharedState, messages: int) -> None:
    for _ in range(messages):
        n = len(state.get("base", []))
        state.append("base", {"n": n, "t": "m" * (n * 7 % 150)})


def _scratch(data: dict[str, Any], previous: SplitMemory | None) -> SplitResult:
    work = split_work(to_storable(data), PARAMS, (), previous, inline=False, finite=True)
    return finish(work)


def _same(cached: SplitResult, scratch: SplitResult) -> None:
    assert cached.root == scratch.root
    assert cached.blobs == scratch.blobs
    assert list(cached.children.items()) == list(scratch.children.items())  # post-order too
    assert cached.root_refs == scratch.root_refs
    assert cached.text_crc == scratch.text_crc
    assert cached.memory is not None and scratch.memory is not None
    assert cached.memory.regions == scratch.memory.regions
    assert cached.memory.edges == scratch.memory.edges
    # Both count their blobs' bytes as they make and adopt them, repeats once.
    assert cached.blob_bytes == scratch.blob_bytes == sum(map(len, scratch.blobs.values()))
    assert cached.blob_max == scratch.blob_max == max(map(len, scratch.blobs.values()), default=0)


# Mostly a growing chat, checkpointed often, with the other edits in between.
CHAT_OPS = st.one_of(
    st.tuples(st.just("chat"), st.integers(1, 12)),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("chat"), st.integers(1, 3)),
    st.tuples(st.just("failed_chat"), st.integers(1, 3)),
    OPS,
)


@examples(fast=50, full=150)
def test_cached_split_equals_a_split_from_scratch(examples: int) -> None:
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(OPS, max_size=25))
    def check(ops: list[tuple[Any, ...]]) -> None:
        _check_cached_splits(ops)

    check()


@examples(fast=50, full=150)
def test_cached_split_of_a_growing_chat_equals_a_split_from_scratch(examples: int) -> None:
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(CHAT_OPS, max_size=30))
    def check(
        ops: list[tuple[Any, ...]],
    ) -> None:
        _check_cached_splits(ops)

    check()


def test_a_chat_message_cut_into_regions_of_its_own_is_remembered_when_resumed() -> None:
    """A large element of a growing list is cut into regions itself: a cut resumed past it
    keeps those regions in the split's memory, as the split from scratch does."""
    big = {f"k{i}": "x" * (40 + i % 50) for i in range(120)}
    ops: list[tuple[Any, ...]] = [("chat", 11), ("checkpoint",), ("append", "base", [big])]
    _check_cached_splits([*ops, *[op for _ in range(8) for op in (("chat", 4), ("checkpoint",))]])


def _check_cached_splits(ops: list[tuple[Any, ...]]) -> None:
    state = SharedState({"base": [{"n": i, "t": "y" * (i % 90)} for i in range(40)]})
    previous = _scratch(state._peek()[0], None).memory
    assert previous is not None
    previous.first_chunks.clear()
    cache: dict[int | str, Any] = {}
    for op in [*ops, ("checkpoint",)]:
        _apply(state, op)
        if op[0] != "checkpoint":
            continue
        data = state._peek()[0]
        lineages = state._lineages()
        work = shared_split_work(data, TypedValues(), PARAMS, previous, cache, None, lineages)
        shared = finish(work)
        assert shared is not None
        _same(shared.split, _scratch(data, previous))
        assert shared.copy == to_storable(data)
        assert shared.tagged == (MARK in orjson.dumps(shared.copy))
        previous, cache = shared.split.memory, shared.entries
        assert previous is not None
        previous.first_chunks.clear()
    # Nothing changed since: the whole tree is adopted from the cache, copy included.
    again = finish(shared_split_work(data, TypedValues(), PARAMS, previous, cache, None))
    assert again is not None and again.copy is shared.copy
    _same(again.split, _scratch(data, previous))


def test_an_append_cuts_only_the_lists_last_region() -> None:
    """A long list that grows is cut again from its last region's end, not from its start."""
    values = CountingValues()
    state = SharedState({"chat": [{"n": n, "t": "m" * (n % 90)} for n in range(400)]})
    shared = finish(shared_split_work(state._peek()[0], values, PARAMS, None, {}, None))
    assert shared is not None and shared.split.memory is not None
    previous, cache = shared.split.memory, shared.entries
    for n in range(400, 430):
        state.append("chat", {"n": n, "t": "new"})
        values.sizes.clear()
        data = state._peek()[0]
        shared = finish(shared_split_work(data, values, PARAMS, previous, cache, None))
        assert shared is not None
        _same(shared.split, _scratch(data, previous))
        assert values.sizes == [1]  # the new message alone went through the value stage
        entry = shared.entries["state.chat"]
        assert entry.scan is not None and entry.scan.index > n - 40  # resumed near the end
        assert shared.split.memory is not None
        previous, cache = shared.split.memory, shared.entries
    assert shared.copy == to_storable(data)


def test_an_appended_list_resumes_its_cut_without_comparing_its_elements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the state's lineages, a list made by appending (once or several times) to the
    list last cut is known to extend it: its elements are not compared one by one."""
    calls = []

    def counted_is(a: Any, b: Any) -> bool:
        calls.append(1)
        return a is b

    monkeypatch.setattr(subtrees, "is_", counted_is)
    state = SharedState({"chat": [{"n": n, "t": "m" * (n % 30)} for n in range(300)]})
    shared = finish(shared_split_work(state._peek()[0], TypedValues(), PARAMS, None, {}, None))
    assert shared is not None and shared.split.memory is not None
    previous, cache = shared.split.memory, shared.entries
    for n in range(300, 330, 3):
        for k in range(n, n + 1 + n % 3):  # one to three appends between two checkpoints
            state.append("chat", {"n": k, "t": "new"})
        data, lineages = state._peek()[0], state._lineages()
        calls.clear()
        work = shared_split_work(data, TypedValues(), PARAMS, previous, cache, None, lineages)
        shared = finish(work)
        assert shared is not None and shared.split.memory is not None
        assert len(calls) <= 3  # the lineage named the list last cut, not 300 comparisons
        assert shared.entries["state.chat"].scan is not None  # resumed
        _same(shared.split, _scratch(data, previous))
        previous, cache = shared.split.memory, shared.entries
    state.set("chat", [*state._peek()[0]["chat"], {"n": -1}])  # a new list: no lineage
    data = state._peek()[0]
    calls.clear()
    work = shared_split_work(data, TypedValues(), PARAMS, previous, cache, None, state._lineages())
    shared = finish(work)
    assert shared is not None
    assert len(calls) == 1  # compared: set() copied the elements, the first one differs
    _same(shared.split, _scratch(data, previous))


def test_cached_entries_hold_on_to_no_earlier_splits_log() -> None:
    """An entry points into its split's log until it is adopted whole; then it copies its
    nodes out, and so do the entries inside it: none keeps an older log (and the nodes of
    sub-trees that changed since) alive."""
    state = SharedState({"docs": {f"k{i}": f"{i} " + "x" * 100 for i in range(40)}})
    previous: SplitMemory | None = None
    cache: dict[int | str, Any] = {}
    for n in range(4):
        state.set("note", f"{n} " + "y" * 300)
        data = state._peek()[0]
        shared = finish(shared_split_work(data, TypedValues(), PARAMS, previous, cache, None))
        assert shared is not None
        _same(shared.split, _scratch(data, previous))
        logs = {id(e.span[0]) for e in shared.entries.values() if e.span is not None}
        assert len(logs) == 1  # this split's (the root's, the note's)
        assert n == 0 or shared.entries[id(data["docs"])].span is None  # adopted: settled
        previous, cache = shared.split.memory, shared.entries


@given(
    st.lists(st.lists(st.integers(0, 12), max_size=8), max_size=5),
    st.sets(st.integers(0, 12), max_size=3),
)
def test_adopting_node_sets_counts_what_adopting_their_nodes_counts(
    sets: list[list[int]], known_ids: set[int]
) -> None:
    """Node sets that share nodes with the split (or not) add what their nodes one by one
    add: each node's bytes and its blob's once."""

    def node(i: int) -> Node:
        h = bytes([i]) * 16  # one hash, one node: the same i is the same node everywhere
        return (h, (), b"\x00" + b"n" * (i + 1), i + 3, i + 1)

    known = {bytes([i]) * 16 for i in known_ids}
    by_sets, one_by_one = _Splitter(PARAMS, known, None), _Splitter(PARAMS, known, None)
    for members in sets:
        nodes = [node(i) for i in members]
        by_sets.adopt_set(NodeSet(nodes))
        one_by_one.adopt(nodes, ())
    for name in ("children", "sizes", "blobs", "node_bytes", "blob_bytes", "blob_max"):
        assert getattr(by_sets, name) == getattr(one_by_one, name), name
    assert by_sets.blob_bytes == sum(map(len, by_sets.blobs.values()))


def test_a_lineage_names_the_lists_an_appended_list_extends() -> None:
    state = SharedState()
    state.append("chat", 1)
    first = state._peek()[0]["chat"]
    state.append("chat", 2)
    second = state._peek()[0]["chat"]
    state.append("chat", 3)
    third = state._peek()[0]["chat"]
    lineage = state._lineages()[id(third)]
    assert lineage[0] is third
    assert lineage[1][0] is second and lineage[1][1] is first and lineage[1][2] == []
    assert id(second) not in state._lineages()  # handed on to the list that extends it
    state.set("chat", [1, 2, 3, 4])
    assert id(state._peek()[0]["chat"]) not in state._lineages()
    for n in range(40):  # other lists appended to: the oldest lineages are dropped
        state.append(f"other{n}", n)
    assert id(third) not in state._lineages() and len(state._lineages()) <= 16


def test_an_append_takes_the_open_regions_chunks_from_the_last_cut() -> None:
    """The chunks after the list's last region end that an append leaves as they were are
    taken from the last cut (the same nodes), not encoded and hashed again, and so are the
    elements' texts there; the split is still the one made from scratch."""
    state = SharedState({"chat": [{"n": n, "t": "m" * (n % 30)} for n in range(300)]})
    shared = finish(shared_split_work(state._peek()[0], TypedValues(), PARAMS, None, {}, None))
    assert shared is not None and shared.split.memory is not None
    previous, cache = shared.split.memory, shared.entries
    taken = reused = 0
    for n in range(300, 360):
        before = cache["state.chat"].scan
        assert before is not None
        state.append("chat", {"n": n, "t": "m" * (n % 30)})
        data = state._peek()[0]
        shared = finish(shared_split_work(data, TypedValues(), PARAMS, previous, cache, None))
        assert shared is not None and shared.split.memory is not None
        _same(shared.split, _scratch(data, previous))
        after = shared.entries["state.chat"].scan
        assert after is not None
        both = before.chunk_memo.keys() & after.chunk_memo.keys()
        assert all(before.chunk_memo[r] is after.chunk_memo[r] for r in both)
        if n > 300:  # the first cut with a memory cuts the open region into chunks
            assert len(after.chunk_memo.keys() - both) <= 2  # the new message's chunk(s)
        # The elements after the region end were not encoded again: the same texts.
        assert before.tail is not None and after.tail is not None
        old_texts = before.tail.items[after.index - before.index :]
        assert len(old_texts) == max(0, n - after.index)
        assert all(map(operator.is_, old_texts, after.tail.items))
        reused += len(old_texts)
        taken += len(both)
        previous, cache = shared.split.memory, shared.entries
    assert taken > 60 and reused > 60


async def test_tagged_values_come_back_typed_from_a_cached_split(tmp_path: Path) -> None:
    """A checkpoint that reused the cache still hands typed values back as themselves
    (the split knows which sub-trees hold tags), and plain ones as they are."""
    when = datetime(2026, 12, 1, 12, 30, tzinfo=timezone.utc)
    storage = open_storage(f"sqlite://{tmp_path / 's.db'}")
    manager = CheckpointManager(storage)
    chat = [{"n": n, "text": "w" * 500} for n in range(40)]
    state = SharedState({"chat": chat, "notes": {"text": "q" * 3000}})
    try:
        for step in range(4):
            if step == 2:
                state.append("chat", {"n": 40, "at": when})
            else:
                state.append("chat", {"n": 40 + step, "text": "plain"})
            saved = await manager.create_checkpoint("wf", step, "a", "running", state)
            last = saved.state_snapshot.data["chat"]
            assert last[-1] == state.get("chat")[-1]
            if step >= 2:
                assert [m for m in last if "at" in m] == [{"n": 40, "at": when}]
        point = await manager.get_resume_point("wf")
        assert point is not None and point[1].data["chat"][42] == {"n": 40, "at": when}
    finally:
        await storage.close()


def test_a_dict_of_one_dollar_key_is_not_walked_key_by_key() -> None:
    """A user's dict whose one key starts with "$" would read as a tag: the value stage
    stores it as "$map", so the walk takes it whole (it had stored it as it was: a cached
    split that differed from the split from scratch, found by the hypothesis test)."""
    _check_cached_splits([("merge", {"a": {"a": None, "b": {"$": None}}})])
    _check_cached_splits([("set", "a", {"$dt": "x" * 300}), ("chat", 20)])
    state = SharedState({"$dt": "not a datetime " + "x" * 300})  # the whole state
    data = state._peek()[0]
    assert finish(shared_split_work(data, TypedValues(), PARAMS, None, {}, None)) is None


async def test_a_dict_of_one_dollar_key_comes_back_as_it_was(tmp_path: Path) -> None:
    """It was stored unescaped, and the checkpoint could not be read back (corrupted)."""
    url = f"sqlite://{tmp_path / 's.db'}"
    storage = open_storage(url)
    manager = CheckpointManager(storage)
    state = SharedState({"a": {"b": {"$": None}, "c": "y" * 9000}, "d": {"$dt": "x" * 300}})
    try:
        for step in range(3):  # a state over root_inline_limit: a tree
            state.set("n", "z" * (3000 + step))
            await manager.create_checkpoint("wf", step, "a", "running", state)
    finally:
        await storage.close()
    reader = open_storage(url)  # another manager: what the store holds, decoded
    try:
        point = await CheckpointManager(reader).get_resume_point("wf")
        assert point is not None and point[1].data == state.to_dict()
    finally:
        await reader.close()


async def test_a_chat_written_whole_goes_on_growing_with_resumed_cuts(tmp_path: Path) -> None:
    """A store written without the cache (plain dict states: every list cut from its start,
    as before resumed cuts existed) is read back and continued by a new manager through a
    SharedState: each resumed checkpoint reads back exactly, and shares the old blobs."""
    url = f"sqlite://{tmp_path / 's.db'}"
    messages = [{"n": n, "text": f"{n}" * 300} for n in range(60)]
    storage = open_storage(url)
    manager = CheckpointManager(storage)
    for step in range(3):
        state = {"chat": messages[: 50 + step]}
        await manager.create_checkpoint("wf", step, "a", "running", state)
    await storage.close()
    before = _blob_count(tmp_path / "s.db")
    storage = open_storage(url)
    manager = CheckpointManager(storage)
    values = CountingValues()
    assert isinstance(storage, BlobCheckpointStorage)
    manager._codec = RecordCodec(storage, storage, values)
    try:
        point = await manager.get_resume_point("wf")
        assert point is not None
        state = SharedState.from_snapshot(point[1])
        for step in range(3, 10):
            state.append("chat", messages[49 + step])
            values.sizes.clear()
            await manager.create_checkpoint("wf", step, "a", "running", state)
            if step >= 5:  # after the first save of this manager and one to fill the cache
                assert values.sizes == [1]
            checkpoint = await manager.get_checkpoint("wf", step)
            assert checkpoint.state_snapshot.data == {"chat": messages[: 50 + step]}
        old = await manager.get_checkpoint("wf", 0)
        assert old.state_snapshot.data == {"chat": messages[:50]}
    finally:
        await storage.close()
    # Each step adds its chunk, the last region's and the index path, not the whole list.
    assert _blob_count(tmp_path / "s.db") - before < 7 * 12


def _blob_count(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        count: int = db.execute("SELECT count(*) FROM blobs").fetchone()[0]
    return count


class CountingValues(TypedValues):
    """The default value stage, counting the bytes of JSON text it copies in slices."""

    def __init__(self) -> None:
        super().__init__()
        self.copied: list[str] = []
        self.sizes: list[int] = []

    def copy_work(self, value: Any, path: str) -> Generator[None, None, tuple[Any, bool]]:
        self.copied.append(path)
        self.sizes.append(len(value) if isinstance(value, list) else -1)
        return super().copy_work(value, path)


BIG = [{"id": i, "text": "z" * 1000} for i in range(300)]


async def test_a_manager_copies_and_encodes_only_what_changed(
    any_blob_storage: CheckpointStorage,
) -> None:
    assert isinstance(any_blob_storage, BlobCheckpointStorage)
    manager = CheckpointManager(any_blob_storage)
    values = CountingValues()
    manager._codec = RecordCodec(any_blob_storage, any_blob_storage, values)
    state = SharedState({"documents": BIG, "notes": {"a": "q" * 3000, "b": 1}, "counter": 0})
    for step in range(4):
        state.set("counter", step)
        if step == 3:
            state.set("notes.b", 2)
        values.copied.clear()
        await manager.create_checkpoint("wf", step, "agent", "completed", state)
        if step:  # the first save fills the cache
            assert "state.documents" not in values.copied
            assert "state" not in values.copied
    assert "state.notes.b" in values.copied and "state.notes.a" not in values.copied
    point = await manager.get_resume_point("wf")
    assert point is not None and point[1].data == state.to_dict()
    checkpoint = await manager.get_checkpoint("wf", 2)
    assert checkpoint.state_snapshot.data["notes"]["b"] == 1


@pytest.fixture(params=["memory", "file", "sqlite", "postgres"])
async def any_blob_storage(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[CheckpointStorage]:
    """Each backend that keeps blobs (version-2 trees), fresh."""
    if request.param == "postgres":
        url, options = DSN, {"schema": pg_schema, "max_size": 2}
    elif request.param == "memory":
        url, options = "memory://", {}
    elif request.param == "file":
        url, options = f"file://{tmp_path / 'store'}", {}
    else:
        url, options = f"sqlite://{tmp_path / 's.db'}", {}
    storage = open_storage(url, **options)
    yield storage
    await storage.close()
