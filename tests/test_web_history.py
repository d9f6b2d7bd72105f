"""The workflow page's event history: each attempt, pause, resume and cancel of real runs,
shown as rows and timeline spans, escaped, paged, and locked on an encrypted store read
without its key."""

from __future__ import annotations

import asyncio
import html
import os
import re
from datetime import timedelta
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointManager,
    EffectInDoubtError,
    Keyring,
    ResumableWorkflow,
    RetryPolicy,
    open_storage,
)
from aiocheckpoint.web import history
from tests.test_cli import NewStore, new_store
from tests.test_web_pictures import svg
from tests.web_support import HOSTILE, client

__all__ = ["new_store"]

K1 = os.urandom(32)
KEYS = Keyring(keys={"k1": K1}, primary="k1")
OTHER = Keyring(keys={"k2": os.urandom(32)}, primary="k2")


class Boom(RuntimeError):
    """A step's failure."""


async def story(url: str, keys: Keyring | None = None) -> None:
    """ "wf": step 0 done; step 1 fails once (retried) and then succeeds; it pauses with a
    hostile reason, is resumed with input, and finishes. "stop": paused, then cancelled.
    "calm": paused, resumed, finished (its record keeps no sealed text)."""
    async with CheckpointManager(open_storage(url), encryption=keys) as manager:

        async def run() -> None:
            async with ResumableWorkflow("wf", manager, retry=RetryPolicy(backoff=0)) as wf:
                if wf.resume_step <= 0:
                    async with wf.step(0, agent_id="planner"):
                        wf.state.set("plan", 1)
                async with wf.step(1, agent_id="worker"):
                    record = await manager.get_workflow("wf")
                    assert record is not None
                    if record.attempts == 0 and not wf.is_resumed:
                        raise Boom(f"tool failed {HOSTILE}")
                    if wf.resume_input is None:
                        await wf.pause(f"approve {HOSTILE}", {"amount": HOSTILE})
                    wf.state.set("done", True)

        await manager.register_workflow("wf")
        with pytest.raises(Boom):
            await run()
        await run()  # succeeds at step 1's second attempt, then pauses
        await manager.resume_workflow("wf", {"approved-by": "ops-7c1d"})
        await run()  # finishes
        async with ResumableWorkflow("stop", manager) as wf:
            async with wf.step(0, agent_id="a"):
                pass
            await wf.pause("wait")
        await manager.cancel_workflow("stop", f"no longer {HOSTILE}")
        async with ResumableWorkflow("calm", manager) as wf:
            await wf.pause("look")
        await manager.resume_workflow("calm", "fine")
        async with ResumableWorkflow("calm", manager) as wf:
            async with wf.step(0, agent_id="a"):
                pass


def events_table(page: str) -> str:
    assert 'class="list events"' in page, page
    return page.split('class="list events"', 1)[1].split("</table>", 1)[0]


def kinds(page: str) -> list[str]:
    return re.findall(r'<td class="event-kind">([^<]*)</td>', events_table(page))


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_each_attempt_pause_resume_and_cancel_is_shown(
    kind: str, new_store: NewStore
) -> None:
    """The failed attempt (its number, error type and message), the pause (reason, data),
    the resume (input) and the completion, in order, each on the timeline too; the
    cancelled workflow's pause runs to its cancel."""
    url = new_store(kind)
    await story(url)
    async with client(url) as http:
        page = (await http.get("/workflow", params={"id": "wf"})).text
        assert kinds(page) == [
            "step_failed",
            "retry_scheduled",
            "paused",
            "resumed",
            "completed",
        ]
        table = events_table(page)
        failed = table.split('<tr class="event-step_failed">', 1)[1].split("</tr>", 1)[0]
        assert re.search(r"<td>1</td>\s*<td class=\"details\">", failed)  # attempt 1
        assert "<b>type</b> Boom" in failed and "tool failed &lt;script&gt;" in failed
        assert "<b>reason</b> approve &lt;script&gt;" in table
        assert "<b>input</b> {&#34;approved-by&#34;: &#34;ops-7c1d&#34;}" in table
        drawing = svg(page)
        assert drawing.count('class="bar event-step_failed"') == 1
        assert drawing.count('class="bar event-paused"') == 1  # paused to resumed: one span
        pause = drawing.split('class="bar event-paused"', 1)[1].split("</title>", 1)[0]
        assert "paused" in pause and "resumed" in pause
        stop = (await http.get("/workflow", params={"id": "stop"})).text
        assert kinds(stop) == ["paused", "cancelled"]
        assert "<b>reason</b> no longer &lt;script&gt;" in events_table(stop)
        assert 'class="bar event-cancelled"' in svg(stop)


async def test_hostile_event_texts_render_as_text(new_store: NewStore) -> None:
    """HTML, script, bidi and control characters of errors, reasons and data are escaped
    and made visible, in the table and in the timeline's tooltips."""
    url = new_store("sqlite")
    await story(url)
    async with client(url) as http:
        page = (await http.get("/workflow", params={"id": "wf"})).text
    assert "<script>window" not in page and "<b>\u202e" not in page
    assert "\u202e" not in page and "\x07" not in page
    assert "\\u202e" in events_table(page) and "\\u0007" in events_table(page)
    assert html.escape(HOSTILE[:30], quote=True).replace("&#x27;", "&#39;")[:20] in page


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_sealed_texts_are_locked_without_keys(kind: str, new_store: NewStore) -> None:
    """An encrypted store: without keys each sealed text (reason, input, message) shows as
    locked with its key id and no plaintext; with the keys they read; with another key the
    page says why and shows them locked."""
    url = new_store(kind)
    await story(url, KEYS)
    async with client(url) as http:
        locked = (await http.get("/workflow", params={"id": "wf"})).text
    table = events_table(locked)
    assert table.count('class="detail locked"') == 4  # message, reason, data, input
    assert "[sealed: key &#39;k1&#39;]" in table
    assert "<b>type</b> Boom" in table  # an error's type stays in the clear
    assert "ops-7c1d" not in locked and "tool failed" not in locked
    async with client(url, KEYS) as http:
        opened = events_table((await http.get("/workflow", params={"id": "wf"})).text)
    assert "locked" not in opened and "ops-7c1d" in opened and "tool failed" in opened
    async with client(url, OTHER) as http:
        other = (await http.get("/workflow", params={"id": "calm"})).text
    assert "key &#39;k1&#39; is not in the inspector&#39;s keys" in other, other
    assert events_table(other).count('class="detail locked"') == 3  # reason, data, input


async def test_the_history_is_read_a_bounded_page_at_a_time(
    new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request reads at most EVENTS events and links to the next page, which continues
    where it stopped; a forged cursor is refused; the file store says it keeps none."""
    url = new_store("sqlite")
    await story(url)
    monkeypatch.setattr(history, "EVENTS", 2)
    async with client(url) as http:
        first = (await http.get("/workflow", params={"id": "wf"})).text
        assert kinds(first) == ["step_failed", "retry_scheduled"]
        assert "At most 2 events a page" in first
        later = re.search(r'class="later-events" href="([^"]+)"', first)
        assert later is not None
        second = (await http.get(html.unescape(later.group(1)))).text
        assert kinds(second) == ["paused", "resumed"]
        forged = await http.get("/workflow", params={"id": "wf", "events": "<x>"})
        assert forged.status_code == 400
    file_url = new_store("file")
    async with CheckpointManager(open_storage(file_url)) as manager:
        await manager.create_checkpoint("f", 0, "a", "completed", {})
    async with client(file_url) as http:
        page = (await http.get("/workflow", params={"id": "f"})).text
    assert "keeps no event history" in page


class Interrupted(BaseException):
    """A crash inside an effect's call."""


async def test_sleeps_takeovers_and_effects_in_doubt_are_shown(new_store: NewStore) -> None:
    """A durable sleep (until when), a lease taken over from a runner that let it expire
    (from whom), an effect in doubt that stopped a run and its settling: each a row and a
    mark on the timeline."""
    url = new_store("sqlite")
    async with CheckpointManager(open_storage(url)) as manager:
        async with ResumableWorkflow("nap", manager) as wf:
            async with wf.step(0, agent_id="a"):
                pass
            await wf.sleep(timedelta(hours=24))
        await manager.acquire_lease("nap", "old-runner", ttl=0.05)
        await asyncio.sleep(0.2)  # its lease expires
        await manager.acquire_lease("nap", "new-runner", ttl=30)

        async def crash() -> None:
            raise Interrupted

        with pytest.raises(Interrupted):
            async with ResumableWorkflow("doubt", manager) as wf:
                async with wf.step(0, agent_id="payer"):
                    await wf.effect("pay", crash)
        with pytest.raises(EffectInDoubtError):
            async with ResumableWorkflow("doubt", manager) as wf:
                async with wf.step(0, agent_id="payer"):
                    await wf.effect("pay", crash)
        [effect] = await manager.list_in_doubt_effects("doubt")
        await manager.resolve_effect("doubt", effect.step, "pay", happened=True, result="ok")
    async with client(url) as http:
        nap = (await http.get("/workflow", params={"id": "nap"})).text
        doubt = (await http.get("/workflow", params={"id": "doubt"})).text
    assert kinds(nap) == ["sleeping", "lease_taken_over"]
    assert "<b>until</b> 20" in events_table(nap)
    assert "<b>previous_owner</b> old-runner" in events_table(nap)
    assert 'class="bar event-sleeping"' in svg(nap)
    assert 'class="bar event-lease_taken_over"' in svg(nap)
    assert "effect_in_doubt" in kinds(doubt) and kinds(doubt)[-1] == "effect_resolved"
    assert "<b>key</b> pay" in events_table(doubt)
    assert 'class="bar event-effect_resolved"' in svg(doubt)


async def test_the_timeline_follows_the_history_pages_within_a_bound(
    new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timeline draws the events from the table's page on, TIMELINE_EVENTS at most (the
    table's page and the ones after it), and moves with the table's pages; a request reads
    no more events than that, however long the history."""
    url = new_store("sqlite")
    await story(url)
    async with CheckpointManager(open_storage(url)) as manager:
        for n in range(6):  # "long": six pauses, each resumed
            async with ResumableWorkflow("long", manager) as wf:
                await wf.pause(f"again {n}")
            await manager.resume_workflow("long", n)
    read: list[int] = []
    original = CheckpointManager.get_events

    async def counted(self: CheckpointManager, *args: Any, **kwargs: Any) -> Any:
        page = await original(self, *args, **kwargs)
        read.append(len(page))
        return page

    monkeypatch.setattr(CheckpointManager, "get_events", counted)
    monkeypatch.setattr(history, "EVENTS", 2)
    monkeypatch.setattr(history, "TIMELINE_EVENTS", 4)
    async with client(url) as http:
        first = (await http.get("/workflow", params={"id": "wf"})).text
        assert kinds(first) == ["step_failed", "retry_scheduled"]
        drawing = svg(first)
        assert drawing.count('class="bar event-step_failed"') == 1
        assert drawing.count('class="bar event-paused"') == 1  # from the next table page
        assert 'class="bar event-completed"' not in drawing  # the fifth event: not drawn
        assert "(4 events, at most 4 a request" in first
        later = re.search(r'class="later-events" href="([^"]+)"', first)
        assert later is not None
        second = (await http.get(html.unescape(later.group(1)))).text
        assert kinds(second) == ["paused", "resumed"]
        drawing = svg(second)
        assert 'class="bar event-step_failed"' not in drawing
        assert drawing.count('class="bar event-paused"') == 1
        assert 'class="bar event-completed"' in drawing and "(3 events)" in second
        read.clear()
        long = (await http.get("/workflow", params={"id": "long"})).text
        assert sum(read) == 4 and max(read) <= 2, read  # of 12 events
        assert kinds(long) == ["paused", "resumed"]
        assert svg(long).count('class="bar event-paused"') == 2
