"""`events` and the EVENTS column of `history`, end to end against SQLite and PostgreSQL.

Each runs the real command in a child process (`tests/test_cli.py`'s `cli()`); the store is
set up through the Python API.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager, ResumableWorkflow, RetryPolicy
from aiocheckpoint.cli.store import open_store
from tests.test_cli import NewStore, cli, new_store

__all__ = ["new_store"]

pytestmark = pytest.mark.asyncio

BACKENDS = ["sqlite", "postgres"]


class Boom(RuntimeError):
    """A step's failure."""


async def _story(manager: CheckpointManager) -> None:
    """Step 0 done; step 1 fails once (retried), pauses, is resumed, and finishes."""

    async def run() -> None:
        async with ResumableWorkflow("wf", manager, retry=RetryPolicy(backoff=0)) as wf:
            if wf.resume_step <= 0:
                async with wf.step(0, agent_id="a"):
                    pass
            async with wf.step(1, agent_id="b"):
                if wf.resume_input is None and wf.is_resumed and wf.resume_step == 1:
                    if (await manager.get_workflow("wf")).attempts == 0:  # type: ignore[union-attr]
                        raise Boom("card \x1b[31mdeclined")
                    await wf.pause("approve \u202ethis", {"amount": 5})

    await manager.register_workflow("wf")
    async with ResumableWorkflow("wf", manager) as wf:
        async with wf.step(0, agent_id="a"):
            pass
        await wf.pause("first look")
    await manager.resume_workflow("wf", None)
    with pytest.raises(Boom):
        await run()
    await run()  # pauses
    await manager.resume_workflow("wf", {"ok": True})
    await run()  # finishes


@pytest.mark.parametrize("kind", BACKENDS)
async def test_events_text_json_and_pages(new_store: NewStore, kind: str) -> None:
    """Oldest first, escaped in text and JSON, paged with the cursor the last page printed."""
    url = new_store(kind)
    async with open_store(url, must_exist=False) as manager:
        await _story(manager)
        expected = [str(e.kind) for e in await manager.get_events("wf")]
    assert expected == [
        "paused",
        "resumed",
        "step_failed",
        "retry_scheduled",
        "paused",
        "resumed",
        "completed",
    ]
    shown = cli("events", url, "wf", "--json")
    assert shown.code == 0, shown.err
    document = shown.json()
    assert isinstance(document, dict) and document["next_cursor"] is None
    events = document["events"]
    assert [e["kind"] for e in events] == expected
    assert events[2]["data"] == {"type": "Boom", "message": "card \x1b[31mdeclined"}
    assert events[2]["attempt"] == 1 and events[2]["step"] == 1
    assert events[4]["data"] == {"reason": "approve \u202ethis", "data": {"amount": 5}}
    assert "\x1b" not in shown.out and "\u202e" not in shown.out

    text = cli("events", url, "wf")
    assert text.code == 0, text.err
    lines = text.out.splitlines()
    assert lines[0].split() == ["TIME", "KIND", "STEP", "ATTEMPT", "DATA"]
    assert [line.split()[2] for line in lines[1:]] == expected
    assert "\x1b" not in text.out and "\u202e" not in text.out
    assert "card \\u001b[31mdeclined" in text.out and "\\u202e" in text.out

    first = cli("events", url, "wf", "--limit", "4", "--json")
    page = first.json()
    assert isinstance(page, dict) and len(page["events"]) == 4
    rest = cli("events", url, "wf", "--cursor", page["next_cursor"], "--json").json()
    assert isinstance(rest, dict)
    assert [e["kind"] for e in page["events"] + rest["events"]] == expected
    more = cli("events", url, "wf", "--limit", "4")
    assert "more: aiocheckpoint events" in more.err and "--cursor" in more.err


@pytest.mark.parametrize("kind", BACKENDS)
async def test_history_shows_a_steps_attempts_and_pauses(new_store: NewStore, kind: str) -> None:
    """`history`'s EVENTS column counts each step's failures, pauses and resumes."""
    url = new_store(kind)
    async with open_store(url, must_exist=False) as manager:
        await _story(manager)
    shown = cli("history", url, "wf")
    assert shown.code == 0, shown.err
    rows = {line.split()[0]: line for line in shown.out.splitlines()[1:]}
    assert rows["1"].endswith("1 failed, 2 paused, 2 resumed, 1 retry")
    assert rows["0"].endswith(" -")
    document = cli("history", url, "wf", "--json").json()
    assert isinstance(document, dict)
    by_step = {c["step"]: c["events"] for c in document["checkpoints"]}
    assert [e["kind"] for e in by_step[1]][:2] == ["paused", "resumed"]
    assert by_step[0] == []


async def test_a_store_without_events(new_store: NewStore) -> None:
    """A `file:` store keeps no event history: `events` is a usage error, `history` says -."""
    url = new_store("file")
    async with open_store(url, must_exist=False) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", {})
    result = cli("events", url, "wf")
    assert result.code == 2 and "keeps no event history" in result.error_line()
    shown = cli("history", url, "wf", "--json").json()
    assert isinstance(shown, dict) and shown["checkpoints"][0]["events"] is None


@pytest.mark.parametrize("kind", BACKENDS)
async def test_copy_export_and_import_carry_the_history(
    new_store: NewStore, kind: str, tmp_path: Path
) -> None:
    """A workflow's events reach the destination as they were, once, by copy and import."""
    source = new_store(kind)
    async with open_store(source, must_exist=False) as manager:
        await _story(manager)
        await manager.register_workflow("cancelled")
        await manager.cancel_workflow("cancelled", reason="by \x1b mistake")
        expected = {
            wf: [(str(e.kind), e.step, e.attempt, e.data) for e in await manager.get_events(wf)]
            for wf in ("wf", "cancelled")
        }
    copied = new_store("postgres" if kind == "sqlite" else "sqlite")
    exported = tmp_path / "out.jsonl"
    imported = new_store(kind)
    assert cli("copy", source, copied).code == 0
    assert cli("copy", source, copied).code == 0  # again: the same history, not twice
    assert cli("export", source, str(exported)).code == 0
    assert cli("import", str(exported), imported).code == 0
    for url in (copied, imported):
        async with open_store(url, must_exist=True) as manager:
            for workflow_id, events in expected.items():
                found = await manager.get_events(workflow_id)
                assert [(str(e.kind), e.step, e.attempt, e.data) for e in found] == events
    lines = exported.read_text(encoding="utf-8").splitlines()
    assert '"version":3' in lines[0] and "\x1b" not in exported.read_text(encoding="utf-8")
    assert sum('"type":"event"' in line for line in lines) == sum(map(len, expected.values()))
