"""`events`, `history` and `workflows` on an encrypted store: sealed fields locked without
`--keys`, readable with them (SQLite and PostgreSQL, the real command in a child process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager, Keyring, ResumableWorkflow
from aiocheckpoint.cli.store import open_storage
from tests.test_cli import NewStore, cli, new_store
from tests.test_cli_encryption import keys_file

__all__ = ["new_store"]

pytestmark = pytest.mark.asyncio

K1 = os.urandom(32)
KEYS = Keyring(keys={"k1": K1}, primary="k1")


class Boom(RuntimeError):
    """A step's failure."""


async def _story(url: str) -> None:
    async with CheckpointManager(open_storage(url), encryption=KEYS) as manager:
        await manager.register_workflow("wf")
        async with ResumableWorkflow("wf", manager) as wf:
            async with wf.step(0, agent_id="a"):
                pass
            await wf.pause("ask-finance-5c1e", {"amount": "amount-0b7d"})
        await manager.resume_workflow("wf", {"ok": "approved-by-3a9f"})
        await manager.record_failure("wf", Boom("card-declined-8e2c"))


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_events_locked_without_keys_readable_with_them(
    new_store: NewStore, tmp_path: Path, kind: str
) -> None:
    url = new_store(kind)
    await _story(url)
    secrets = ["ask-finance-5c1e", "amount-0b7d", "approved-by-3a9f", "card-declined-8e2c"]

    locked = cli("events", url, "wf", "--json")
    assert locked.code == 0, locked.err
    data = {e["kind"]: e["data"] for e in locked.json()["events"]}  # type: ignore[index]
    assert data["paused"] == {"reason": "[sealed: key 'k1']", "data": "[sealed: key 'k1']"}
    assert data["resumed"] == {"input": "[sealed: key 'k1']"}
    assert data["step_failed"] == {"type": "Boom", "message": "[sealed: key 'k1']"}
    text = cli("events", url, "wf")
    assert text.code == 0 and "[sealed: key 'k1']" in text.out
    records = cli("workflows", url, "--status", "failed", "--json")
    assert records.code == 0, records.err
    for result in (locked, text, records):
        assert not any(s in result.out for s in secrets), result.out

    keys = keys_file(tmp_path / "keys.json", {"k1": K1}, "k1")
    opened = cli("events", url, "wf", "--json", "--keys", keys)
    assert opened.code == 0, opened.err
    data = {e["kind"]: e["data"] for e in opened.json()["events"]}  # type: ignore[index]
    assert data["paused"] == {"reason": "ask-finance-5c1e", "data": {"amount": "amount-0b7d"}}
    assert data["resumed"] == {"input": {"ok": "approved-by-3a9f"}}
    assert data["step_failed"] == {"type": "Boom", "message": "card-declined-8e2c"}
    history = cli("history", url, "wf", "--keys", keys)
    assert history.code == 0 and "1 paused" in history.out, history.out
    listed = cli("workflows", url, "--status", "failed", "--json", "--keys", keys)
    assert "card-declined-8e2c" in json.dumps(listed.json())

    other = keys_file(tmp_path / "other.json", {"k2": os.urandom(32)}, "k2")
    refused = cli("events", url, "wf", "--keys", other)
    assert "k1" in refused.error_line()
    counted = cli("history", url, "wf", "--keys", other)  # kinds are in the clear
    assert counted.code == 0 and "1 paused" in counted.out, counted.err
    assert not any(s in counted.out for s in secrets)
