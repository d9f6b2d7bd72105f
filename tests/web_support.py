"""Stores for the inspector's tests, built by real workflow runs, and a client over the app."""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import pytest

from aiocheckpoint import CheckpointManager, Keyring, ResumableWorkflow, open_storage
from aiocheckpoint.web import create_app
from tests.test_cli import SRC

#: A workflow id that is HTML, script, a quote, a bidi override and a control character.
HOSTILE = "<script>window.__pwned=1</script><b>\u202eevil\" '&\x07"
#: A state value of the same kind.
HOSTILE_VALUE = (
    '<img src=x onerror="window.__pwned=2"><script>window.__pwned=3</script>\u202e\x1b[31m'
)
KEY = bytes(range(32))
KEYS = Keyring(keys={"k1": KEY}, primary="k1")


class Interrupted(BaseException):
    """A crash inside an effect's call."""


async def populate(url: str, keys: Keyring | None = None, extra: int = 0) -> None:
    """Workflows: "done" (typed state), "broken" (a failed step), "waiting" (paused),
    "doubt" (an effect in doubt), HOSTILE (hostile state), plus ``extra`` numbered ones."""
    async with CheckpointManager(open_storage(url), encryption=keys) as manager:
        records = manager.supports_workflow_records()  # the file store keeps none
        lease: dict[str, Any] = {"metadata": {"tenant": "acme"}, "lease_owner": "w1"}
        async with ResumableWorkflow("done", manager, **(lease if records else {})) as wf:
            for step in range(3):
                async with wf.step(step, agent_id=f"agent-{step}"):
                    wf.state.set("count", step)
                    wf.state.set("when", dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc))
                    wf.state.set("blob", b"\x00\x01binary")
                    wf.state.set("pair", (1, "two"))
                    wf.state.set("items", list(range(500)))
                    wf.state.set("long", "x" * 5000)
        with pytest.raises(RuntimeError):
            async with ResumableWorkflow("broken", manager) as wf:
                async with wf.step(0, agent_id="planner"):
                    wf.state.set("plan", "ok")
                async with wf.step(1, agent_id="worker"):
                    raise RuntimeError("the tool <b>exploded</b>")
        async with ResumableWorkflow("waiting", manager) as wf:
            async with wf.step(0, agent_id="asker"):
                wf.state.set("question", "approve?")
            await wf.pause("needs a human")
        await _doubt(manager)
        hostile: dict[str, Any] = {"metadata": {"note": HOSTILE}} if records else {}
        async with ResumableWorkflow(HOSTILE, manager, **hostile) as wf:
            async with wf.step(0, agent_id=HOSTILE):
                wf.state.set(HOSTILE, HOSTILE_VALUE)
                wf.state.set("nested", {"deep": [HOSTILE_VALUE]})
        for n in range(extra):
            async with ResumableWorkflow(f"many-{n:03d}", manager) as wf:
                async with wf.step(0, agent_id="a"):
                    wf.state.set("n", n)


async def _doubt(manager: CheckpointManager) -> None:
    async def sent() -> str:
        return "sent"

    async def crash() -> None:
        raise Interrupted

    wf = ResumableWorkflow("doubt", manager)
    with pytest.raises(Interrupted):
        async with wf.step(0, agent_id="payer"):
            await wf.effect("mail", sent)
            await wf.effect("pay", crash)


@asynccontextmanager
async def client(
    url: str, keys: Keyring | None = None, **options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to the inspector over the store at ``url`` (no socket)."""
    async with CheckpointManager(open_storage(url), encryption=keys) as manager:
        app = create_app(manager, url, **options)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            yield http


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serving(url: str, *options: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`aiocheckpoint serve URL OPTIONS` in a child process; the address it answers at."""
    port = free_port()
    environ = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    command = [sys.executable, "-m", "aiocheckpoint", "serve", url, "--port", str(port)]
    proc = subprocess.Popen([*command, *options], env=environ, stderr=subprocess.PIPE, text=True)
    address = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                httpx.get(f"{address}/static/style.css", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.1)
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=30)
