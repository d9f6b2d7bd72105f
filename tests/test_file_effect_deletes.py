"""The file store's deletes and the effect journal, under real SIGKILLs (docs/effects.md).

Deleting a workflow is one rename of its directory (checkpoints and journal together) away
under a temporary name, then the removal of that directory: a kill at any point of the
removal leaves either the whole workflow or nothing of it, and a new run of the same id
starts with an empty journal. Deleting one step unlinks its checkpoint file first (durably)
and its effect files after: a kill in between leaves the journal of a step without a
checkpoint, which is what a run killed in that step leaves, never a checkpoint whose journal
is partly gone (its re-run would call again what the missing records held).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import aiocheckpoint
from aiocheckpoint import CheckpointManager, ResumableWorkflow
from aiocheckpoint.storage.file import FileCheckpointStorage

CHILD = Path(__file__).with_name("_file_delete_child.py")
#: Effect records of step 1 (the one the step deletes take), one of them in doubt.
KEYS = ("a", "b", "c", "d", "in doubt")


async def _setup(base: Path) -> None:
    async with FileCheckpointStorage(base) as store:
        for step in (0, 1, 2):
            await store.save("wf", step, f"record {step}".encode())
        for key in KEYS:
            await store.put_effect("wf", 1, key, b"result", in_doubt=key == "in doubt")
        await store.put_effect("wf", 3, "running", b"intent", in_doubt=True)


def _kill(base: Path, mode: str, at: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(aiocheckpoint.__file__).parents[1])}
    child = subprocess.run(
        [sys.executable, str(CHILD), str(base), mode, str(at)], env=env, capture_output=True
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()


@pytest.mark.parametrize("at", range(1, len(KEYS) + 2))
async def test_a_step_delete_killed_never_leaves_a_checkpoint_with_part_of_its_journal(
    tmp_path: Path, at: int
) -> None:
    """Killed at each unlink of delete(wf, 1): step 1's checkpoint is there with its whole
    journal, or gone; other steps are untouched; deleting the step again finishes it."""
    base = tmp_path / "store"
    await _setup(base)
    _kill(base, "step", at)
    async with FileCheckpointStorage(base) as store:
        keys = [e.key for e in await store.load_effects("wf", 1)]
        if await store.exists("wf", 1):
            assert keys == sorted(KEYS), keys
        assert [r.step for r in await store.scan("wf") if r.step != 1] == [0, 2]
        assert [e.key for e in await store.load_effects("wf", 3)] == ["running"]
        await store.delete("wf", 1)
        assert not await store.exists("wf", 1) and await store.load_effects("wf", 1) == []
        assert await store.in_doubt_workflows() == ["wf"]  # step 3's effect


@pytest.mark.parametrize("removed", [0, 1, 4, 7])
async def test_a_workflow_delete_killed_while_removing_leaves_nothing_of_it(
    tmp_path: Path, removed: int
) -> None:
    """Killed while removing the renamed-away directory: no checkpoint, no effect record,
    no in-doubt listing of the workflow; a new run of the same id calls its effect."""
    base = tmp_path / "store"
    await _setup(base)
    _kill(base, "workflow", removed)
    async with FileCheckpointStorage(base) as store:
        assert not await store.exists("wf") and not await store.has_effects("wf")
        assert [await store.load_effects("wf", s) for s in (0, 1, 3)] == [[], [], []]
        assert await store.in_doubt_workflows() == []
        assert await store.list_workflows() == []
        calls: list[str] = []

        async def charge() -> str:
            calls.append("new run")
            return "new run"

        async with ResumableWorkflow("wf", CheckpointManager(store)) as wf:
            async with wf.step(1, agent_id="a"):
                assert await wf.effect("a", charge) == "new run"
        assert calls == ["new run"]
