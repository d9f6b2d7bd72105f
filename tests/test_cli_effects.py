"""`history` and `show` list a step's effects and their state (done, failed, in doubt)."""

from __future__ import annotations

from typing import Any

import pytest

from aiocheckpoint import ResumableWorkflow
from aiocheckpoint.cli.store import open_store
from tests.test_cli import BACKENDS, NewStore, cli, new_store

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
