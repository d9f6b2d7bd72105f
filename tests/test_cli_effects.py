"""The CLI and effects: `history` and `show` list a step's effects and their state (done,
failed, in doubt); `workflows --in-doubt` finds them; `effect resolve` settles them."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import (
    CheckpointManager,
    EffectInDoubtError,
    EffectRecord,
    EffectState,
    Keyring,
    LeaseLostError,
    ResumableWorkflow,
    WorkflowStatus,
    open_storage,
)
from aiocheckpoint.cli.store import open_store
from aiocheckpoint.models import utcnow
from tests.test_cli import BACKENDS, SRC, NewStore, cli, new_store

__all__ = ["new_store"]


class Interrupted(BaseException):
    """A crash inside a call."""


async def populate(url: str) -> None:
    """Step 0 of "wf": one effect done, one failed (then done on retry), one in doubt."""

    async def ok() -> str:
        return "sent"

    async def flaky() -> None:
        raise ConnectionError("down")

    async def crash() -> None:
        raise Interrupted

    async with open_store(url, must_exist=False) as manager:
        wf = ResumableWorkflow("wf", manager)
        with pytest.raises(ConnectionError):
            async with wf.step(0, agent_id="a"):
                await wf.effect("mail", ok)
                await wf.effect("fetch", flaky)
        with pytest.raises(Interrupted):
            async with wf.step(0, agent_id="a"):
                await wf.effect("mail", ok)
                await wf.effect("pay", crash)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_history_and_show_list_effects(kind: str, new_store: NewStore) -> None:
    """The effects column of history and the effects table of show name each state."""
    url = new_store(kind)
    await populate(url)
    history = cli("history", url, "wf")
    assert history.code == 0, history.err
    assert "1 done, 1 failed, 1 in doubt" in history.out
    shown = cli("show", url, "wf", "0")
    assert shown.code == 0, shown.err
    rows = {line.split()[0]: line for line in shown.out.split("effects:")[1].splitlines()[2:]}
    assert "in doubt" in rows["pay"] and "failed" in rows["fetch"] and "done" in rows["mail"]
    data: Any = cli("show", url, "wf", "0", "--json").json()
    states = {e["key"]: (e["state"], e["result"]) for e in data["effects"]}
    assert states == {
        "fetch": ("failed", None),
        "mail": ("done", "sent"),
        "pay": ("in_doubt", None),
    }
    page: Any = cli("history", url, "wf", "--json").json()
    assert [e["key"] for e in page["checkpoints"][0]["effects"]] == ["fetch", "mail", "pay"]


#: A run killed (SIGKILL) inside its effect's call, in step 1, after step 0's checkpoint.
KILLED_RUN = """
import asyncio, os, signal, sys
from aiocheckpoint import ResumableWorkflow
from aiocheckpoint.cli.store import open_store

async def charge(amount):
    os.kill(os.getpid(), signal.SIGKILL)  # the call may have reached the provider

async def main(url):
    async with open_store(url, must_exist=False) as manager:
        async with ResumableWorkflow("order", manager) as wf:
            async with wf.step(0, agent_id="a"):
                wf.state.set("cart", 3)
            async with wf.step(1, agent_id="a"):
                await wf.effect("charge", charge, 30)

asyncio.run(main(sys.argv[1]))
"""


async def finish(url: str, calls: list[int]) -> Any:
    """Run the order workflow to its end; ``charge`` appends to ``calls``."""

    async def charge(amount: int) -> str:
        calls.append(amount)
        return f"ch-{amount}"

    async with open_store(url, must_exist=True) as manager:
        async with ResumableWorkflow("order", manager) as wf:
            await wf.try_resume()
            async with wf.step(1, agent_id="a"):
                wf.state.set("receipt", await wf.effect("charge", charge, 30))
        return wf.state.get("receipt"), await manager.list_in_doubt_workflows()


def kill_in_call(url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, url], env=env, timeout=120)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("happened", [True, False])
async def test_resolve_a_killed_runs_effect(kind: str, happened: bool, new_store: NewStore) -> None:
    """Killed in a call: `workflows --in-doubt` lists it, `effect resolve` settles it."""
    url = new_store(kind)
    kill_in_call(url)
    listed: Any = cli("workflows", url, "--in-doubt", "--json").json()
    assert [w["workflow_id"] for w in listed["workflows"]] == ["order"]
    if kind != "file":  # a query of the records, with the in-doubt filter
        query: Any = cli("workflows", url, "--in-doubt", "--agent-status", "completed", "--json")
        assert [w["workflow_id"] for w in query.json()["workflows"]] == ["order"]
    with pytest.raises(EffectInDoubtError):
        await finish(url, [])
    outcome = ["--result", '"ch-manual"'] if happened else ["--rerun"]
    done = cli("effect", "resolve", url, "order", "1", "charge", *outcome)
    assert done.code == 0, done.err
    assert ("done" if happened else "failed") in done.out
    again = cli("effect", "resolve", url, "order", "1", "charge", "--rerun")
    assert "no effect 'charge' in doubt" in again.error_line() and again.code == 2
    calls: list[int] = []
    assert await finish(url, calls) == ("ch-manual" if happened else "ch-30", [])
    assert calls == ([] if happened else [30])
    assert cli("workflows", url, "--in-doubt", "--json").json() == {"workflows": []}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_resolve_is_fenced_by_a_live_lease(kind: str, new_store: NewStore) -> None:
    """While a runner holds the workflow, resolving is refused; after it, a stale one is."""
    url = new_store(kind)
    kill_in_call(url)
    async with open_store(url, must_exist=True) as manager:
        runner = await manager.acquire_lease("order", "runner", ttl=60)
        refused = cli("effect", "resolve", url, "order", "1", "charge", "--result", "1")
        assert "lease" in refused.error_line() and refused.code == 4
        assert await manager.list_in_doubt_workflows() == ["order"]
        await manager.release_lease(runner)
        assert cli("effect", "resolve", url, "order", "1", "charge", "--result", "1").code == 0
        [record] = await manager.get_effects("order", 1)
        assert record.state is EffectState.DONE and record.result == 1
        with pytest.raises(LeaseLostError):  # the runner's old lease writes nothing more
            await manager.record_effect(replace(record, state=EffectState.IN_DOUBT), lease=runner)
        assert [r.state for r in await manager.get_effects("order", 1)] == [EffectState.DONE]


def test_resolve_arguments(tmp_path: Path) -> None:
    """--result and --rerun: exactly one; --result is JSON."""
    url = f"sqlite://{tmp_path}/x.db"
    for extra in ([], ["--rerun", "--result", "1"], ["--result", "{bad"]):
        result = cli("effect", "resolve", url, "wf", "0", "k", *extra)
        assert result.code == 2 and "Traceback" not in result.err


async def run_claimed(url: str, calls: list[int]) -> Any:
    """A pool's runner: claim the workflow (where there are leases), run it to its end."""

    async def charge(amount: int) -> str:
        calls.append(amount)
        return f"ch-{amount}"

    async with open_store(url, must_exist=True) as manager:
        lease = None
        if manager.supports_workflow_records():
            lease = await manager.claim_workflow("runner")
            if lease is None:
                return "not claimed"
        async with ResumableWorkflow("order", manager, lease=lease) as wf:
            async with wf.step(1, agent_id="a"):
                wf.state.set("receipt", await wf.effect("charge", charge, 30))
        record = await manager.get_workflow("order") if lease else None
        return wf.state.get("receipt"), None if record is None else record.status.value


def in_doubt_rows(url: str) -> list[list[str]]:
    """The rows `workflows --in-doubt` prints, split into cells (ids here hold no spaces)."""
    listed = cli("workflows", url, "--in-doubt")
    assert listed.code == 0, listed.err
    assert "aiocheckpoint effect resolve" in listed.err  # how to settle one
    header, *rows = listed.out.splitlines()
    assert header.split()[:4] == ["WORKFLOW", "STEP", "KEY", "FUNCTION"]
    return [row.split() for row in rows]


@pytest.mark.parametrize("kind", BACKENDS)
async def test_in_doubt_from_start_to_finish(kind: str, new_store: NewStore) -> None:
    """Killed in a call: found, inspected and settled from what the CLI prints; a runner
    of the pool then claims the workflow and finishes it without calling the effect."""
    url = new_store(kind)
    kill_in_call(url)  # step 1's charge is in doubt, and step 1 has no checkpoint
    shown = cli("show", url, "order", "1")
    assert shown.code == 0, shown.err
    assert "no checkpoint" in shown.out and "in doubt" in shown.out.split("effects:")[1]
    data: Any = cli("show", url, "order", "1", "--json").json()
    assert data["checkpoint"] is None and [e["key"] for e in data["effects"]] == ["charge"]
    with pytest.raises(EffectInDoubtError):
        await run_claimed(url, [])  # the runner stops on it: the workflow FAILED
    if kind != "file":
        assert await run_claimed(url, []) == "not claimed"
    [[workflow, step, key, function, *_rest, status]] = in_doubt_rows(url)
    assert (workflow, step, key, function) == ("order", "1", "charge", "charge")
    assert status == ("-" if kind == "file" else "failed")
    listed: Any = cli("workflows", url, "--in-doubt", "--json").json()
    [entry] = listed["workflows"]
    [doubt] = entry["in_doubt"]
    assert (entry["workflow_id"], doubt["step"], doubt["key"], doubt["function"]) == (
        workflow,
        int(step),
        key,
        function,
    )
    settled = cli("effect", "resolve", url, workflow, step, key, "--result", '"ch-manual"')
    assert settled.code == 0, settled.err
    calls: list[int] = []
    assert await run_claimed(url, calls) == ("ch-manual", None if kind == "file" else "finished")
    assert calls == []  # the settled charge is never called again
    assert cli("workflows", url, "--in-doubt", "--json").json() == {"workflows": []}


#: resolve_effect in a child that SIGKILLs itself at the settle's write (after the status).
KILLED_SETTLE = """
import asyncio, os, signal, sys
from aiocheckpoint.cli.store import open_store
from aiocheckpoint.journal import EffectJournal

async def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

EffectJournal.record = die  # the settle's own write, after the status change

async def main(url):
    async with open_store(url, must_exist=True) as manager:
        await manager.resolve_effect("order", 1, "charge", happened=True, result="ch-manual")

asyncio.run(main(sys.argv[1]))
"""


def kill_in_settle(url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run([sys.executable, "-c", KILLED_SETTLE, url], env=env, timeout=120)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_settle_killed_halfway_is_settled_again(kind: str, new_store: NewStore) -> None:
    """Killed between the status change and the settle: still in doubt, held by the
    resolver's lease (no runner takes it), and `effect resolve` run again completes it."""
    url = new_store(kind)
    kill_in_call(url)
    with pytest.raises(EffectInDoubtError):
        await run_claimed(url, [])
    kill_in_settle(url)
    async with open_store(url, must_exist=True) as manager:  # killed between the two writes
        record = await manager.get_workflow("order")
        assert record is not None and record.status.value == "unfinished"
    [[_, step, key, *_]] = in_doubt_rows(url)  # not settled
    assert await run_claimed(url, []) == "not claimed"  # the resolver's lease holds it
    assert cli("effect", "resolve", url, "order", step, key, "--result", '"ch-manual"').code == 0
    calls: list[int] = []
    assert await run_claimed(url, calls) == ("ch-manual", "finished") and calls == []


async def test_in_doubt_listing_escapes_ids_and_keys(tmp_path: Path) -> None:
    """Control and bidi characters in ids and keys are escaped in the table; JSON is exact."""
    url = f"sqlite://{tmp_path}/odd.db"
    workflow_id, key = "wf\x1b[31m\u202e", "pay\x9b"

    async def crash() -> None:
        raise Interrupted

    async with open_store(url, must_exist=False) as manager:
        with pytest.raises(Interrupted):
            async with ResumableWorkflow(workflow_id, manager) as wf:
                async with wf.step(0, agent_id="a"):  # a checkpoint: the workflow's record
                    pass
                async with wf.step(2, agent_id="a"):
                    await wf.effect(key, crash)
    text = cli("workflows", url, "--in-doubt")
    assert text.code == 0, text.err
    assert "\x1b" not in text.out and "\u202e" not in text.out and "\x9b" not in text.out
    assert "wf\\x1b[31m\\u202e" in text.out and "pay\\x9b" in text.out
    data: Any = cli("workflows", url, "--in-doubt", "--json")
    assert "\x1b" not in data.out and "\u202e" not in data.out
    [entry] = data.json()["workflows"]
    assert entry["workflow_id"] == workflow_id and entry["in_doubt"][0]["key"] == key
    query: Any = cli("workflows", url, "--in-doubt", "--limit", "5", "--json").json()
    assert [(d["step"], d["key"]) for d in query["workflows"][0]["in_doubt"]] == [(2, key)]
    shown = cli("show", url, workflow_id, "2")
    assert shown.code == 0 and "pay\\x9b" in shown.out and "\x9b" not in shown.out


async def test_in_doubt_on_an_encrypted_store(tmp_path: Path) -> None:
    """Encrypted: listed as unreadable without keys; with --keys, named and settled."""
    url = f"sqlite://{tmp_path}/sealed.db"
    secret = os.urandom(32)
    keyring = Keyring(keys={"k1": secret}, primary="k1")
    keys = tmp_path / "keys.json"
    keys.write_text(
        json.dumps({"primary": "k1", "keys": {"k1": base64.b64encode(secret).decode()}})
    )
    keys.chmod(0o600)
    intent = EffectRecord("wf", 1, "call", "tool", EffectState.IN_DOUBT, 1, utcnow(), "ack-1")
    async with CheckpointManager(open_storage(url), encryption=keyring) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", {"n": 0})
        await manager.record_effect(intent)
        await manager.record_failure("wf", EffectInDoubtError("wf", 1, "call", intent.intent_at))
    sealed: Any = cli("workflows", url, "--in-doubt", "--json").json()
    assert "encrypted: pass --keys" in sealed["workflows"][0]["in_doubt"]["unreadable"]
    [[workflow, step, key, function, *_, status]] = [
        row.split()
        for row in cli("workflows", url, "--in-doubt", "--keys", str(keys)).out.splitlines()[1:]
    ]
    assert (workflow, step, key, function, status) == ("wf", "1", "call", "tool", "failed")
    settled = cli("effect", "resolve", url, workflow, step, key, "--rerun", "--keys", str(keys))
    assert settled.code == 0, settled.err
    async with CheckpointManager(open_storage(url), encryption=keyring) as manager:
        [record] = await manager.get_effects("wf", 1)
        assert record.state is EffectState.FAILED
        assert (await manager.get_workflow("wf")).status is WorkflowStatus.UNFINISHED  # type: ignore[union-attr]


async def test_a_damaged_journal_in_the_in_doubt_listing_is_corrupted(tmp_path: Path) -> None:
    """A journal whose record does not verify is listed as corrupted, apart from unreadable
    (a missing key), in the text and in the JSON."""
    url = f"sqlite://{tmp_path}/damaged.db"
    intent = EffectRecord("wf", 1, "call", "tool", EffectState.IN_DOUBT, 1, utcnow(), "ack-1")
    async with CheckpointManager(open_storage(url)) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", {"n": 0})
        await manager.record_effect(intent)
        storage: Any = manager.storage
        await storage.put_effect("wf", 1, "call", b"not an effect record", in_doubt=True)
    listed: Any = cli("workflows", url, "--in-doubt", "--json").json()
    [problem] = listed["workflows"][0]["in_doubt"].items()
    assert problem[0] == "corrupted" and problem[1].startswith("corrupted: ")
    assert "corrupted: " in cli("workflows", url, "--in-doubt").out
