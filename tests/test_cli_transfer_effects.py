"""``copy``, ``export`` and ``import`` carry the effect journal with the checkpoints.

A store is made the way a crashed run leaves it: step 1 of each workflow was stopped after
its effect returned (the result is recorded, the step has no checkpoint) or while its
effect ran (the intent is recorded without an outcome: in doubt). The copy, resumed with
``ResumableWorkflow`` and ``wf.effect``, must return the recorded result without calling
the function, and raise ``EffectInDoubtError`` for the effect in doubt: every pair of
backends, plaintext and encrypted, through ``copy`` and through ``export`` + ``import``.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from aiocheckpoint import (
    CheckpointManager,
    EffectInDoubtError,
    EffectState,
    ResumableWorkflow,
    open_storage,
)
from aiocheckpoint.codec.sealing import Keyring
from tests.test_cli import BACKENDS, NewStore, cli, new_store
from tests.test_cli_encryption import keys_file

__all__ = ["new_store"]

PAIRS = [(a, b) for a in BACKENDS for b in BACKENDS]
KEY = os.urandom(32)
#: Ids and keys with C1 controls, bidi overrides and quotes: carried exactly.
PAID = "paid \u202e/'x'"
DOUBT = "doubt\u0085 ../y"
CHARGE = "charge \u2066card\u2069"


class Called(Exception):
    """A copied effect called its function again."""


async def charge(amount: int) -> dict[str, Any]:
    """The effect: its result is what the copy must return without calling it."""
    return {"charged": amount, "receipt": "r-1"}


async def charge_again(amount: int) -> dict[str, Any]:
    raise Called(f"charge({amount}) was called again at the destination")


charge_again.__qualname__ = charge.__qualname__  # the same function, as a new process sees it


async def crashed_runs(url: str, keys: Keyring | None) -> None:
    """PAID: step 1's effect returned, then the run stopped. DOUBT: it stopped during it.

    A cancelled step writes no checkpoint (as a killed process would not): step 1 of each
    has only its effect record.
    """
    async with CheckpointManager(open_storage(url), encryption=keys) as manager:
        for workflow_id, during in ((PAID, False), (DOUBT, True)):
            with anyio.CancelScope() as scope:
                async with ResumableWorkflow(workflow_id, manager) as wf:
                    async with wf.step(0, agent_id="a"):
                        wf.state.set("n", 0)
                    async with wf.step(1, agent_id="a"):

                        async def call(amount: int, during: bool = during) -> dict[str, Any]:
                            if during:
                                scope.cancel()
                                await anyio.sleep(30)
                            return await charge(amount)

                        call.__qualname__ = charge.__qualname__
                        await wf.effect(CHARGE, call, 5)
                        scope.cancel()
                        await anyio.sleep(30)
        [done] = await manager.get_effects(PAID, 1)
        [doubt] = await manager.get_effects(DOUBT, 1)
        assert (done.state, doubt.state) == (EffectState.DONE, EffectState.IN_DOUBT)
        assert not await manager.storage.exists(PAID, 1)


async def assert_resumes_exactly_once(url: str, keys: Keyring | None) -> None:
    """At ``url``: the DONE effect returns its result uncalled, the one in doubt raises."""
    async with CheckpointManager(open_storage(url), encryption=keys) as manager:
        async with ResumableWorkflow(PAID, manager) as wf:
            assert wf.resume_step == 1
            async with wf.step(1, agent_id="a"):
                assert await wf.effect(CHARGE, charge_again, 5) == {
                    "charged": 5,
                    "receipt": "r-1",
                }
        with pytest.raises(EffectInDoubtError) as caught:
            async with ResumableWorkflow(DOUBT, manager) as wf:
                assert wf.resume_step == 1
                async with wf.step(1, agent_id="a"):
                    await wf.effect(CHARGE, charge_again, 5)
        assert (caught.value.workflow_id, caught.value.step) == (DOUBT, 1)
        assert caught.value.key == CHARGE


def key_args(tmp_path: Path, encrypted: bool) -> tuple[list[str], Keyring | None]:
    if not encrypted:
        return [], None
    path = keys_file(tmp_path / "keys.json", {"k1": KEY}, "k1")
    return ["--keys", path], Keyring({"k1": KEY}, primary="k1")


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize(("src_kind", "dst_kind"), PAIRS)
async def test_copy_carries_done_and_in_doubt_effects(
    new_store: NewStore, tmp_path: Path, src_kind: str, dst_kind: str, encrypted: bool
) -> None:
    """A copied store returns the recorded result uncalled and keeps the doubt."""
    args, keys = key_args(tmp_path, encrypted)
    src = new_store(src_kind)
    await crashed_runs(src, keys)
    dst = new_store(dst_kind)  # named after the source exists: its own name
    result = cli("--json", "copy", *args, src, dst)
    assert result.code == 0, result.out + result.err
    await assert_resumes_exactly_once(dst, keys)
    report = result.json()
    assert isinstance(report, dict)
    assert report["effects"] == {"written": 2, "skipped": 0, "verified": 2}
    again = cli("--json", "copy", *args, src, dst)
    assert again.code == 0, again.out + again.err
    assert again.json()["effects"]["skipped"] == 2  # type: ignore[index]


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize(("src_kind", "dst_kind"), PAIRS)
async def test_export_import_carries_done_and_in_doubt_effects(
    new_store: NewStore, tmp_path: Path, src_kind: str, dst_kind: str, encrypted: bool
) -> None:
    """export then import: the same as a copy; the file holds the effects before the
    checkpoints of their workflow, and sealed ones stay sealed."""
    args, keys = key_args(tmp_path, encrypted)
    src = new_store(src_kind)
    await crashed_runs(src, keys)
    dst = new_store(dst_kind)  # named after the source exists: its own name
    path = tmp_path / "export.jsonl"
    exported = cli("export", *args, src, str(path))
    assert exported.code == 0, exported.err
    imported = cli("import", *args, str(path), dst)
    assert imported.code == 0, imported.out + imported.err
    await assert_resumes_exactly_once(dst, keys)
    lines = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    kinds = [(line.get("type"), line.get("workflow_id")) for line in lines[1:]]
    for workflow_id in (PAID, DOUBT):
        mine = [kind for kind, wf in kinds if wf == workflow_id]
        assert mine[0] == "effect" and mine.count("effect") == 1
    effects = [line for line in lines if line.get("type") == "effect"]
    sealed = {base64.b64decode(e["record"]).startswith(b"ACKX") for e in effects}
    assert sealed == {encrypted}
    assert {(e["workflow_id"], e["in_doubt"]) for e in effects} == {(PAID, False), (DOUBT, True)}
    assert lines[-1]["effects"] == 2


@pytest.mark.parametrize(("src_kind", "dst_kind"), [("sqlite", "postgres"), ("postgres", "sqlite")])
async def test_workflow_records_travel_with_metadata(
    new_store: NewStore, tmp_path: Path, src_kind: str, dst_kind: str
) -> None:
    """copy and export + import carry a workflow record's status and metadata (what
    `workflows --meta` and list_workflow_records filter on), a record without checkpoints
    included."""
    src = new_store(src_kind)
    meta = {"tenant": "acme \u202e", "n": 1}
    async with CheckpointManager(open_storage(src)) as manager:
        await manager.register_workflow("with-steps", metadata=meta)
        await manager.create_checkpoint("with-steps", 0, "a", "completed", {"n": 0})
        await manager.mark_workflow("with-steps", "finished")
        await manager.register_workflow("queued", metadata={"kind": "report"})
    copied = new_store(dst_kind)
    assert cli("copy", src, copied).code == 0
    imported = new_store(dst_kind)
    path = tmp_path / "e.jsonl"
    assert cli("export", src, str(path)).code == 0
    result = cli("import", str(path), imported)
    assert result.code == 0, result.out
    for url in (copied, imported):
        async with CheckpointManager(open_storage(url)) as manager:
            records = {r.workflow_id: r for r in await manager.list_workflow_records()}
        assert {k: (r.status.value, r.metadata) for k, r in records.items()} == {
            "with-steps": ("finished", meta),
            "queued": ("unfinished", {"kind": "report"}),
        }


async def test_export_plaintext_decrypts_effect_records(
    new_store: NewStore, tmp_path: Path
) -> None:
    """export --plaintext writes encrypted effect records decrypted, as it does checkpoints:
    a plaintext store imports them, and the resumed run there behaves as at the source."""
    args, keys = key_args(tmp_path, True)
    src = new_store("sqlite")
    await crashed_runs(src, keys)
    path = tmp_path / "plain.jsonl"
    exported = cli("export", "--plaintext", *args, src, str(path))
    assert exported.code == 0, exported.err
    lines = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    records = [base64.b64decode(e["record"]) for e in lines if e.get("type") == "effect"]
    assert len(records) == 2 and all(r.startswith(b"ACKE") for r in records)
    dst = new_store("file")
    imported = cli("import", str(path), dst)
    assert imported.code == 0, imported.out + imported.err
    await assert_resumes_exactly_once(dst, None)
