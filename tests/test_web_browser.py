"""The web inspector in a real browser: Playwright driving the system's Chromium
(/usr/bin/chromium, installed by .ci/run) against `aiocheckpoint serve` run as a child
process over stores built by workflow runs. Each page loads with no console error, links
lead where they say, and script planted in a workflow id and in a state never runs.
Run with ``pytest -m browser``; with ``AIOCHECKPOINT_DOC_SHOTS=1`` the screenshots are
written to docs/web/ for docs/web.md (otherwise a run leaves the tracked files alone)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.async_api import Page, async_playwright

from tests.test_cli import BACKENDS, NewStore, new_store
from tests.web_support import HOSTILE, populate, serving

__all__ = ["new_store"]

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "web"


def watch(page: Page) -> list[str]:
    """The console errors and uncaught page errors of ``page``, as they come."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


async def not_pwned(page: Page) -> None:
    assert await page.evaluate("typeof window.__pwned") == "undefined"


@pytest.mark.parametrize("kind", BACKENDS)
async def test_click_through_and_no_planted_script_runs(kind: str, new_store: NewStore) -> None:
    """Workflows -> a workflow -> a step, by clicking; then the hostile workflow and its
    step: its id and state are shown as text and the script in them never ran."""
    url = new_store(kind)
    await populate(url)
    with serving(url) as address:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = await browser.new_page(viewport={"width": 1200, "height": 800})
            errors = watch(page)
            await page.goto(f"{address}/")
            assert await page.locator("h1").inner_text() == "Workflows"
            shoot = kind == "sqlite" and os.environ.get("AIOCHECKPOINT_DOC_SHOTS") == "1"
            if shoot:
                await page.screenshot(path=str(SHOTS / "workflows.png"), full_page=True)
            await page.locator("table a.wf", has_text="done").first.click()
            await page.wait_for_url("**/workflow?id=done")
            assert "Workflow done" in await page.locator("h1").inner_text()
            if shoot:
                await page.screenshot(path=str(SHOTS / "workflow.png"), full_page=True)
            await page.get_by_role("link", name="2", exact=True).first.click()
            await page.wait_for_url("**/step?id=done&step=2")
            assert await page.locator("h1").inner_text() == "Step 2 of done"
            assert await page.locator("ul.tree .type", has_text="datetime").count() == 1
            if shoot:
                await page.screenshot(path=str(SHOTS / "step.png"))
            await page.goto(f"{address}/")

            await page.locator("a.doubt", has_text="doubt").first.click()
            await page.wait_for_url("**/workflow?id=doubt")
            assert "effect resolve" in await page.locator("code.command").inner_text()
            if shoot:
                await page.screenshot(path=str(SHOTS / "in-doubt.png"), full_page=True)

            await page.goto(f"{address}/")
            hostile = page.locator("table a.wf", has_text="<script>")
            assert "<script>window.__pwned=1</script>" in await hostile.inner_text()
            await hostile.click()
            await page.wait_for_load_state()
            await not_pwned(page)
            assert "<script>window.__pwned=1</script>" in await page.locator("h1").inner_text()
            await page.locator("a.step").first.click()
            await page.wait_for_load_state()
            await not_pwned(page)
            state = await page.locator("ul.tree").inner_text()
            assert '<img src=x onerror="window.__pwned=2">' in state
            assert "<script>window.__pwned=3</script>" in state
            assert await page.locator("ul.tree img, ul.tree script").count() == 0
            await browser.close()
    assert errors == []
    assert HOSTILE.startswith("<script>")


async def test_diff_pictures_store_and_actions_in_the_browser(new_store: NewStore) -> None:
    """With --allow-actions and a token: a step's diff shows the changed key, the timeline
    and the throughput are drawn, the store verifies, a paused workflow is resumed with
    input by its form and its history shows the pause and the resume; a failed step's
    error is shown as text; the hostile workflow's diff, timeline and forms run no script."""
    url = new_store("sqlite")
    await populate(url)
    env = {"AIOCHECKPOINT_TOKEN": "t0ken"}
    shoot = os.environ.get("AIOCHECKPOINT_DOC_SHOTS") == "1"
    with serving(url, "--allow-actions", env=env) as address:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = await browser.new_page(viewport={"width": 1200, "height": 800})
            errors = watch(page)
            await page.goto(f"{address}/workflow?id=done&token=t0ken")
            assert "actions allowed" in await page.locator("header").inner_text()
            assert await page.locator("svg.chart rect.bar").count() >= 3
            await page.locator("svg.chart a").last.click()
            await page.wait_for_url("**/step?id=done&step=2")
            await page.locator("a.diff").click()
            await page.wait_for_url("**/diff?id=done&step=2")
            rows = page.locator("table.diff tbody tr")
            assert await rows.count() == 1
            assert "count" in await rows.first.inner_text()
            await page.locator("input[name=against]").fill("0")
            await page.locator("form.filters button").click()
            await page.wait_for_url("**/diff?id=done&step=2&against=0")
            assert "against step 0" in await page.locator("h1").inner_text()
            if shoot:
                await page.screenshot(path=str(SHOTS / "diff.png"))

            await page.locator("header nav a", has_text="throughput").click()
            await page.wait_for_url("**/throughput")
            assert await page.locator("svg.chart rect.bar").count() >= 1
            if shoot:
                await page.screenshot(path=str(SHOTS / "throughput.png"))
            await page.locator("header nav a", has_text="store").click()
            await page.get_by_role("button", name="Verify").click()
            summary = await page.locator(".verify-summary").inner_text()
            assert "0 corrupted, 0 unreadable" in summary
            if shoot:
                await page.screenshot(path=str(SHOTS / "store.png"))

            await page.goto(f"{address}/workflow?id=waiting")
            await page.locator("textarea[name=input]").fill('{"approved": true}')
            if shoot:
                await page.screenshot(path=str(SHOTS / "actions.png"), full_page=True)
            await page.get_by_role("button", name="Resume").click()
            await page.wait_for_load_state()
            assert page.url.endswith("/workflow?id=waiting"), await page.content()
            facts = await page.locator("dl.facts").first.inner_text()
            assert "unfinished" in facts
            events = page.locator("table.events tbody tr td.event-kind")
            assert await events.all_inner_texts() == ["paused", "resumed"]
            assert '"approved": true' in await page.locator("table.events").inner_text()
            assert await page.locator("svg.chart rect.event-paused").count() == 1

            await page.goto(f"{address}/workflow?id=broken")
            failed = page.locator("table.events tr.event-step_failed")
            assert "the tool <b>exploded</b>" in await failed.inner_text()
            assert await page.locator("table.events b", has_text="exploded").count() == 0
            assert await page.locator("svg.chart rect.event-step_failed").count() == 1
            if shoot:
                await page.screenshot(path=str(SHOTS / "history.png"), full_page=True)

            await page.goto(f"{address}/")
            await page.locator("table a.wf", has_text="<script>").click()
            await page.wait_for_load_state()
            await not_pwned(page)
            assert await page.locator("svg.chart").count() == 1
            await page.locator("a.step").first.click()
            await page.locator("a.diff").click()
            await page.wait_for_load_state()
            await not_pwned(page)
            table = await page.locator("table.diff").inner_text()
            assert "__pwned=1</script>" in table and "<img src=x onerror=" in table
            assert await page.locator("table.diff img, table.diff script").count() == 0
            await browser.close()
    assert errors == []
