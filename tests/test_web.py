"""The web inspector (``aiocheckpoint serve``) over real stores built by real workflow runs:
pages load, filters and paging work, links lead where they say, everything from the store
is escaped, an encrypted store without keys is shown locked, and the safety headers and the
token hold. (The browser tests are in test_web_browser.py.)"""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from pydantic import BaseModel

from aiocheckpoint import (
    CheckpointManager,
    EffectRecord,
    EffectState,
    Keyring,
    ResumableWorkflow,
    TypeRegistry,
    open_storage,
)
from aiocheckpoint.cli.serve import is_loopback
from aiocheckpoint.web import data, tree
from tests.test_cli import BACKENDS, SRC, NewStore, cli, new_store
from tests.web_support import HOSTILE, HOSTILE_VALUE, KEYS, client, populate, serving

__all__ = ["new_store"]

HREF = re.compile(r'href="([^"]*)"')


def links(page: str) -> list[str]:
    """Every link of a page, unescaped as a browser reads it."""
    return [html.unescape(h) for h in HREF.findall(page)]


def listed(page: str) -> list[str]:
    """The workflow ids of the list page's table, in order."""
    table = page.split('<table class="list">', 1)[-1]
    return [
        parse_qs(urlsplit(h).query)["id"][0] for h in links(table) if h.startswith("/workflow?")
    ]


@pytest.mark.parametrize("kind", BACKENDS)
async def test_pages_load_and_links_lead_where_they_say(kind: str, new_store: NewStore) -> None:
    """From the list to each workflow, from a workflow to each step: every link answers 200
    with the page of the workflow or step it names."""
    url = new_store(kind)
    await populate(url)
    async with client(url) as http:
        front = await http.get("/")
        assert front.status_code == 200
        targets = [h for h in links(front.text) if h.startswith("/workflow?")]
        ids = {parse_qs(urlsplit(h).query)["id"][0] for h in targets}
        assert {"done", "broken", "waiting", HOSTILE} <= ids
        for target in targets:
            page = await http.get(target)
            assert page.status_code == 200, target
            workflow_id = parse_qs(urlsplit(target).query)["id"][0]
            for step_link in [h for h in links(page.text) if h.startswith("/step?")]:
                query = parse_qs(urlsplit(step_link).query)
                assert query["id"] == [workflow_id]
                step = await http.get(step_link)
                assert step.status_code == 200, step_link
                assert f"Step {query['step'][0]} of" in step.text
        assert (await http.get("/static/style.css")).status_code == 200


@pytest.mark.parametrize("kind", BACKENDS)
async def test_workflow_page_shows_steps_effects_and_the_resolve_command(
    kind: str, new_store: NewStore
) -> None:
    """The in-doubt effect comes first, with the `effect resolve` command that settles it;
    a failed step shows its agent and status; the record's lease and metadata are shown."""
    url = new_store(kind)
    await populate(url)
    async with client(url) as http:
        doubt = (await http.get("/workflow", params={"id": "doubt"})).text
        assert doubt.index("in doubt") < doubt.index(">mail<")
        command = shlex.join(["aiocheckpoint", "effect", "resolve", url, "doubt", "0", "pay"])
        if kind != "file":
            assert "has no record" in doubt
        assert command in html.unescape(doubt)
        broken = (await http.get("/workflow", params={"id": "broken"})).text
        assert "worker" in broken and "agent-failed" in broken
        done = (await http.get("/workflow", params={"id": "done"})).text
        if kind != "file":  # the file store keeps no workflow records
            assert "acme" in done and "fencing token" in done and "finished" in done
            assert "&lt;b&gt;exploded&lt;/b&gt;" in broken
        else:
            assert "keeps no record" in done


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_status_filter_counts_and_prefix_search(kind: str, new_store: NewStore) -> None:
    """Counts per status; the status filter and the id prefix narrow the list."""
    url = new_store(kind)
    await populate(url)
    async with client(url) as http:
        front = (await http.get("/")).text
        assert re.search(r"paused <b>1</b>", front) and re.search(r"failed <b>1</b>", front)
        paused = (await http.get("/", params={"status": "paused"})).text
        assert "waiting" in paused and ">done<" not in paused
        assert listed((await http.get("/", params={"q": "do"})).text) == ["done"]
        assert listed((await http.get("/", params={"q": "done"})).text) == ["done"]
        assert listed((await http.get("/", params={"q": "w"})).text) == ["waiting"]
        assert '">doubt</a>' in front  # no record (killed in its first step), in doubt


@pytest.mark.parametrize("kind", BACKENDS)
async def test_the_workflow_list_pages(kind: str, new_store: NewStore) -> None:
    """Following "Next page" lists every workflow once."""
    url = new_store(kind)
    await populate(url, extra=60)
    seen: list[str] = []
    async with client(url) as http:
        target: str | None = "/?q=many-"
        while target is not None:
            page = (await http.get(target)).text
            seen += listed(page)
            following = [h for h in links(page) if "after=" in h]
            target = following[0] if following else None
    assert seen == [f"many-{n:03d}" for n in range(60)]


@pytest.mark.parametrize("kind", BACKENDS)
async def test_hostile_ids_and_state_render_as_text(kind: str, new_store: NewStore) -> None:
    """HTML, script, bidi and control characters from the store reach the page as text."""
    url = new_store(kind)
    await populate(url)
    async with client(url) as http:
        pages = [
            (await http.get("/")).text,
            (await http.get("/workflow", params={"id": HOSTILE})).text,
            (await http.get("/step", params={"id": HOSTILE, "step": "0"})).text,
        ]
    for page in pages:
        assert "<script>window" not in page and "<img" not in page and "<b>\u202e" not in page
        assert "\u202e" not in page and "\x07" not in page and "\x1b" not in page
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page
    assert "\\u202e" in pages[2] and "\\u001b" in pages[2]
    assert "&lt;img src=x onerror=" in pages[2]


async def test_typed_values_show_their_types_and_big_values_are_cut(new_store: NewStore) -> None:
    """Datetimes, bytes and tuples are named by type; a 500-item list and a 5000-character
    string are cut to the page's budget, with a link to the rest."""
    url = new_store("sqlite")
    await populate(url)
    async with client(url) as http:
        page = (await http.get("/step", params={"id": "done", "step": "2"})).text
        assert "datetime" in page and "2026-01-02T03:04:05" in page
        assert "bytes (8 bytes, base64)" in page and "tuple" in page
        assert f"{5000 - tree.TEXT} more characters" in page
        more = [h for h in links(page) if "offset=" in h]
        assert len(more) == 1 and f"{500 - tree.CHILDREN} more" in page
        rest = (await http.get(more[0])).text
        assert f">{tree.CHILDREN}<" in rest and f">{2 * tree.CHILDREN - 1}<" in rest
        assert ">0<" not in rest and f"{500 - 2 * tree.CHILDREN} more" in rest


@pytest.mark.parametrize("kind", BACKENDS)
async def test_an_encrypted_store_without_keys_is_shown_locked(
    kind: str, new_store: NewStore
) -> None:
    """Without keys, steps and effects say locked, and the pages still load; with the keys
    the state shows."""
    url = new_store(kind)
    await populate(url, keys=KEYS)
    async with client(url) as http:
        workflow = await http.get("/workflow", params={"id": "doubt"})
        assert workflow.status_code == 200 and "locked: encrypted" in workflow.text
        step = await http.get("/step", params={"id": "done", "step": "1"})
        assert step.status_code == 200 and "locked: encrypted" in step.text
        assert "count" not in step.text
    async with client(url, keys=KEYS) as http:
        step = await http.get("/step", params={"id": "done", "step": "1"})
        assert "locked" not in step.text and "count" in step.text


async def test_a_record_failing_authentication_under_a_held_key_is_corrupted_not_locked(
    new_store: NewStore,
) -> None:
    """A tampered record under a key the inspector holds is damage (corrupted); a record
    under a key it lacks is locked, naming the key."""
    url = new_store("sqlite")
    async with CheckpointManager(open_storage(url), encryption=KEYS) as manager:
        await manager.create_checkpoint("t", 0, "a", "completed", {"secret": "x" * 64})
        stored = await manager.storage.load("t", 0)
        assert stored is not None
        flipped = stored.data[:-1] + bytes([stored.data[-1] ^ 1])
        await manager.storage.save("t", 0, flipped)
    async with client(url, keys=KEYS) as http:
        step = await http.get("/step", params={"id": "t", "step": "0"})
        assert step.status_code == 200 and "corrupted" in step.text and "locked" not in step.text
    other = Keyring(keys={"k9": bytes(32)}, primary="k9")
    async with client(url, keys=other) as http:
        step = await http.get("/step", params={"id": "t", "step": "0"})
        assert "locked: key &#39;k1&#39; is not in the inspector" in step.text


async def test_headers_forbid_inline_script_and_framing(new_store: NewStore) -> None:
    """Every response (pages, errors, the stylesheet) carries the safety headers."""
    url = new_store("sqlite")
    await populate(url)
    async with client(url) as http:
        for target in ["/", "/workflow?id=nope", "/static/style.css", "/step?id=done&step=x"]:
            response = await http.get(target)
            csp = response.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "unsafe-inline" not in csp
            assert "script-src 'none'" in csp
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["x-frame-options"] == "DENY"
            assert response.headers["referrer-policy"] == "no-referrer"
        assert (await http.get("/workflow?id=nope")).status_code == 404
        assert (await http.get("/step?id=done&step=x")).status_code == 400
        assert (await http.post("/")).status_code == 405


async def test_a_token_is_required_on_every_request(new_store: NewStore) -> None:
    """With a token: refused without it; ?token= sets a cookie that later requests carry;
    a bearer header works; a wrong token is refused."""
    url = new_store("sqlite")
    await populate(url)
    async with client(url, token="s3cret") as http:
        assert (await http.get("/")).status_code == 401
        assert (await http.get("/static/style.css")).status_code == 401
        assert (await http.get("/", params={"token": "wrong"})).status_code == 401
        bearer = await http.get("/", headers={"authorization": "Bearer s3cret"})
        assert bearer.status_code == 200
        given = await http.get("/workflow", params={"id": "done", "token": "s3cret"})
        assert given.status_code == 303 and given.headers["location"] == "/workflow?id=done"
        assert "httponly" in given.headers["set-cookie"].lower()
        assert (await http.get("/workflow", params={"id": "done"})).status_code == 200
        elsewhere = await http.get("http://127.0.0.1//evil.example/?token=s3cret")
        assert elsewhere.headers["location"] == "/evil.example/"  # this site, not another


async def test_a_loopback_server_refuses_other_host_names(new_store: NewStore) -> None:
    """Bound to loopback, a request naming another host (DNS rebinding) is refused."""
    url = new_store("sqlite")
    await populate(url)
    async with client(url, allowed_hosts=["127.0.0.1", "localhost"]) as http:
        assert (await http.get("/")).status_code == 200
        assert (await http.get("/", headers={"host": "evil.example"})).status_code == 400


async def test_pages_write_nothing(new_store: NewStore) -> None:
    """Reading every page leaves the store's records as they were."""
    url = new_store("sqlite")
    await populate(url)

    async def snapshot() -> list[object]:
        async with CheckpointManager(open_storage(url)) as manager:
            return list(await manager.list_workflow_records())

    before = await snapshot()
    async with client(url) as http:
        for target in ["/", "/workflow?id=done", "/step?id=done&step=1", "/workflow?id=doubt"]:
            assert (await http.get(target)).status_code == 200
    assert await snapshot() == before


def test_serve_refuses_a_public_host_without_a_token(tmp_path: Path) -> None:
    """A non-loopback --host without --token is a usage error naming --token."""
    result = cli("serve", f"sqlite://{tmp_path}/x.db", "--host", "0.0.0.0")
    assert result.code == 2 and "--token" in result.err
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")


def test_help_works_and_serve_is_listed() -> None:
    """`aiocheckpoint --help` lists serve (the extra is imported only when serving)."""
    result = cli("--help")
    assert result.code == 0 and "serve" in result.out
    assert HOSTILE_VALUE  # the support module's hostile value is what the pages were given


def test_serve_without_the_extra_names_it(tmp_path: Path) -> None:
    """Without the web extra, serve says which extra to install (and --help still works)."""
    code = (
        "import sys; sys.modules['starlette'] = None\n"
        "from aiocheckpoint.cli import main\n"
        "assert main(['--help']) == 0\n"
        f"sys.exit(main(['serve', 'sqlite://{tmp_path}/x.db']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 4, proc.stderr
    assert "pip install 'aiocheckpoint[web]'" in proc.stderr


class Order(BaseModel):
    """A registered model the inspector has never seen."""

    sku: str
    lines: list[int]


async def test_a_registered_model_is_shown_by_name_and_version(new_store: NewStore) -> None:
    """A value of a registered class reads as its name and version, with its data below,
    though the inspector's manager knows no class at all."""
    url = new_store("sqlite")
    types = TypeRegistry()
    types.register(Order, name="shop.Order", version=3)
    async with CheckpointManager(open_storage(url), types=types) as manager:
        async with ResumableWorkflow("typed", manager) as wf:
            async with wf.step(0, agent_id="a"):
                wf.state.set("order", Order(sku="<b>x</b>", lines=[1, 2]))
    async with client(url) as http:
        page = (await http.get("/step", params={"id": "typed", "step": "0"})).text
    assert "shop.Order v3" in page and "&lt;b&gt;x&lt;/b&gt;" in page


async def test_a_large_deep_state_gives_a_bounded_page(new_store: NewStore) -> None:
    """A state of 20,000 strings of 300 characters (6 MB; its whole tree would be more than
    that in HTML) and one nested 150 levels deep: the page stays under 2 MB, and its links
    continue both."""
    url = new_store("sqlite")
    deep: object = "bottom"
    for _ in range(150):
        deep = {"d": deep}
    async with CheckpointManager(open_storage(url)) as manager:
        async with ResumableWorkflow("big", manager) as wf:
            async with wf.step(0, agent_id="a"):
                wf.state.set("deep", deep)
                wf.state.set("wide", {f"k{n:05d}": "y" * 300 for n in range(20_000)})
    async with client(url) as http:
        page = (await http.get("/step", params={"id": "big", "step": "0"})).text
        assert len(page) < 2_000_000
        # Read in part (an incremental store): its length is not known, "more" continues.
        assert f"{tree.CHILDREN}+ items" in page and ">more</a>" in page
        deeper = [h for h in links(page) if "path=" in h and "deep" in h]
        assert deeper
        below = await http.get(deeper[0])
        assert below.status_code == 200 and len(below.text) < 2_000_000


async def test_serve_on_all_interfaces_requires_the_token(new_store: NewStore) -> None:
    """`serve --host 0.0.0.0` with $AIOCHECKPOINT_TOKEN: the real server refuses a request
    without the token and answers one with it."""
    url = new_store("sqlite")
    await populate(url)
    token = {"AIOCHECKPOINT_TOKEN": "t0ken"}
    with serving(url, "--host", "0.0.0.0", env=token) as address:
        async with httpx.AsyncClient(base_url=address) as http:
            assert (await http.get("/")).status_code == 401
            bearer = await http.get("/", headers={"authorization": "Bearer t0ken"})
            assert bearer.status_code == 200 and ">done</a>" in bearer.text


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_records_of_every_kind_are_listed(kind: str, new_store: NewStore) -> None:
    """A workflow written by a manager of another kind (a LangGraph thread's "langgraph") is
    listed, counted and labelled, though the default listings leave it out."""
    url = new_store(kind)
    async with CheckpointManager(open_storage(url), workflow_kind="langgraph") as manager:
        async with ResumableWorkflow("thread-1", manager) as wf:
            async with wf.step(0, agent_id="graph"):
                wf.state.set("messages", ["hi"])
        assert await manager.list_workflow_records() == []
    async with client(url) as http:
        front = (await http.get("/")).text
        page = (await http.get("/workflow", params={"id": "thread-1"})).text
    assert listed(front) == ["thread-1"] and '<span class="kind">langgraph</span>' in front
    assert re.search(r"finished <b>1</b>", front) and "langgraph" in page


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_a_workflows_steps_page_newest_first(kind: str, new_store: NewStore) -> None:
    """Following "Older steps" shows each of 120 steps once, newest first."""
    url = new_store(kind)
    async with CheckpointManager(open_storage(url)) as manager:
        async with ResumableWorkflow("long", manager) as wf:
            for step in range(120):
                async with wf.step(step, agent_id="a"):
                    wf.state.set("n", step)
    seen: list[int] = []
    async with client(url) as http:
        target: str | None = "/workflow?id=long"
        while target is not None:
            page = (await http.get(target)).text
            steps = page.split("<h2>Steps</h2>", 1)[1]
            seen += [
                int(parse_qs(urlsplit(h).query)["step"][0])
                for h in links(steps)
                if h.startswith("/step?")
            ]
            older = [h for h in links(steps) if "before=" in h]
            target = older[0] if older else None
    assert seen == list(range(119, -1, -1))


async def test_the_token_redirect_stays_on_this_site(new_store: NewStore) -> None:
    """After ?token= the redirect goes to a path of this site, percent-encoded: a
    backslash ("/\\evil.example", which browsers read as "//evil.example") or slashes at
    the start never make it a link to another host."""
    url = new_store("sqlite")
    await populate(url)
    async with client(url, token="s3cret") as http:
        for path, expected in [
            ("/%5Cevil.example", "/evil.example"),
            ("/%5C%5Cevil.example/x", "/evil.example/x"),
            ("/%2F%5Cevil.example", "/evil.example"),
            ("/%09/evil.example", "/%09/evil.example"),
            ("/caf%C3%A9%20%22q%22", "/caf%C3%A9%20%22q%22"),
        ]:
            reply = await http.get(f"http://127.0.0.1{path}?token=s3cret&a=1")
            assert reply.status_code == 303, path
            assert reply.headers["location"] == f"{expected}?a=1", path


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_the_front_page_reads_a_bounded_number_of_records(
    kind: str, new_store: NewStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counts read one page of records per status (past it "N+"), and the workflows in
    doubt are read a page at a time from the store's index ("more…" leads on), never all."""
    url = new_store(kind)
    await populate(url, extra=6)
    async with CheckpointManager(open_storage(url)) as manager:
        now = datetime.now(timezone.utc)
        for name in ("doubt-2", "doubt-3"):
            intent = EffectRecord(name, 0, "pay", "pay", EffectState.IN_DOUBT, 1, now, "i")
            await manager.record_effect(intent)
    monkeypatch.setattr(data, "COUNT_CAP", 3)
    monkeypatch.setattr(data, "PAGE", 2)
    read: list[int] = []
    listing = CheckpointManager.list_workflow_records

    async def counted(self: CheckpointManager, *args: Any, **kwargs: Any) -> Any:
        page = await listing(self, *args, **kwargs)
        read.append(len(page))
        return page

    async def whole(self: CheckpointManager) -> list[str]:
        raise AssertionError("the inspector listed every workflow in doubt")

    monkeypatch.setattr(CheckpointManager, "list_workflow_records", counted)
    monkeypatch.setattr(CheckpointManager, "list_in_doubt_workflows", whole)
    async with client(url) as http:
        front = await http.get("/")
        assert front.status_code == 200, front.text
        assert re.search(r"finished <b>3\+</b>", front.text), front.text
        assert max(read) <= 3  # the counts and the list page (PAGE + 1) alike
        doubts = front.text.split('class="doubts"', 1)[1].split("</p>", 1)[0]
        assert [html.unescape(w) for w in re.findall(r">([^<]+)</a>", doubts)][:2] == [
            "doubt",
            "doubt-2",
        ]
        [more] = [h for h in links(doubts) if "doubt_after=" in h]
        rest = (await http.get(more)).text.split('class="doubts"', 1)[1].split("</p>", 1)[0]
        assert "doubt-3" in rest and "doubt_after=" not in rest
