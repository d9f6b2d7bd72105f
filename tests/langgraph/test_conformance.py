"""LangGraph's own conformance suite (langgraph-checkpoint-conformance) on every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from aiocheckpoint.integrations.langgraph import AioCheckpointSaver
from tests.langgraph.conftest import BACKENDS, open_backend
from tests.pg_support import drop_schema, new_schema_name


@pytest.mark.parametrize("kind", BACKENDS)
async def test_langgraph_conformance(kind: str, tmp_path: Path) -> None:
    schema = new_schema_name()

    async def lifespan() -> AsyncIterator[None]:
        yield
        if kind == "postgres":
            await drop_schema(schema)

    @checkpointer_test(name=f"AioCheckpointSaver[{kind}]", lifespan=lifespan)
    async def saver() -> AsyncIterator[AioCheckpointSaver]:
        async with AioCheckpointSaver(
            open_backend(kind, tmp_path, schema), close_storage=True
        ) as opened:
            yield opened

    report = await validate(saver)
    failures = [f for result in report.results.values() for f in result.failures]
    assert failures == []
    detected = {name for name, result in report.results.items() if result.detected}
    assert detected == {cap.value for cap in ALL_CAPABILITIES}
    assert all(result.passed for result in report.results.values())
