"""The saver's options and storage guarantees: single writer, retention, exact storage,
content-addressed channel values, bad input, and the command line on LangGraph stores."""

from __future__ import annotations

import base64
import gc
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from aiocheckpoint import (
    CheckpointCorruptedError,
    InvalidArgumentError,
    LeaseHeldError,
    UnsupportedOperationError,
)
from aiocheckpoint.integrations.langgraph import AioCheckpointSaver, keys, records
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from tests.langgraph.conftest import SaverFactory, backend_url, open_backend
from tests.langgraph.graphs import loop_graph, loop_input, values_view
from tests.pg_support import DSN, drop_schema, new_schema_name
from tests.test_cli import cli

LOOP: Any = {"configurable": {"thread_id": "loop"}, "recursion_limit": 1000}


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    name = new_schema_name()
    yield name
    await drop_schema(name)


async def put(saver: AioCheckpointSaver, thread: str) -> str:
    cp = generate_checkpoint()
    await saver.aput(generate_config(thread), cp, generate_metadata(), {})
    return cp["id"]


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_single_writer_refuses_a_second_saver(kind: str, tmp_path: Path, schema: str) -> None:
    store = open_backend(kind, tmp_path, schema)
    # Two savers over one store (for memory, the same object: it is the whole store).
    other = store if kind == "memory" else open_backend(kind, tmp_path, schema)
    async with AioCheckpointSaver(store, single_writer=True, close_storage=True) as first:
        first_id = await put(first, "t")
        owns = kind != "memory"
        async with AioCheckpointSaver(other, single_writer=True, close_storage=owns) as second:
            with pytest.raises(LeaseHeldError, match="being written by another saver"):
                await put(second, "t")
            with pytest.raises(LeaseHeldError):
                config = generate_config("t", checkpoint_id=first_id)
                await second.aput_writes(config, [("c", 1)], "task")
            await put(second, "other")  # other threads are free
            assert [t.checkpoint["id"] async for t in second.alist(generate_config("t"))] == [
                first_id
            ]
            if kind != "memory":
                await first.aclose()  # releases its leases: the thread is free again
                await put(second, "t")


async def test_single_writer_needs_a_store_with_leases(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedOperationError, match="single_writer"):
        AioCheckpointSaver.from_url(f"file://{tmp_path}", single_writer=True)


async def test_max_checkpoints_keeps_the_newest(saver_factory: SaverFactory) -> None:
    async with saver_factory(max_checkpoints=3) as saver:
        graph = loop_graph(saver, steps=8)
        final = await graph.ainvoke(loop_input(), LOOP)
        kept = [t async for t in saver.alist(LOOP)]
        records = await saver.manager.storage.scan(keys.workflow_id("loop", ""))
    reference = await loop_graph(InMemorySaver(), steps=8).ainvoke(loop_input(), LOOP)
    assert values_view(final) == values_view(reference)
    assert len(kept) == 3
    assert [t.metadata["step"] for t in kept] == [8, 7, 6]
    # Older checkpoints went with their pending writes: 3 checkpoints, at most 3 writes.
    oldest = keys.checkpoint_step(kept[-1].checkpoint["id"])
    assert len(records) <= 6
    assert min(r.step for r in records) == oldest


async def test_a_runs_writes_are_not_read_back_and_a_resumed_thread_merges_them(
    saver_factory: SaverFactory,
) -> None:
    """A running graph's task writes come before their checkpoint's (chained) ``aput``:
    the saver stores them without reading the store for writes of a checkpoint newer than
    its last. Writes stored for a checkpoint this saver did not put (a second saver over
    the same store: a process resuming the thread) are read back and merged."""
    async with saver_factory() as saver:
        reads: list[int] = []
        load_writes = saver._store.load_writes

        async def counted(workflow_id: str, step: int) -> Any:
            reads.append(step)
            return await load_writes(workflow_id, step)

        saver._store.load_writes = counted  # type: ignore[method-assign]
        final = await loop_graph(saver, steps=8).ainvoke(loop_input(), LOOP)
        assert reads == []
        latest = await saver.aget_tuple(LOOP)
        assert latest is not None
        config = latest.config
        await saver.aput_writes(config, [("n", 1)], "task-a")
    reference = await loop_graph(InMemorySaver(), steps=8).ainvoke(loop_input(), LOOP)
    assert values_view(final) == values_view(reference)
    if isinstance(saver.manager.storage, InMemoryCheckpointStorage):
        return  # each saver of the factory has a store of its own
    async with saver_factory() as second:
        await second.aput_writes(config, [("n", 2)], "task-b")
        found = await second.aget_tuple(config)
    assert found is not None
    assert sorted(found.pending_writes) == [("task-a", "n", 1), ("task-b", "n", 2)]


async def test_a_saver_that_reads_a_thread_again_merges_writes_another_saver_stored(
    saver_factory: SaverFactory,
) -> None:
    """A saver whose newest put is older than the thread's newest checkpoint (another
    process ran the thread on meanwhile) reads the writes stored for it once it has read the
    thread again, and merges them: none is lost to the writes it does not read back."""
    async with saver_factory() as first:
        await loop_graph(first, steps=4).ainvoke(loop_input(), LOOP)
        if isinstance(first.manager.storage, InMemoryCheckpointStorage):
            return  # each saver of the factory has a store of its own
        async with saver_factory() as second:
            await loop_graph(second, steps=4).ainvoke(loop_input(), LOOP)
            latest = await second.aget_tuple(LOOP)
            assert latest is not None
            await second.aput_writes(latest.config, [("n", 2)], "task-b")
            again = await first.aget_tuple(LOOP)
            assert again is not None and again.config == latest.config
            await first.aput_writes(again.config, [("n", 1)], "task-a")
            found = await second.aget_tuple(latest.config)
    assert found is not None
    assert sorted(found.pending_writes) == [("task-a", "n", 1), ("task-b", "n", 2)]


async def test_serializer_output_is_stored_as_is(saver_factory: SaverFactory) -> None:
    async with saver_factory() as saver:
        cp = generate_checkpoint(channel_values={"msgs": ["a", {"b": 1}], "n": 7})
        cp["channel_versions"] = {"msgs": 1, "n": 1}
        config = await saver.aput(generate_config("t"), cp, generate_metadata(), {"msgs": 1})
        await saver.aput_writes(config, [("__interrupt__", {"why": "human"})], "task")
        workflow_id = keys.workflow_id("t", "")
        step = keys.checkpoint_step(cp["id"])
        stored = await saver.manager.get_checkpoint(workflow_id, step)
        writes = await saver.manager.get_checkpoint(workflow_id, step + 1)
    values = stored.state_snapshot.data["values"]
    items = [typed_bytes(item) for item in values["msgs"]["items"]]
    assert items == [saver.serde.dumps_typed(v) for v in ["a", {"b": 1}]]
    assert typed_bytes(values["n"]) == saver.serde.dumps_typed(7)
    [write] = writes.state_snapshot.data["writes"]
    assert type(write) is list  # plain JSON: no typed value to tag and restore
    task, idx, channel, value, path = write
    assert (task, idx, channel, path) == ("task", -3, "__interrupt__", "")
    assert typed_bytes(value) == saver.serde.dumps_typed({"why": "human"})


def typed_bytes(stored: str) -> tuple[str, bytes]:
    """A stored ``type:base64`` text as the serializer's ``(type, bytes)``."""
    kind, _, data = stored.rpartition(":")
    return kind, base64.b64decode(data)


async def test_a_large_unchanged_channel_is_stored_once(saver_factory: SaverFactory) -> None:
    """A large value goes in a page of its own (a box), referenced by hash while its
    channel's version stays the same: each checkpoint record holds the hash only."""
    big = {"doc": "lorem ipsum " * 5_000}  # ~80 KB of base64 once serialized
    async with saver_factory() as saver:
        config: Any = generate_config("t")
        ids = []
        for n in range(3):
            cp = generate_checkpoint(channel_values={"big": big, "n": n})
            cp["channel_versions"] = {"big": 1, "n": n + 1}
            changed = {"big": 1, "n": n + 1} if n == 0 else {"n": n + 1}
            config = await saver.aput(config, cp, generate_metadata(), changed)
            ids.append(cp["id"])
        storage = saver.manager.storage
        records = await storage.scan(keys.workflow_id("t", ""))
        pages = await storage.scan(keys.pages_workflow("t"))
        async with AioCheckpointSaver(storage) as fresh:  # nothing cached: read from the store
            found = [await fresh.aget_tuple(generate_config("t", checkpoint_id=i)) for i in ids]
            await fresh.acopy_thread("t", "copy")
            copied = await fresh.aget_tuple(generate_config("copy"))
    assert len(records) == 3 and all(len(r.data) < 4_000 for r in records)
    assert len(pages) == 1 and len(pages[0].data) > 80_000
    for n, got in enumerate(found):
        assert got is not None and got.checkpoint["channel_values"] == {"big": big, "n": n}
    assert copied is not None and copied.checkpoint["channel_values"] == {"big": big, "n": 2}


def test_list_items_are_reused_by_identity_whatever_changed() -> None:
    """Appended items (the common case) and a replaced item: the parent's encodings of
    the very same objects are reused, every other item is encoded, and it reads back."""
    serde = JsonPlusSerializer()
    items = [{"n": n} for n in range(20)]

    def save(value: list[Any], version: int, previous: Any) -> tuple[Any, Any, Any]:
        cp = generate_checkpoint(channel_values={"msgs": value})
        cp["channel_versions"] = {"msgs": version}
        pages: dict[str, list[Any]] = {}
        state, cache = records.checkpoint_state(serde, cp, {}, previous, pages)
        return state, cache, pages

    state, first, pages = save(items, 1, {})
    assert len(pages) == 2  # two full pages of 8, four items inline
    grown = [*items, {"n": 20}]
    state, second, new_pages = save(grown, 2, first)
    assert new_pages == {}  # the full pages are the parent's
    assert all(a is b for a, b in zip(second["msgs"][3], first["msgs"][3], strict=False))
    pages |= new_pages
    replaced = [*grown[:3], {"n": "three"}, *grown[4:]]
    state, third, new_pages = save(replaced, 3, second)
    assert len(new_pages) == 1  # only the page holding the replaced item
    codes = third["msgs"][3]
    assert [codes[i] is second["msgs"][3][i] for i in range(21)] == [i != 3 for i in range(21)]
    pages |= new_pages
    checkpoint, _ = records.decode_checkpoint(serde, state, pages)
    assert checkpoint["channel_values"]["msgs"] == replaced


def test_list_items_held_weakly_are_reused_while_alive_and_never_kept() -> None:
    """Messages (which take weak references) are recognised while LangGraph holds them,
    the cache keeps none of them alive, and a dead one matches nothing afterwards."""
    serde = JsonPlusSerializer()

    def save(value: list[Any], version: int, previous: Any) -> tuple[Any, Any, Any]:
        cp = generate_checkpoint(channel_values={"msgs": value})
        cp["channel_versions"] = {"msgs": version}
        pages: dict[str, list[Any]] = {}
        state, cache = records.checkpoint_state(serde, cp, {}, previous, pages)
        return state, cache, pages

    items = [AIMessage(f"m{n}", id=str(n)) for n in range(10)]
    _, first, pages = save(items, 1, {})
    grown = [*items, AIMessage("m10", id="10")]
    _, second, new_pages = save(grown, 2, first)
    assert [a is b for a, b in zip(second["msgs"][3], first["msgs"][3], strict=False)] == [
        True
    ] * 10
    probe = weakref.ref(items[0])
    del items, grown
    gc.collect()
    assert probe() is None  # the cache (first, second) kept no message alive
    pages |= new_pages
    # New objects (as a later run reads them back), one None where a dead item was.
    fresh: list[Any] = [None, *(AIMessage(f"x{n}", id=f"x{n}") for n in range(1, 11))]
    state, _, new_pages = save(fresh, 3, second)
    checkpoint, _ = records.decode_checkpoint(serde, state, pages | new_pages)
    assert checkpoint["channel_values"]["msgs"] == fresh


def test_a_tasks_first_writes_are_stored_in_langgraphs_order() -> None:
    """Without stored writes and special channels no merge is needed: LangGraph's order
    (path, task, index) is the order given; special writes still replace by index."""
    serde = JsonPlusSerializer()
    writes = [("a", 1), ("b", 2), ("a", 3)]
    merged = records.merge_writes(serde, [], writes, "task", "path")
    assert [(w[0], w[1], w[2], records.untyped(serde, w[3]), w[4]) for w in merged] == [
        ("task", i, channel, value, "path") for i, (channel, value) in enumerate(writes)
    ]
    errors = [("x", 1), ("__error__", "e1"), ("__error__", "e2")]
    special = records.merge_writes(serde, [], errors, "t", "")
    assert [(w[1], records.untyped(serde, w[3])) for w in special] == [(-1, "e2"), (0, 1)]
    flat = records.flat_writes("id", merged)
    assert flat[0] == "id" and records.unflat_writes(flat) == merged


@pytest.mark.parametrize(
    ("values", "pages"),
    [
        ({"big": {"box": "0" * 32, "items": []}}, {"0" * 32: ["json:e30="]}),  # extra key
        ({"big": {"box": 7}}, {}),  # a hash that is not one
        ({"big": {"box": "0" * 32}}, {"0" * 32: ["json:e30=", "json:e30="]}),  # two items
        ({"n": "json"}, {}),  # no type:data separator
        ({"n": "json:not base64!"}, {}),
        ({"n": ["json"]}, {}),  # an old pair with no data
    ],
)
def test_malformed_stored_values_are_corruption(values: Any, pages: Any) -> None:
    serde = JsonPlusSerializer()
    state = {
        "checkpoint": records.typed(serde, {"id": "x"}),
        "metadata": records.typed(serde, {}),
        "values": values,
    }
    with pytest.raises(CheckpointCorruptedError):
        records.decode_checkpoint(serde, state, pages)


async def test_writes_stored_as_tuples_still_read(saver_factory: SaverFactory) -> None:
    """Earlier versions stored each write as a tuple (a typed value): still read."""
    async with saver_factory() as saver:
        cp = generate_checkpoint(channel_values={"n": 1})
        config = await saver.aput(generate_config("t"), cp, generate_metadata(), {})
        workflow_id = keys.workflow_id("t", "")
        value = [*saver.serde.dumps_typed("v")]
        value[1] = base64.b64encode(value[1]).decode("ascii")
        old = {"writes": [("task", 0, "n", value, "")]}
        info = {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cp["id"]}
        step = keys.writes_step(cp["id"])
        await saver.manager.create_checkpoint(
            workflow_id, step, "langgraph", "completed", old, metadata=info
        )
        found = await saver.aget_tuple(config)
        assert found is not None and found.pending_writes == [("task", "n", "v")]
        # A saver that has not cached these writes merges a new task's with them.
        async with AioCheckpointSaver(saver.manager.storage) as fresh:
            await fresh.aput_writes(config, [("n", "w")], "task2")
            found = await fresh.aget_tuple(config)
    assert found is not None and found.pending_writes == [("task", "n", "v"), ("task2", "n", "w")]


async def test_bad_checkpoint_id_is_refused_and_nothing_is_stored(
    saver_factory: SaverFactory,
) -> None:
    async with saver_factory() as saver:
        cp = generate_checkpoint(checkpoint_id="not-a-uuid")
        with pytest.raises(InvalidArgumentError, match="canonical UUID"):
            await saver.aput(generate_config("t"), cp, generate_metadata(), {})
        with pytest.raises(InvalidArgumentError, match="thread_id"):
            await saver.aput({"configurable": {}}, generate_checkpoint(), generate_metadata(), {})
        assert await saver.aget_tuple(generate_config("t", checkpoint_id="not-a-uuid")) is None
        assert await saver.manager.storage.list_workflows() == []
        assert [t async for t in saver.alist(None)] == []


async def stored_bytes(kind: str, root: Path, schema: str) -> int:
    if kind == "postgres":
        con = await asyncpg.connect(DSN)
        try:
            total: int = await con.fetchval(
                "SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = $1 AND c.relkind = 'r'",
                schema,
            )
        finally:
            await con.close()
        return total
    return disk_bytes(root)


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])  # the stores with blobs
async def test_a_growing_message_list_is_not_stored_again(
    kind: str, tmp_path: Path, schema: str
) -> None:
    """120 steps each appending a ~1 KB message: whole states would be ~10 MB stored."""
    steps = 120
    async with AioCheckpointSaver(
        open_backend(kind, tmp_path, schema), close_storage=True
    ) as saver:
        final = await loop_graph(saver, steps=steps).ainvoke(loop_input(), LOOP)
    assert final["count"] == steps
    whole_states = sum(1400 * n for n in range(steps + 1))  # base64 of ~1 KB per message
    assert whole_states > 10_000_000
    assert await stored_bytes(kind, tmp_path, schema) < whole_states / 5


@pytest.mark.parametrize("target", ["postgres", "file"])
async def test_verify_and_copy_work_on_langgraph_stores(
    target: str, tmp_path: Path, schema: str
) -> None:
    source = backend_url("sqlite", tmp_path, schema)
    async with AioCheckpointSaver.from_url(source) as saver:
        await loop_graph(saver, steps=5).ainvoke(loop_input(), LOOP)
        expected = [t.checkpoint async for t in saver.alist(LOOP)]
    assert cli("verify", source).code == 0
    destination = backend_url(target, tmp_path / "copy", schema)
    assert cli("copy", source, destination).code == 0
    assert cli("copy", source, destination).code == 0  # resumable: nothing left to copy
    assert cli("verify", destination).code == 0
    async with AioCheckpointSaver.from_url(destination) as copied:
        graph = loop_graph(copied, steps=7)
        assert [t.checkpoint async for t in copied.alist(LOOP)] == expected
        final = await graph.ainvoke(None, LOOP)  # the copy is a live thread: it runs on
    assert final["count"] == 5


async def test_prune_idle_deletes_only_threads_idle_in_every_namespace(
    saver_factory: SaverFactory,
) -> None:
    async with saver_factory(thread_ttl=0.5) as saver:
        await put(saver, "idle")
        await put(saver, "mixed")
        await anyio.sleep(0.7)
        cp = generate_checkpoint()
        await saver.aput(generate_config("mixed", checkpoint_ns="child:1"), cp, {}, {})
        await put(saver, "fresh")
        assert await saver.aprune_idle() == ["idle"]
        assert await saver.aget_tuple(generate_config("idle")) is None
        for thread in ("mixed", "fresh"):
            assert await saver.aget_tuple(generate_config(thread)) is not None
        assert await saver.aprune_idle(idle_for=0) == ["fresh", "mixed"]
        assert [t async for t in saver.alist(None)] == []
        with pytest.raises(InvalidArgumentError, match="idle_for"):
            await saver.aprune_idle(idle_for=-1)
    with pytest.raises(InvalidArgumentError, match="thread_ttl"):
        AioCheckpointSaver.from_url("memory://", thread_ttl=-1)
    with pytest.raises(InvalidArgumentError, match="ttl"):
        AioCheckpointSaver.from_url("memory://", single_writer=True, lease_ttl=0)
    async with AioCheckpointSaver.from_url("memory://") as plain:
        with pytest.raises(InvalidArgumentError, match="thread_ttl"):
            await plain.aprune_idle()


async def test_long_lists_in_pages_read_copy_and_delete(saver_factory: SaverFactory) -> None:
    steps = 150  # two full pages of messages, then some
    async with saver_factory() as saver:
        graph = loop_graph(saver, steps=steps)
        final = await graph.ainvoke(loop_input(), LOOP)
        older = [s async for s in graph.aget_state_history(LOOP) if s.values.get("count") == 100]
        await saver.acopy_thread("loop", "copy")
        await saver.adelete_thread("loop")
        remaining = await saver.manager.storage.list_workflows()
        copied = await graph.aget_state({**LOOP, "configurable": {"thread_id": "copy"}})
    assert len(final["messages"]) == steps + 1
    assert values_view(older[0].values)["messages"] == values_view(final)["messages"][:101]
    assert values_view(copied.values) == values_view(final)
    assert keys.pages_workflow("copy") in remaining
    assert not [w for w in remaining if "loop" in w]
