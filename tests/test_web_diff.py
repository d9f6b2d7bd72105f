"""The inspector's diff page (/diff): what changed in a step's state from the previous step
or a chosen one, typed values by their type, the changes paged, the page bounded, locked and
hostile states handled. Real stores built by real workflow runs."""

from __future__ import annotations

import datetime as dt
import html
import re
from urllib.parse import parse_qs, urlsplit

import pytest

from aiocheckpoint import CheckpointManager, ResumableWorkflow, open_storage
from aiocheckpoint.web import diff, tree
from tests.test_cli import BACKENDS, NewStore, new_store
from tests.test_web import links
from tests.web_support import HOSTILE, KEYS, client, populate

__all__ = ["new_store"]

ROW = re.compile(
    r'<tr class="op-(\w+)">\s*<td class="op">[^<]*</td>\s*<td class="key">([^<]*)</td>'
)


def rows(page: str) -> list[tuple[str, str]]:
    """(op, path) of each row of a diff page."""
    return [(op, html.unescape(path)) for op, path in ROW.findall(page)]


async def two_steps(url: str) -> None:
    """Workflow "w": step 0, then step 1 with one key changed, one removed, one added, a
    datetime changed and one left alone; step 2 changes only the count back."""
    async with CheckpointManager(open_storage(url)) as manager:
        async with ResumableWorkflow("w", manager) as wf:
            async with wf.step(0, agent_id="a"):
                wf.state.set("count", 1)
                wf.state.set("gone", "bye")
                wf.state.set("when", dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
                wf.state.set("same", [1, 2, 3])
            async with wf.step(1, agent_id="a"):
                wf.state.set("count", 2)
                wf.state.delete("gone")
                wf.state.set("when", dt.datetime(2026, 2, 2, tzinfo=dt.timezone.utc))
                wf.state.set("blob", b"\x00\x01")
            async with wf.step(2, agent_id="a"):
                wf.state.set("count", 1)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_diff_shows_added_removed_and_changed_keys(kind: str, new_store: NewStore) -> None:
    """Against the previous step by default: the changed, removed and added keys, typed
    values compared whole and shown by type (no "$dt" in a path), unchanged keys absent."""
    url = new_store(kind)
    await two_steps(url)
    async with client(url) as http:
        page = (await http.get("/diff", params={"id": "w", "step": "1"})).text
        assert "Step 1 against step 0" in page
        assert sorted(rows(page)) == [
            ("added", "blob"),
            ("changed", "count"),
            ("changed", "when"),
            ("removed", "gone"),
        ]
        when = page.split('<td class="key">when</td>', 1)[1].split("</tr>", 1)[0]
        assert when.count(">datetime<") == 2 and "2026-01-01" in when and "2026-02-02" in when
        assert "bytes (2 bytes, base64)" in page and "$dt" not in page
        first = (await http.get("/diff", params={"id": "w", "step": "0"})).text
        assert "against nothing" in first and {op for op, _ in rows(first)} == {"added"}


async def test_a_diff_against_a_chosen_step_and_the_links_to_it(new_store: NewStore) -> None:
    """The step page links to its diff; ?against= (the page's form) compares with any step:
    step 2 against step 0 differs only where step 1 changed and step 2 did not undo."""
    url = new_store("sqlite")
    await two_steps(url)
    async with client(url) as http:
        step = (await http.get("/step", params={"id": "w", "step": "2"})).text
        [target] = [h for h in links(step) if h.startswith("/diff?")]
        assert parse_qs(urlsplit(target).query) == {"id": ["w"], "step": ["2"]}
        previous = (await http.get(target)).text
        assert rows(previous) == [("changed", "count")]
        assert 'name="against"' in previous and 'action="/diff"' in previous
        chosen = (await http.get("/diff", params={"id": "w", "step": "2", "against": "0"})).text
        assert "Step 2 against step 0" in chosen
        assert sorted(rows(chosen)) == [("added", "blob"), ("changed", "when"), ("removed", "gone")]
        backwards = await http.get("/diff", params={"id": "w", "step": "0", "against": "2"})
        assert ("added", "gone") in rows(backwards.text)
        missing = await http.get("/diff", params={"id": "w", "step": "1", "against": "9"})
        assert missing.status_code == 200 and "step 9: no checkpoint at this step" in missing.text
        bad = await http.get("/diff", params={"id": "w", "step": "1", "against": "x"})
        assert bad.status_code == 400


async def test_a_large_diff_is_paged_and_each_page_is_bounded(new_store: NewStore) -> None:
    """250 changed keys whose values are 10,000-character strings and 1,000-item lists
    (which become dicts): pages of CHANGES rows, each under 1 MB, "More changes" leads
    through every change once."""
    url = new_store("sqlite")
    async with CheckpointManager(open_storage(url)) as manager:
        async with ResumableWorkflow("big", manager) as wf:
            async with wf.step(0, agent_id="a"):
                for n in range(250):
                    wf.state.set(f"k{n:03d}", "a" * 10_000 if n % 2 else list(range(1_000)))
            async with wf.step(1, agent_id="a"):
                for n in range(250):
                    wf.state.set(f"k{n:03d}", "b" * 10_000 if n % 2 else {"n": list(range(1_000))})
    seen: list[str] = []
    async with client(url) as http:
        target: str | None = "/diff?id=big&step=1"
        while target is not None:
            page = (await http.get(target)).text
            assert len(page) < 1_000_000
            assert len(rows(page)) <= diff.CHANGES
            seen += [path for _, path in rows(page)]
            following = [h for h in links(page) if "offset=" in h]
            target = following[0] if following else None
    assert seen == [f"k{n:03d}" for n in range(250)]


async def test_a_value_preview_is_cut_to_its_limit() -> None:
    """describe() writes a preview of at most about PREVIEW characters of any value, names
    its type and says it was cut."""
    huge = {"list": list(range(1_000_000)), "text": "x" * 1_000_000}
    node = tree.describe(huge)
    assert node.kind == "dict" and node.text.startswith("2 items: {")
    assert len(node.text) < tree.PREVIEW + 100 and node.left_out
    typed = tree.describe({"$dt": "2026-01-01T00:00:00+00:00"})
    assert typed.kind == "datetime" and not typed.left_out
    long = tree.describe("y" * 5000)
    assert len(long.text) == tree.PREVIEW and long.left_out == 5000 - tree.PREVIEW


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_a_locked_state_is_said_and_the_hostile_one_is_text(
    kind: str, new_store: NewStore
) -> None:
    """Without keys the diff says which step is locked; hostile keys and values arrive as
    text (control and bidi characters as escapes) outside the form's value."""
    url = new_store(kind)
    await populate(url, keys=KEYS)
    async with client(url) as http:
        locked = await http.get("/diff", params={"id": "done", "step": "1"})
        assert locked.status_code == 200 and "step 1: locked: encrypted" in locked.text
    async with client(url, keys=KEYS) as http:
        page = (await http.get("/diff", params={"id": HOSTILE, "step": "0"})).text
    shown = re.sub(r'<input type="hidden" name="id" value="[^"]*">', "", page)
    assert "<script>window" not in shown and "<img" not in shown
    assert "\u202e" not in shown and "\x07" not in shown and "\x1b" not in shown
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in shown
    assert "&lt;img src=x onerror=" in shown and "\\u001b" in shown
