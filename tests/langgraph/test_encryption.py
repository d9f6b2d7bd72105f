"""The LangGraph saver with encryption= (docs/encryption.md): conformance, graphs, no plaintext."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.memory import InMemorySaver

from aiocheckpoint import (
    EncryptionError,
    InMemoryCheckpointStorage,
    Keyring,
    SQLiteCheckpointStorage,
)
from aiocheckpoint.integrations.langgraph import AioCheckpointSaver, keys
from aiocheckpoint.integrations.langgraph.pages import page_hash
from tests.langgraph.conftest import BACKENDS, open_backend
from tests.langgraph.graphs import (
    agent_graph,
    loop_graph,
    loop_input,
    question,
    resume,
    values_view,
)
from tests.pg_support import drop_schema, new_schema_name
from tests.test_encryption import assert_no_canary

KEYS = Keyring(keys={"lg": os.urandom(32)}, primary="lg")
CANARY = "lg-CANARY-93b1"
THREAD: Any = {"configurable": {"thread_id": "t-1"}}


@pytest.mark.parametrize("kind", BACKENDS)
async def test_langgraph_conformance_encrypted(kind: str, tmp_path: Path) -> None:
    schema = new_schema_name()

    async def lifespan() -> AsyncIterator[None]:
        yield
        if kind == "postgres":
            await drop_schema(schema)

    @checkpointer_test(name=f"AioCheckpointSaver[{kind}, encrypted]", lifespan=lifespan)
    async def saver() -> AsyncIterator[AioCheckpointSaver]:
        storage = open_backend(kind, tmp_path, schema)
        async with AioCheckpointSaver(storage, close_storage=True, encryption=KEYS) as opened:
            yield opened

    report = await validate(saver)
    failures = [f for result in report.results.values() for f in result.failures]
    assert failures == []
    assert all(result.passed for result in report.results.values())


def database_files(root: Path) -> list[tuple[str, bytes]]:
    """The SQLite database with its -wal and -shm."""
    return [(str(p), p.read_bytes()) for p in root.glob("lg.db*")]


async def run_thread(saver: Any) -> dict[str, Any]:
    graph = agent_graph(saver)
    await graph.ainvoke(question(f"what is 2 + 3? {CANARY}"), THREAD)
    await graph.ainvoke(resume(CANARY), THREAD)
    return values_view(await graph.ainvoke(resume("ok"), THREAD))


@pytest.mark.parametrize("encrypted", [True, False])
async def test_an_encrypted_thread_runs_as_plain_and_leaves_no_plaintext(
    tmp_path: Path, encrypted: bool
) -> None:
    """Encrypted: no trace of the canary in the database. Plain (the control): found."""
    expected = await run_thread(InMemorySaver())
    async with AioCheckpointSaver(
        SQLiteCheckpointStorage(tmp_path / "lg.db"),
        close_storage=True,
        encryption=KEYS if encrypted else None,
    ) as saver:
        assert await run_thread(saver) == expected
    with sqlite3.connect(tmp_path / "lg.db") as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    dumps = database_files(tmp_path)
    if not encrypted:
        with pytest.raises(AssertionError, match="found in"):
            assert_no_canary(dumps, CANARY)
        return
    assert_no_canary(dumps, CANARY)
    async with AioCheckpointSaver(
        SQLiteCheckpointStorage(tmp_path / "lg.db"), close_storage=True
    ) as without_keys:
        with pytest.raises(EncryptionError):
            await agent_graph(without_keys).aget_state(THREAD)


@pytest.mark.parametrize("encrypted", [True, False])
async def test_page_names_are_keyed_when_encrypted(encrypted: bool) -> None:
    """A long list's pages: named by content hash in a plain store (the control), by a
    keyed hash in an encrypted one, so a page's step confirms no guess of its content."""
    storage = InMemoryCheckpointStorage()
    config: Any = {"configurable": {"thread_id": "long"}, "recursion_limit": 1000}
    async with AioCheckpointSaver(storage, encryption=KEYS if encrypted else None) as saver:
        final = await loop_graph(saver, steps=140).ainvoke(loop_input(), config)
        assert len(final["messages"]) == 141
        manager = saver.manager
        pages = keys.pages_workflow("long")
        stored = await storage.scan(pages)
        assert len(stored) >= 2
        for record in stored:
            data = (await manager.decode_record(pages, record)).state_snapshot.data
            digest = data["hash"]
            assert record.step == keys.page_step(digest)
            assert (digest == page_hash(data["items"])) is not encrypted
