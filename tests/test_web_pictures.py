"""The inspector's pictures: a workflow's timeline and the store's throughput, drawn on the
server as SVG (no script), from what the pages read and from bounded queries."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointManager,
    EffectRecord,
    EffectState,
    ResumableWorkflow,
    open_storage,
)
from aiocheckpoint.storage.queries import WorkflowQuery
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from aiocheckpoint.web import timeline
from tests.test_cli import BACKENDS, NewStore, new_store
from tests.test_web import links
from tests.web_support import HOSTILE, client, populate

__all__ = ["new_store"]


def svg(page: str) -> str:
    """The page's (first) SVG drawing."""
    assert page.count("<svg") >= 1, page
    return page[page.index("<svg") : page.index("</svg>")]


@pytest.mark.parametrize("kind", BACKENDS)
async def test_the_workflow_timeline_draws_each_step_linked(kind: str, new_store: NewStore) -> None:
    """One bar per step in its agent's lane, coloured by status, linking to the step; a
    failed workflow ends in a failed span naming its error, escaped."""
    url = new_store(kind)
    await populate(url)
    async with client(url) as http:
        done = svg((await http.get("/workflow", params={"id": "done"})).text)
        assert done.count('class="bar agent-completed"') == 3
        events = kind != "file"  # the file store keeps no history
        assert [h for h in links(done) if h.startswith("/step?")] == [
            *(f"/step?id=done&step={n}" for n in range(3)),
            *(["/step?id=done&step=2"] if events else []),  # its "completed" event
        ]
        assert ('class="bar event-completed"' in done) is events
        assert "agent agent-0" in done and "agent agent-2" in done
        broken = svg((await http.get("/workflow", params={"id": "broken"})).text)
        assert 'class="bar agent-failed"' in broken
        if kind != "file":  # no record: no status
            assert 'class="bar status-failed"' in broken and "&lt;b&gt;exploded" in broken
        doubt = svg((await http.get("/workflow", params={"id": "doubt"})).text)
        assert 'class="bar state-in_doubt"' in doubt and 'class="bar state-done"' in doubt
        hostile = (await http.get("/workflow", params={"id": HOSTILE})).text
    drawing = svg(hostile)
    assert "<script" not in drawing and "\u202e" not in drawing and "\x07" not in drawing
    assert "&lt;script&gt;" in drawing


async def seed_throughput(url: str) -> None:
    """Besides populate(): a workflow with a checkpoint and an effect in doubt."""
    await populate(url)
    async with CheckpointManager(open_storage(url)) as manager:
        async with ResumableWorkflow("doubt-2", manager) as wf:
            async with wf.step(0, agent_id="a"):
                wf.state.set("n", 1)
        now = datetime.now(timezone.utc)
        intent = EffectRecord("doubt-2", 1, "pay", "pay", EffectState.IN_DOUBT, 1, now, "i")
        await manager.record_effect(intent)


def totals(page: str) -> dict[str, int]:
    legend = page.split('class="counts legend"', 1)[1].split("</ul>", 1)[0]
    return {name: int(n) for name, n in re.findall(r"</span> ([\w ]+) <b>(\d+)</b>", legend)}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_throughput_counts_updated_failed_and_in_doubt(
    kind: str, new_store: NewStore
) -> None:
    """The last hour: the workflows updated, the failed one and the one in doubt, each
    counted once, drawn as bars whose tooltips say the counts."""
    url = new_store(kind)
    await seed_throughput(url)
    async with client(url) as http:
        page = (await http.get("/throughput")).text
        assert totals(page) == {"updated": 3, "failed": 1, "in doubt": 1}
        drawing = svg(page)
        assert re.search(r": 1 failed</title>", drawing)
        assert re.search(r": 1 in doubt</title>", drawing)
        day = await http.get("/throughput", params={"minutes": "1440"})
        assert day.status_code == 200 and "per 24m" in day.text
        assert (await http.get("/throughput", params={"minutes": "x"})).status_code == 400


async def test_throughput_reads_a_bounded_sample(
    new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query asks for the latest SAMPLE records updated in the window, newest first;
    past it the page says how far back its counts go. A file store (no records) says there
    is nothing to count."""
    url = new_store("sqlite")
    await seed_throughput(url)
    monkeypatch.setattr(timeline, "SAMPLE", 2)
    queries: list[WorkflowQuery] = []
    listing = SQLiteCheckpointStorage.query_workflow_records

    async def counted(self: SQLiteCheckpointStorage, query: WorkflowQuery) -> Any:
        queries.append(query)
        return await listing(self, query)

    monkeypatch.setattr(SQLiteCheckpointStorage, "query_workflow_records", counted)
    async with client(url) as http:
        page = (await http.get("/throughput")).text
    assert [(q.limit, q.newest_first, q.updated_after is not None) for q in queries] == [
        (2, True, True)
    ]
    assert "these counts go back to" in page
    assert sum(totals(page).values()) == 2
    file_url = new_store("file")
    await populate(file_url)
    async with client(file_url) as http:
        assert "nothing to count" in (await http.get("/throughput")).text
