"""Large values off the event loop, and resume at the floor (issue 21).

The encoder's slices and worker-thread jobs must write the bytes one call would: a long
string or list encoded in slices, and large texts checksummed, copied and hashed by jobs,
give the same text and the same split byte for byte. On the reading side, the fast parser
reads what the fast encoder wrote exactly, the tag check agrees with a plain search, and
typed values still come back typed whether they sit in the state or in the metadata.
"""

from __future__ import annotations

import asyncio
import gc
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiocheckpoint import CheckpointCorruptedError, CheckpointManager, SharedState, open_storage
from aiocheckpoint.codec.pacing import Pacer
from aiocheckpoint.codec.pipeline import cooperate
from aiocheckpoint.codec.tree import join, split
from aiocheckpoint.codec.tree.join import join_state
from aiocheckpoint.codec.tree.v2 import decode_checkpoint_v2, encode_checkpoint_v2
from aiocheckpoint.format.jsonread import loads, loads_fast
from aiocheckpoint.format.tags import MARK, may_hold_tag
from aiocheckpoint.format.tree import TreeParams
from aiocheckpoint.models import AgentStatus, Checkpoint, StateSnapshot
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from tests.test_subtrees import PARAMS
from tests.tiered import examples

TEXT = st.text(st.characters(codec="utf-8"), max_size=60)
SCALARS = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=20,
)
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: For states of several lists of 30-200 values: each example holds hundreds of values
#: (thousands of leaves) and costs Hypothesis up to a second to draw, so 30 of them cover as
#: many values as the smaller-valued properties' 80 (the slow tier's count; the fast tier
#: draws 10, tests/tiered.py). Many draws overrun Hypothesis's buffer
#: and are discarded (as with 80): with fewer examples that can trip the data_too_large
#: health check before enough are drawn, so it is off here.
LARGE_STATES = settings(
    SETTINGS,
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextmanager
def small_offload() -> Iterator[None]:
    """Slice and offload from a few bytes on, so that small values take every path."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(split, "OFFLOAD_BYTES", 7)
        yield


@SETTINGS
@given(st.lists(VALUES, max_size=300) | TEXT.map(lambda t: t * 9))
def test_sliced_encoding_writes_what_one_call_writes(value: Any) -> None:
    with small_offload():
        assert split.finish(split.dumps_work(value)) == orjson.dumps(value)


def _split(state: dict[str, Any]) -> split.SplitResult:
    work = split.split_work(state, PARAMS, (), None, inline=False, finite=True)
    return split.finish(work)


LONG_LISTS = st.dictionaries(
    st.sampled_from(["a", "b", "c"]),
    st.lists(VALUES, min_size=60, max_size=200) | TEXT.map(lambda t: t * 40),
    min_size=1,
)


@examples(fast=4, full=30)
def test_jobs_and_slices_make_the_same_split(examples: int) -> None:
    @settings(LARGE_STATES, max_examples=examples)
    @given(LONG_LISTS)
    def check(state: dict[str, Any]) -> None:
        state["pad"] = "p" * 300  # over root_inline_limit: always a tree
        whole = _split(state)
        with small_offload():
            sliced = _split(state)
        assert sliced.root == whole.root
        assert sliced.blobs == whole.blobs
        assert list(sliced.children.items()) == list(whole.children.items())
        assert sliced.text_crc == whole.text_crc

    check()


async def test_cooperate_runs_jobs_in_a_worker_thread() -> None:
    def work() -> Generator[Any, Any, int]:
        yield None
        ident = yield from split.job(threading.get_ident)
        return int(ident)

    assert await cooperate(work()) != threading.get_ident()


@given(st.binary(max_size=40) | st.lists(st.sampled_from([b"{", b'"', b"$", b"a"])).map(b"".join))
def test_the_tag_check_agrees_with_a_search_for_the_mark(text: bytes) -> None:
    assert may_hold_tag(text) == (MARK in text)
    assert may_hold_tag(bytearray(text)) == (MARK in text)


@SETTINGS
@given(VALUES)
def test_the_fast_parser_reads_fast_encoded_text_exactly(value: Any) -> None:
    text = orjson.dumps(value)
    fast, exact = loads_fast(bytearray(text)), loads(text)
    assert fast == exact
    assert orjson.dumps(fast) == text  # same types: an int stays an int, a float a float


def test_the_fast_parser_falls_back_to_the_exact_one() -> None:
    assert math.isnan(loads_fast(b"[NaN]")[0])
    assert loads_fast(b"[1e400]") == [math.inf]
    with pytest.raises(CheckpointCorruptedError):
        loads_fast(b'"\\ud800"')
    with pytest.raises(UnicodeDecodeError):
        loads_fast(b'"\xed\xa0\x80"')


def _big_state(extra: dict[str, Any]) -> dict[str, Any]:
    return {"docs": [{"id": i, "text": "word " * 60} for i in range(400)], **extra}


@pytest.mark.parametrize("url", ["file://{dir}/store", "sqlite://{dir}/store.db"])
async def test_typed_values_in_a_large_shared_state_come_back_typed(
    tmp_path: Path, url: str
) -> None:
    when = datetime(2026, 12, 1, 21, 0, tzinfo=UTC)
    async with CheckpointManager(open_storage(url.format(dir=tmp_path))) as manager:
        plain = SharedState(_big_state({"n": 1}))
        typed = SharedState(_big_state({"when": when}))
        returned = await manager.create_checkpoint("plain", 1, "a", "completed", plain)
        assert returned.state_snapshot.data == _big_state({"n": 1})
        meta = await manager.create_checkpoint(
            "plain", 2, "a", "completed", plain, metadata={"at": when}
        )
        assert meta.metadata == {"at": when}  # an untagged state, typed metadata
        returned = await manager.create_checkpoint("typed", 1, "a", "completed", typed)
        assert returned.state_snapshot.data["when"] == when
        typed.set("n", 2)  # the datetime's sub-tree is adopted from the cache
        returned = await manager.create_checkpoint("typed", 2, "a", "completed", typed)
        assert returned.state_snapshot.data["when"] == when
    async with CheckpointManager(open_storage(url.format(dir=tmp_path))) as manager:
        plain_back = await manager.get_resume_point("plain")
        typed_back = await manager.get_resume_point("typed")
        latest = await manager.get_latest_checkpoint("plain")
    assert plain_back is not None and typed_back is not None and latest is not None
    assert plain_back[1].data == _big_state({"n": 1})
    assert latest.metadata == {"at": when}
    assert typed_back[1].data == _big_state({"when": when, "n": 2})


@contextmanager
def small_parts() -> Iterator[None]:
    """Parse every index node of leaves, and every leaf, apart from the text around it.

    Their chunks are parsed in runs of a chunk or a few (``RUN_BYTES``), not all in one.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(join, "PART_BYTES", 3)
        patch.setattr(join, "RUN_BYTES", 60)
        yield


STATES = st.dictionaries(
    st.sampled_from(["a", "b", "c"]),
    st.lists(VALUES, min_size=30, max_size=120)
    | st.dictionaries(TEXT, VALUES, min_size=30, max_size=80)
    | TEXT.map(lambda t: t * 40),
    min_size=1,
)


def _record(state: dict[str, Any], params: TreeParams = PARAMS) -> tuple[bytes, dict[bytes, bytes]]:
    checkpoint = Checkpoint(
        workflow_id="wf",
        step=1,
        agent_id="a",
        status=AgentStatus.COMPLETED,
        state_snapshot=StateSnapshot(data=state),
    )
    record, result = encode_checkpoint_v2(checkpoint, params, finite=True)
    return record, result.blobs


@examples(fast=4, full=30)
def test_values_parsed_apart_read_back_as_the_whole_text_does(examples: int) -> None:
    @settings(LARGE_STATES, max_examples=examples)
    @given(STATES)
    def check(state: dict[str, Any]) -> None:
        state["pad"] = "p\u00fc\U0001f600" * 100  # over root_inline_limit: always a tree
        record, blobs = _record(state)
        exact = split.split_state(state, PARAMS)  # no text checksum: every leaf hashed
        whole = decode_checkpoint_v2(record, lambda _: blobs).state_snapshot.data
        with small_parts():
            apart = decode_checkpoint_v2(record, lambda _: blobs).state_snapshot.data
            hashed = join_state(exact.root, lambda _: exact.blobs)
        assert whole == apart == hashed == state
        assert orjson.dumps(apart) == orjson.dumps(state)

    check()


def test_the_text_checksum_guards_values_parsed_apart() -> None:
    state = {"messages": [{"role": "user", "text": f"hello {i}"} for i in range(200)]}
    record, blobs = _record(state)
    with small_parts():
        assert decode_checkpoint_v2(record, lambda _: blobs).state_snapshot.data == state
        for h, blob in blobs.items():
            if b"hello 7" in blob:
                damaged = {**blobs, h: blob.replace(b"hello 7", b"hello 8", 1)}
                with pytest.raises(CheckpointCorruptedError, match=h.hex()):
                    decode_checkpoint_v2(record, lambda _, d=damaged: d)


@pytest.mark.parametrize("key", ["messages", "by_id"])
def test_a_large_value_parsed_apart_keeps_no_chunk_once_merged(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run's list (or dict) is let go as soon as it is merged into the value.

    Kept until the end, thousands of them outlive young collections into the oldest
    generation, and every few large reads bring on a full collection holding the GIL.
    """
    messages = [{"role": "user", "text": f"message {i} " * 30} for i in range(5000)]  # ~2 MB
    value: Any = messages if key == "messages" else {str(i): m for i, m in enumerate(messages)}
    record, blobs = _record({key: value}, TreeParams())  # the stores' chunk sizes
    parsed: list[Any] = []
    kept: list[int] = []  # per run parsed: how many runs before the last are still held

    def parse(text: bytes) -> Any:
        # parsed[0] is the text around the large value (the state, held by the reader).
        chunks = [i for i in range(1, len(parsed) - 1) if type(parsed[i]) is type(value)]
        kept.append(sum(sys.getrefcount(parsed[i]) > 2 for i in chunks))  # `parsed`, argument
        parsed.append(loads_fast(text))
        return parsed[-1]

    monkeypatch.setattr(join, "loads_fast", parse)
    back = decode_checkpoint_v2(record, lambda _: blobs).state_snapshot.data
    assert back == {key: value}
    # ~1.9 MB parsed a run of chunks (~128 KB) at a time: ~15 runs
    assert len([v for v in parsed if type(v) is type(value)]) > 10
    assert max(kept) == 0


HUGE_VALUES = {
    "string": {"text": "caf\u00e9 " * 1_600_000},  # ~9.6 MB of text: a leaf read in slices
    "chat": {"messages": [{"role": "user", "text": f"message {i} " * 30} for i in range(20_000)]},
}


@pytest.mark.parametrize("url", ["file://{dir}/store", "sqlite://{dir}/store.db"])
@pytest.mark.parametrize("kind", sorted(HUGE_VALUES))
async def test_a_huge_read_lets_the_loop_run_between_its_pieces(
    tmp_path: Path, url: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The value is parsed a piece at a time in the store's thread, and the event loop turns
    while it is: a task counting its turns has moved on between the first piece and the last
    (the interpreter may switch threads between pieces, never inside one of them).
    """
    state = HUGE_VALUES[kind]
    async with CheckpointManager(open_storage(url.format(dir=tmp_path))) as manager:
        await manager.create_checkpoint("wf", 1, "a", "completed", SharedState(state))
        turns = 0
        seen: list[int] = []  # the loop's turns when each piece was parsed

        def parse(text: bytes) -> Any:
            seen.append(turns)
            return loads_fast(text)

        async def count_turns() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        monkeypatch.setattr(join, "loads_fast", parse)
        interval = sys.getswitchinterval()
        sys.setswitchinterval(0.0001)  # the loop asks for the GIL often: between any pieces
        counter = asyncio.create_task(count_turns())
        try:
            back = await manager.get_resume_point("wf")
        finally:
            counter.cancel()
            sys.setswitchinterval(interval)
    assert back is not None and back[1].data == state
    assert len(seen) > 8  # read in pieces: the text around the value, then its slices or chunks
    assert seen[-1] > seen[1] and seen == sorted(seen)


@pytest.mark.parametrize("url", ["file://{dir}/store", "sqlite://{dir}/store.db"])
async def test_a_value_of_several_megabytes_reads_back(tmp_path: Path, url: str) -> None:
    """Sliced on write and read (a SQLite blob of 3 MB is read a slice at a time)."""
    state = {
        "text": "caf\u00e9 \U0001f600 " * 300_000,
        "chat": [{"role": "user", "text": f"message {i} " * 20} for i in range(20_000)],
    }
    async with CheckpointManager(open_storage(url.format(dir=tmp_path))) as manager:
        await manager.create_checkpoint("wf", 1, "a", "completed", SharedState(state))
    async with CheckpointManager(open_storage(url.format(dir=tmp_path))) as manager:
        back = await manager.get_resume_point("wf")
    assert back is not None and back[1].data == state


@pytest.mark.parametrize("url", ["file://{dir}/store", "sqlite://{dir}/store.db"])
async def test_a_tree_is_read_in_the_stores_thread_without_a_loop_hop_per_level(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store with read_blobs_in_thread is read through it alone: every level of the tree
    is fetched in one call, off the loop, and fetch_blobs is never called.
    """
    state = _big_state({"n": 1})
    async with CheckpointManager(open_storage(url.format(dir=tmp_path))) as manager:
        await manager.create_checkpoint("wf", 1, "a", "completed", state)
        storage = manager.storage
        calls: list[int] = []
        real = storage.read_blobs_in_thread  # type: ignore[attr-defined]

        def hop(_hashes: Any) -> Any:
            raise AssertionError("a tree level hopped to the event loop")

        async def counted(fn: Any) -> Any:
            calls.append(threading.get_ident())
            return await real(fn)

        monkeypatch.setattr(storage, "fetch_blobs", hop)
        monkeypatch.setattr(storage, "read_blobs_in_thread", counted)
        back = await manager.get_resume_point("wf")
    assert back is not None and back[1].data == state
    assert calls == [threading.get_ident()]  # one call, from the loop's thread


@pytest.mark.parametrize("needle", [b"\\", join.MARK])
def test_the_sliced_search_finds_a_needle_across_slice_ends(needle: bytes) -> None:
    """join._contains searches ~1 MB at a time and still finds a needle cut by a slice end."""
    size = 3 * join.PART_BYTES
    for at in (0, join.PART_BYTES - 1, join.PART_BYTES - len(needle) + 1, size - len(needle)):
        data = bytearray(b"x" * size)
        data[at : at + len(needle)] = needle
        assert join._contains(bytes(data), needle)
    assert not join._contains(b"x" * size, needle)


@pytest.mark.parametrize("at", [0, 700, 2999])
async def test_a_typed_value_deep_in_a_long_list_comes_back_typed(tmp_path: Path, at: int) -> None:
    """A long list's texts are encoded a run at a time and the first that may hold a tag is
    noted: a datetime in any run, before or after the resumed cut of an append, stays typed.
    """
    when = datetime(2026, 12, 2, 0, 0, tzinfo=UTC)
    messages: list[Any] = [{"role": "user", "text": f"message {i} " * 30} for i in range(3000)]
    messages[at] = {"role": "user", "at": when}
    shared = SharedState({"messages": messages})
    async with CheckpointManager(open_storage(f"file://{tmp_path}/store")) as manager:
        written = [await manager.create_checkpoint("wf", 1, "a", "running", shared)]
        shared.append("messages", {"role": "assistant", "text": "one more"})
        written.append(await manager.create_checkpoint("wf", 2, "a", "running", shared))
        read = [await manager.get_checkpoint("wf", step) for step in (1, 2)]
    for checkpoint in written + read:
        assert checkpoint.state_snapshot.data["messages"][at]["at"] == when
    assert read[1].state_snapshot.data["messages"][-1]["text"] == "one more"


async def _loop_cpu_between_beats(work: Awaitable[Any], pause: float) -> list[float]:
    """The loop thread's CPU time between each two turns of a heartbeat while ``work`` runs.

    CPU time, not wall time: what the loop held the heartbeat up for, whatever else the
    machine runs.
    """
    gaps: list[float] = []
    done = False
    # Collections are the process's, not the work's (a full one owed by earlier tests is
    # ~75 ms in a pytest process): none runs while the work is measured.
    gc.collect()
    gc.disable()

    async def beat() -> None:
        last = time.thread_time()
        while not done:
            await asyncio.sleep(pause)
            now = time.thread_time()
            gaps.append(now - last)
            last = now

    heartbeat = asyncio.create_task(beat())
    await asyncio.sleep(0)
    try:
        await work
    finally:
        done = True
        await heartbeat
        gc.enable()
    return gaps


def _held_up_at_most(gaps: list[float], limit: float) -> bool:
    """Whether no turn of the loop took more than ``limit`` seconds of its CPU, or, on a
    machine slow enough to stretch every slice, more than a tenth of the work's CPU.

    Work done in one piece instead of slices takes a third or more of the whole.
    """
    return max(gaps) < limit or max(gaps) < sum(gaps) / 10


async def _held_up_in_one_of_five(
    measure: Callable[[int], Awaitable[list[float]]], limit: float
) -> list[list[float]]:
    """Up to five measurements (``measure(n)``, n = 0 to 4), stopping at the first one whose
    loop was held up at most ``limit`` (:func:`_held_up_at_most`): every one measured.

    A loaded machine can stretch one slice of one of them (two whole test runs at once on
    two cores stretched three in a row); work done in one piece (every slice of a save in
    one loop turn) is held up in all of them.
    """
    tries: list[list[float]] = []
    for n in range(5):
        tries.append(await measure(n))
        if _held_up_at_most(tries[-1], limit):
            break
    return tries


def _documents(megabytes: float) -> dict[str, Any]:
    return {"docs": [{"id": i, "text": "word " * 200} for i in range(round(megabytes * 1000))]}


async def _warmed(url: str) -> CheckpointManager:
    """A manager whose store has run a save already (its threads and lazy imports)."""
    manager = CheckpointManager(open_storage(url))
    await manager.__aenter__()
    await manager.create_checkpoint("warm-up", 1, "a", "completed", SharedState(_big_state({})))
    return manager


@pytest.mark.parametrize("url", ["file://{dir}/store", "sqlite://{dir}/store.db"])
async def test_a_large_first_save_lets_the_loop_run_between_its_slices(
    tmp_path: Path, url: str
) -> None:
    """A 5 MB first save of a SharedState (copied, encoded, cut whole) yields in slices."""
    manager = await _warmed(url.format(dir=tmp_path))

    async def measure(n: int) -> list[float]:
        state = SharedState(_documents(5))
        save = manager.create_checkpoint(f"wf-{n}", 1, "a", "completed", state)
        return await _loop_cpu_between_beats(save, 0)

    try:
        tries = await _held_up_in_one_of_five(measure, 0.006)
    finally:
        await manager.__aexit__(None, None, None)
    assert all(len(gaps) > 50 for gaps in tries), [len(gaps) for gaps in tries]
    # ~2 ms here; 6.5-34 ms in every try when one slice encoded the list whole.
    assert _held_up_at_most(tries[-1], 0.006), [max(gaps) for gaps in tries]


@pytest.mark.parametrize("url", ["file://{dir}/store", "sqlite://{dir}/store.db"])
async def test_concurrent_large_saves_take_turns_with_a_timer(tmp_path: Path, url: str) -> None:
    """Sixteen 0.5 MB first saves at once: a 1 ms timer waits for about one budget, not
    sixteen slices, nor a whole save."""
    manager = await _warmed(url.format(dir=tmp_path))

    async def measure(n: int) -> list[float]:
        states = [SharedState(_documents(0.5)) for _ in range(16)]

        async def saves() -> None:  # started once the heartbeat runs: all of them measured
            await asyncio.gather(
                *(
                    manager.create_checkpoint(f"wf-{n}-{i}", 1, "a", "completed", s)
                    for i, s in enumerate(states)
                )
            )

        return await _loop_cpu_between_beats(saves(), 0.001)

    try:
        tries = await _held_up_in_one_of_five(measure, 0.008)
    finally:
        await manager.__aexit__(None, None, None)
    # ~3 ms here (load 5); 11-16 ms in every try when all sixteen sliced in every turn (a
    # pacer that always waits a turn), 60-75 ms when each save ran whole (one that never waits).
    assert _held_up_at_most(tries[-1], 0.008), [max(gaps) for gaps in tries]


async def test_the_pacer_lets_a_due_timer_run_before_work_over_its_budget() -> None:
    loop = asyncio.get_running_loop()
    pacer = Pacer(budget=0.001)
    order: list[str] = []
    await pacer.turn()  # the first in this iteration: no wait
    loop.call_soon(order.append, "soon")
    await pacer.turn()  # within the budget: does not suspend
    assert order == []
    loop.call_later(0.0005, order.append, "timer")
    deadline = time.perf_counter() + 0.002
    while time.perf_counter() < deadline:  # the budget is spent, the timer falls due
        pass
    await pacer.turn()
    order.append("work")
    assert order == ["soon", "timer", "work"]


class _CommitTogether(InMemoryCheckpointStorage):
    """Tree saves that all complete at once, as a group commit wakes its writers."""

    def __init__(self, writers: int) -> None:
        super().__init__()
        self.waiting = writers
        self.all_stored = asyncio.Event()
        self.committed = asyncio.Event()

    async def save_tree(self, *args: Any, **kwargs: Any) -> None:
        await super().save_tree(*args, **kwargs)
        self.waiting -= 1
        if not self.waiting:
            self.all_stored.set()
        await self.committed.wait()


async def test_large_saves_woken_together_take_turns_for_their_wrap_up() -> None:
    """On a storage that never waits for I/O (its manager paces every step of a large
    save), a save's wrap-up once the store returns waits its turn: with the budget spent
    by the first save woken, the second one finishes after what was due."""
    storage = _CommitTogether(writers=2)
    manager = CheckpointManager(storage)
    manager._codec.pacer.budget = 0.0  # spent by the first turn of every iteration
    order: list[str] = []

    async def save(name: str) -> None:
        state = SharedState(_documents(1))
        await manager.create_checkpoint(name, 1, "a", "completed", state)
        order.append(name)

    saves = asyncio.gather(save("first"), save("second"))
    with anyio.fail_after(30):
        await storage.all_stored.wait()
        storage.committed.set()  # wakes both, then the marker, in one loop iteration
        asyncio.get_running_loop().call_soon(order.append, "due")
        await saves
    assert order == ["first", "due", "second"]


async def test_pacer_waiters_go_on_in_order_and_none_is_left_waiting() -> None:
    """With the budget spent by the first turn of each iteration, waiters go on one per
    renewal in the order they came; one cancelled while waiting is skipped, and one
    cancelled once woken hands its turn on: nobody is left waiting."""
    pacer = Pacer(budget=0.0)
    order: list[int] = []

    async def work(i: int) -> None:
        await pacer.turn()
        order.append(i)

    tasks = [asyncio.create_task(work(i)) for i in range(6)]
    await asyncio.sleep(0)  # 0 went on and its turn's renewal is due next; 1-5 wait
    tasks[3].cancel()
    asyncio.get_running_loop().call_soon(tasks[1].cancel)  # just after the renewal woke it
    with anyio.fail_after(5):
        await asyncio.gather(*tasks, return_exceptions=True)
    assert order == [0, 2, 4, 5]
    assert tasks[1].cancelled() and tasks[3].cancelled()


def test_a_pacer_used_on_a_new_loop_does_not_wait_for_the_closed_one() -> None:
    pacer = Pacer(budget=0.0)  # spent as soon as it starts

    async def spend() -> None:
        await pacer.turn()  # starts the budget; its renewal is left pending at close

    asyncio.run(spend())
    asyncio.run(asyncio.wait_for(pacer.turn(), 5))  # a budget of its own on the new loop
