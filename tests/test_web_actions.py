"""Operator actions in the inspector (serve --allow-actions): resume with input, retry,
cancel and settling an effect, each by a POST that carries a CSRF token bound to the
browser's cookie. Without --allow-actions there are no forms and no route that writes; a
POST without the token, with a wrong one or from another origin changes nothing; an action
is refused while a runner holds the workflow's lease, as on the command line."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from aiocheckpoint import CheckpointManager, EffectState, open_storage
from tests.test_cli import NewStore, cli, new_store
from tests.web_support import HOSTILE, client, populate

__all__ = ["new_store"]

TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@asynccontextmanager
async def acting(url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with client(url, token=TOKEN, allow_actions=True) as http:
        http.headers.update(AUTH)
        yield http


async def form_token(http: httpx.AsyncClient, workflow_id: str) -> str:
    """The CSRF token of the workflow page's forms (the visit also sets the cookie)."""
    page = (await http.get("/workflow", params={"id": workflow_id})).text
    tokens = set(re.findall(r'name="csrf" value="([^"]+)"', page))
    assert len(tokens) == 1, page
    return tokens.pop()


async def snapshot(url: str) -> list[Any]:
    async with CheckpointManager(open_storage(url)) as manager:
        records = list(await manager.list_workflow_records(kind=None))
        effects = await manager.get_effects("doubt", 0)
    return [records, effects]


async def test_without_allow_actions_there_are_no_forms_and_posts_change_nothing(
    new_store: NewStore,
) -> None:
    url = new_store("sqlite")
    await populate(url)
    before = await snapshot(url)
    async with client(url) as http:
        page = (await http.get("/workflow", params={"id": "waiting"})).text
        assert '<form method="post"' not in page and "/action/" not in page
        assert "read-only" in page
        for name in ("resume", "retry", "cancel", "resolve"):
            reply = await http.post(f"/action/{name}", data={"id": "waiting", "csrf": "x"})
            assert reply.status_code in (404, 405)
    assert await snapshot(url) == before


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_each_action_does_what_the_cli_does(kind: str, new_store: NewStore) -> None:
    """Resume with input, cancel with a reason, retry, and settle the effect in doubt."""
    url = new_store(kind)
    await populate(url)
    async with acting(url) as http:
        token = await form_token(http, "waiting")
        reply = await http.post(
            "/action/resume", data={"csrf": token, "id": "waiting", "input": '{"ok": true}'}
        )
        assert reply.status_code == 303 and reply.headers["location"] == "/workflow?id=waiting"
        reply = await http.post(
            "/action/cancel", data={"csrf": token, "id": "waiting", "reason": "<b>no</b>"}
        )
        assert reply.status_code == 303
        page = (await http.get("/workflow", params={"id": "waiting"})).text
        assert "status-cancelled" in page and "&lt;b&gt;no&lt;/b&gt;" in page
        assert 'action="/action/retry"' in page
        assert (await http.post("/action/retry", data={"csrf": token, "id": "waiting"})).is_redirect
        doubt = (await http.get("/workflow", params={"id": "doubt"})).text
        assert 'action="/action/resolve"' in doubt
        settle = {"csrf": token, "id": "doubt", "step": "0", "key": "pay"}
        reply = await http.post(
            "/action/resolve", data={**settle, "outcome": "happened", "result": '{"paid": 5}'}
        )
        assert reply.status_code == 303
        again = await http.post("/action/resolve", data={**settle, "outcome": "rerun"})
        assert again.status_code == 400 and "no effect" in again.text
        bad = await http.post("/action/resume", data={"csrf": token, "id": "done"})
        assert bad.status_code == 400 and "not paused" in html.unescape(bad.text)
    async with CheckpointManager(open_storage(url)) as manager:
        record = await manager.get_workflow("waiting")
        assert record is not None and record.status.value == "unfinished"
        assert record.resume_input == {"ok": True}
        [pay] = [e for e in await manager.get_effects("doubt", 0) if e.key == "pay"]
        assert pay.state is EffectState.DONE and pay.result == {"paid": 5}


async def test_a_post_without_or_with_a_wrong_csrf_token_changes_nothing(
    new_store: NewStore,
) -> None:
    """Missing token, wrong token, a token from another browser's cookie, no cookie, another
    origin, no access token, an oversized form: each refused, the store unchanged."""
    url = new_store("sqlite")
    await populate(url)
    before = await snapshot(url)
    async with acting(url) as http:
        token = await form_token(http, "waiting")
        form = {"id": "waiting", "reason": "x"}
        assert (await http.post("/action/cancel", data=form)).status_code == 403
        wrong = {**form, "csrf": "0" * 64}
        assert (await http.post("/action/cancel", data=wrong)).status_code == 403
        cookie = http.cookies.get("aiocheckpoint_csrf")
        assert cookie
        http.cookies.set("aiocheckpoint_csrf", "another-browser")
        assert (await http.post("/action/cancel", data={**form, "csrf": token})).status_code == 403
        http.cookies.clear()
        assert (await http.post("/action/cancel", data={**form, "csrf": token})).status_code == 403
        http.cookies.set("aiocheckpoint_csrf", cookie)
        evil = {"origin": "http://evil.example"}
        reply = await http.post("/action/cancel", data={**form, "csrf": token}, headers=evil)
        assert reply.status_code == 403
        big = {**form, "csrf": token, "reason": "x" * 1_100_000}
        assert (await http.post("/action/cancel", data=big)).status_code == 413
        anonymous = await http.post(
            "/action/cancel", data={**form, "csrf": token}, headers={"authorization": ""}
        )
        assert anonymous.status_code == 401
        assert await snapshot(url) == before
        ok = await http.post("/action/cancel", data={**form, "csrf": token})
        assert ok.status_code == 303
    assert await snapshot(url) != before


async def test_an_action_is_refused_while_a_runner_holds_the_lease(new_store: NewStore) -> None:
    """Like the CLI, an action takes the workflow's lease: a live runner's makes it fail
    (409), changing nothing."""
    url = new_store("sqlite")
    await populate(url)
    async with CheckpointManager(open_storage(url)) as manager:
        await manager.acquire_lease("doubt", "runner-1", ttl=600)
    before = await snapshot(url)
    async with acting(url) as http:
        token = await form_token(http, "doubt")
        data = {"csrf": token, "id": "doubt", "step": "0", "key": "pay", "outcome": "rerun"}
        reply = await http.post("/action/resolve", data=data)
        assert reply.status_code == 409 and "LeaseHeldError" in reply.text
    assert await snapshot(url) == before


async def test_a_hostile_workflow_gets_forms_that_act_on_it(new_store: NewStore) -> None:
    """The hidden id field holds the hostile id as the form sends it back; the page shows it
    only escaped."""
    url = new_store("sqlite")
    await populate(url)
    hostile = HOSTILE + "-registered"
    async with CheckpointManager(open_storage(url)) as manager:
        await manager.register_workflow(hostile)
    async with acting(url) as http:
        token = await form_token(http, hostile)
        page = (await http.get("/workflow", params={"id": hostile})).text
        assert 'action="/action/cancel"' in page and "<script>window" not in page
        reply = await http.post("/action/cancel", data={"csrf": token, "id": hostile})
        assert reply.status_code == 303
    async with CheckpointManager(open_storage(url)) as manager:
        record = await manager.get_workflow(hostile)
        assert record is not None and record.status.value == "cancelled"


def test_serve_allow_actions_requires_a_token(new_store: NewStore) -> None:
    url = new_store("sqlite")
    result = cli("serve", url, "--allow-actions")
    assert result.code == 2 and "--token" in result.err
