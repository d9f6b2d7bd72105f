"""Hostile effect journals in ``copy``, ``export`` and ``import``.

An export file's effect lines and a store's effect records are input like any other: a
malformed, forged, moved or mislabelled one refuses its workflow whole, by name
(``WorkflowTransferError`` in the report, exit status 1), and nothing of that workflow is
written, while the sound workflows beside it are carried. ``export`` writes ids and keys
with control and bidi characters as JSON escapes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import EffectRecord, EffectState, WorkflowTransferError
from aiocheckpoint.cli.journal import Journal
from aiocheckpoint.cli.store import PAGE, open_store
from aiocheckpoint.codec.sealing import Keyring
from tests.hostile.test_cli import checkpoint_line, export_file, record_of
from tests.test_cli import cli
from tests.test_cli_encryption import keys_file

KEY = os.urandom(32)


def effect_record(workflow_id: str, step: int, key: str, *, done: bool) -> EffectRecord:
    """An effect's intent, or its outcome with a result."""
    now = datetime.now(timezone.utc)
    intent = EffectRecord(workflow_id, step, key, "charge", EffectState.IN_DOUBT, 1, now, "i")
    return intent.finished(EffectState.DONE, result={"ok": 1}) if done else intent


async def effect_bytes(
    workflow_id: str, step: int, key: str, *, done: bool, keys: Keyring | None = None
) -> bytes:
    """The stored bytes of an effect record (sealed with ``keys``)."""
    async with open_store("memory://", must_exist=False, keys=keys) as manager:
        await manager.record_effect(effect_record(workflow_id, step, key, done=done))
        [stored] = await manager.storage.load_effects(workflow_id, step)  # type: ignore[attr-defined]
    return bytes(stored.data)


def effect_line(
    workflow_id: str, step: object, key: object, in_doubt: object, record: bytes | str
) -> dict[str, object]:
    """An export's effect line (``record`` as bytes, or as the raw field)."""
    text = base64.b64encode(record).decode() if isinstance(record, bytes) else record
    return {
        "type": "effect",
        "workflow_id": workflow_id,
        "step": step,
        "key": key,
        "in_doubt": in_doubt,
        "record": text,
    }


def end_line(checkpoints: int, effects: int, workflows: int = 2) -> dict[str, object]:
    return {"type": "end", "checkpoints": checkpoints, "effects": effects, "workflows": workflows}


def v2_file(path: Path, lines: list[Any]) -> Path:
    """An export of format version 2 holding ``lines``."""
    export_file(path, lines)
    text = path.read_bytes().split(b"\n", 1)
    header = json.loads(text[0])
    header["version"] = 2
    path.write_bytes(json.dumps(header).encode() + b"\n" + text[1])
    return path


async def stored_of(url: str, workflow_id: str) -> tuple[list[int], list[Any]]:
    """The steps with checkpoints and the effect records of ``workflow_id`` at ``url``."""
    async with open_store(url, must_exist=False) as manager:
        steps = [r.step for r in await manager.storage.scan(workflow_id)]
        effects = []
        for step in range(0, 4):
            effects += await manager.storage.load_effects(workflow_id, step)  # type: ignore[attr-defined]
    return steps, effects


async def bad_lines() -> dict[str, tuple[dict[str, object], str]]:
    """Effect lines of workflow "bad", each with the reason its refusal must give."""
    done = await effect_bytes("bad", 1, "k", done=True)
    doubt = await effect_bytes("bad", 1, "k", done=False)
    other = await effect_bytes("elsewhere", 1, "k", done=True)
    flipped = bytearray(done)
    flipped[-3] ^= 0x01
    sealed = await effect_bytes("bad", 1, "k", done=True, keys=Keyring({"k1": KEY}, "k1"))
    deep = done[:9] + b"[" * 100_000
    return {
        "flag-not-bool": (effect_line("bad", 1, "k", "yes", done), "in_doubt must be"),
        "key-with-nul": (effect_line("bad", 1, "a\x00b", False, done), "malformed effect"),
        "key-too-long": (effect_line("bad", 1, "k" * 256, False, done), "malformed effect"),
        "key-not-str": (effect_line("bad", 1, ["k"], False, done), "malformed effect"),
        "step-negative": (effect_line("bad", -1, "k", False, done), "malformed effect"),
        "step-huge": (effect_line("bad", 2**70, "k", False, done), "malformed effect"),
        "not-base64": (effect_line("bad", 1, "k", False, "!!not base64"), "malformed effect"),
        "record-not-str": (effect_line("bad", 1, "k", False, 7), "malformed effect"),  # type: ignore[arg-type]
        "checksum": (effect_line("bad", 1, "k", False, bytes(flipped)), "checksum"),
        "truncated": (effect_line("bad", 1, "k", False, done[:5]), "too short"),
        "nested-deeply": (effect_line("bad", 1, "k", False, deep), "effect 'k' of step 1"),
        "moved-workflow": (effect_line("bad", 1, "k", False, other), "another workflow"),
        "moved-step": (effect_line("bad", 2, "k", False, done), "another workflow"),
        "moved-key": (effect_line("bad", 1, "j", False, done), "another workflow"),
        "doubt-hidden": (effect_line("bad", 1, "k", False, doubt), "wrong in-doubt flag"),
        "done-as-doubt": (effect_line("bad", 1, "k", True, done), "wrong in-doubt flag"),
        "sealed-no-keys": (effect_line("bad", 1, "k", False, sealed), "pass --keys"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "flag-not-bool",
        "key-with-nul",
        "key-too-long",
        "key-not-str",
        "step-negative",
        "step-huge",
        "not-base64",
        "record-not-str",
        "checksum",
        "truncated",
        "nested-deeply",
        "moved-workflow",
        "moved-step",
        "moved-key",
        "doubt-hidden",
        "done-as-doubt",
        "sealed-no-keys",
    ],
)
async def test_import_refuses_a_workflow_with_a_bad_effect_line(tmp_path: Path, case: str) -> None:
    """The bad line's workflow is refused by name (exit status 1) and nothing of it is
    written, neither its good effect nor its checkpoints; the good workflow is imported."""
    line, reason = (await bad_lines())[case]
    good = await effect_bytes("bad", 0, "first", done=True)
    fine = await effect_bytes("good", 1, "k", done=False)
    lines = [
        effect_line("bad", 0, "first", False, good),
        line,
        checkpoint_line("bad", 0, await record_of("memory://", "bad", 0, {"n": 0})),
        effect_line("good", 1, "k", True, fine),
        checkpoint_line("good", 0, await record_of("memory://", "good", 0, {"n": 0})),
        end_line(2, 3),
    ]
    path = v2_file(tmp_path / f"{case}.jsonl", lines)
    dst = f"sqlite:{tmp_path}/dst.db"
    result = cli("--json", "import", str(path), dst)
    assert result.code == 1, result.out + result.err
    assert "Traceback" not in result.err
    report = result.json()
    assert isinstance(report, dict)
    [refused] = report["refused"]
    assert (refused["workflow_id"], refused["line"]) == ("bad", 3)
    assert reason in refused["reason"], refused["reason"]
    assert (report["corrupted"], report["written"], report["effects"]["written"]) == ([], 1, 1)
    assert await stored_of(dst, "bad") == ([], [])
    steps, effects = await stored_of(dst, "good")
    assert steps == [0] and [(e.step, e.in_doubt) for e in effects] == [(1, True)]
    text = cli("import", str(path), f"sqlite:{tmp_path}/text.db")
    assert text.code == 1
    assert "workflows not carried" in text.out and "bad" in text.out


async def test_an_effect_line_with_a_bad_workflow_id_is_a_malformed_line(tmp_path: Path) -> None:
    """Without a valid workflow id the line names no workflow: it is reported as a line."""
    record = await effect_bytes("w", 1, "k", done=True)
    path = v2_file(
        tmp_path / "e.jsonl", [effect_line("a\x00b", 1, "k", False, record), end_line(0, 0, 0)]
    )
    result = cli("--json", "import", str(path), f"sqlite:{tmp_path}/dst.db")
    assert result.code == 1
    report = result.json()
    assert isinstance(report, dict)
    assert [c["line"] for c in report["corrupted"]] == [2]
    assert report["refused"] == []


async def test_a_version_1_file_holds_no_effect_lines(tmp_path: Path) -> None:
    """Format version 1 has no effect lines: one there is a malformed line, not imported."""
    record = await effect_bytes("w", 1, "k", done=True)
    path = export_file(
        tmp_path / "v1.jsonl",
        [effect_line("w", 1, "k", False, record), {"type": "end", "checkpoints": 0}],
    )
    dst = f"sqlite:{tmp_path}/dst.db"
    result = cli("--json", "import", str(path), dst)
    assert result.code == 1
    report = result.json()
    assert isinstance(report, dict)
    assert ["unknown line type" in c["reason"] for c in report["corrupted"]] == [True]
    assert await stored_of(dst, "w") == ([], [])


async def test_the_end_line_counts_effect_lines(tmp_path: Path) -> None:
    """A version-2 file whose end line miscounts its effect lines is reported (truncated
    or spliced), its sound records still imported."""
    record = await effect_bytes("w", 1, "k", done=True)
    path = v2_file(
        tmp_path / "e.jsonl", [effect_line("w", 1, "k", False, record), end_line(0, 2, 1)]
    )
    result = cli("--json", "import", str(path), f"sqlite:{tmp_path}/dst.db")
    assert result.code == 1
    report = result.json()
    assert isinstance(report, dict)
    assert [c["reason"] for c in report["corrupted"]] == [
        "the end line counts 2 effects, the file holds 1"
    ]
    assert report["effects"]["written"] == 1


async def test_import_refuses_an_effect_that_differs_at_the_destination(tmp_path: Path) -> None:
    """A destination holding another record under the same effect key keeps it and gets
    nothing of the workflow, unless --overwrite."""
    dst = f"sqlite:{tmp_path}/dst.db"
    async with open_store(dst, must_exist=False) as manager:
        await manager.record_effect(effect_record("w", 1, "k", done=True))
    mine = await effect_bytes("w", 1, "k", done=False)
    checkpoint = checkpoint_line("w", 0, await record_of("memory://", "w", 0, {"n": 0}))
    path = v2_file(
        tmp_path / "e.jsonl", [effect_line("w", 1, "k", True, mine), checkpoint, end_line(1, 1, 1)]
    )
    result = cli("--json", "import", str(path), dst)
    assert result.code == 1
    report = result.json()
    assert isinstance(report, dict)
    assert "differs at the destination" in report["refused"][0]["reason"]
    steps, effects = await stored_of(dst, "w")
    assert steps == [] and [e.in_doubt for e in effects] == [False]
    forced = cli("--json", "import", "--overwrite", str(path), dst)
    assert forced.code == 0, forced.out
    steps, effects = await stored_of(dst, "w")
    assert steps == [0] and [e.in_doubt for e in effects] == [True]


async def test_copy_refuses_a_workflow_whose_effect_record_is_damaged(tmp_path: Path) -> None:
    """A source effect record that fails its checksum refuses its workflow: nothing of it
    (not its checkpoints, not its sound effects) reaches the destination; the rest does."""
    src, dst = f"sqlite:{tmp_path}/src.db", f"sqlite:{tmp_path}/dst.db"
    async with open_store(src, must_exist=False) as manager:
        for workflow_id in ("bad", "good"):
            await manager.create_checkpoint(workflow_id, 0, "a", "completed", {"n": 0})
            await manager.record_effect(effect_record(workflow_id, 0, "a", done=True))
            await manager.record_effect(effect_record(workflow_id, 1, "k", done=False))
        storage: Any = manager.storage
        [stored] = await storage.load_effects("bad", 1)
        damaged = bytearray(stored.data)
        damaged[-3] ^= 0x01
        await storage.put_effect("bad", 1, "k", bytes(damaged), in_doubt=True)
    result = cli("--json", "copy", src, dst)
    assert result.code == 1
    report = result.json()
    assert isinstance(report, dict)
    [refused] = report["refused"]
    assert refused["workflow_id"] == "bad" and "checksum" in refused["reason"]
    assert report["effects"] == {"written": 2, "skipped": 0, "verified": 2}
    assert await stored_of(dst, "bad") == ([], [])
    steps, effects = await stored_of(dst, "good")
    assert steps == [0] and len(effects) == 2


async def test_copy_of_encrypted_effects_without_keys_refuses_them(tmp_path: Path) -> None:
    """Without --keys an encrypted effect record cannot be verified: its workflow is
    refused with the reason, never copied unverified; with --keys it is copied sealed."""
    keys = Keyring({"k1": KEY}, "k1")
    src, dst = f"sqlite:{tmp_path}/src.db", f"sqlite:{tmp_path}/dst.db"
    async with open_store(src, must_exist=False, keys=keys) as manager:
        await manager.record_effect(effect_record("w", 1, "k", done=False))
    result = cli("--json", "copy", src, dst)
    assert result.code == 1
    report = result.json()
    assert isinstance(report, dict)
    assert "pass --keys" in report["refused"][0]["reason"]
    assert await stored_of(dst, "w") == ([], [])
    path = keys_file(tmp_path / "keys.json", {"k1": KEY}, "k1")
    assert cli("copy", "--keys", path, src, dst).code == 0
    _, [copied] = await stored_of(dst, "w")
    assert copied.data.startswith(b"ACKX") and copied.in_doubt


async def test_journal_refuses_a_store_that_cannot_list_its_effects() -> None:
    """A third-party store with effects but no listing: its workflows are refused, typed."""

    class NoListing:
        async def put_effect(self, *a: Any, **k: Any) -> None: ...
        async def load_effects(self, *a: Any) -> list[Any]:
            return []

        async def in_doubt_workflows(self) -> list[str]:
            return []

        async def drop_orphan_effects(self, *a: Any) -> int:
            return 0

        async def has_effects(self, *a: Any) -> bool:
            return True

        async def in_doubt_effects(self, *a: Any) -> list[Any]:
            return []

    class Manager:
        storage = NoListing()

    journal = Journal(Manager(), None)  # type: ignore[arg-type]
    assert await journal.workflows() == []
    with pytest.raises(WorkflowTransferError) as caught:
        await journal.steps("w")
    assert caught.value.workflow_id == "w" and "cannot list" in caught.value.reason


HOSTILE_ID = "w\u0085\u202e/x\u2028"
HOSTILE_KEY = "k\u009b\u2066"
RAW = ("\u0085", "\u202e", "\u2028", "\u009b", "\u2066")


async def test_export_escapes_control_and_bidi_characters(tmp_path: Path) -> None:
    """`export URL -` writes C1 controls, bidi overrides and line separators of ids and
    effect keys as JSON escapes: nothing raw reaches the terminal, and each line parses to
    the exact values (and imports)."""
    src = f"sqlite:{tmp_path}/src.db"
    async with open_store(src, must_exist=False) as manager:
        await manager.create_checkpoint(HOSTILE_ID, 0, "a", "completed", {"n": 0})
        await manager.record_effect(effect_record(HOSTILE_ID, 1, HOSTILE_KEY, done=True))
    result = cli("export", src, "-")
    assert result.code == 0, result.err
    assert not [c for c in RAW if c in result.out]
    assert "\\u0085" in result.out and "\\u202e" in result.out and "\\u2066" in result.out
    lines = [json.loads(line) for line in result.out.splitlines()]
    effect, checkpoint = lines[1], lines[2]
    assert (effect["workflow_id"], effect["key"]) == (HOSTILE_ID, HOSTILE_KEY)
    assert checkpoint["workflow_id"] == HOSTILE_ID
    path = tmp_path / "e.jsonl"
    path.write_text(result.out, "utf-8")
    dst = f"sqlite:{tmp_path}/dst.db"
    assert cli("import", str(path), dst).code == 0
    async with open_store(dst, must_exist=True) as manager:
        [record] = await manager.get_effects(HOSTILE_ID, 1)
    assert record.key == HOSTILE_KEY and record.result == {"ok": 1}


@pytest.mark.parametrize(
    "metadata", [[1], "text", 7, {"x": float("nan")}], ids=["list", "str", "int", "nan"]
)
async def test_import_reports_a_workflow_line_with_bad_metadata(
    tmp_path: Path, metadata: object
) -> None:
    """Metadata that is not a storable JSON object is a malformed line (status 1): the
    record's status and metadata are not set from it; the workflow's checkpoints import."""
    checkpoint = checkpoint_line("w", 0, await record_of("memory://", "w", 0, {"n": 0}))
    line = {"type": "workflow", "workflow_id": "w", "status": "finished", "metadata": metadata}
    path = v2_file(tmp_path / "m.jsonl", [checkpoint, line, end_line(1, 0, 1)])
    dst = f"sqlite:{tmp_path}/dst.db"
    result = cli("--json", "import", str(path), dst)
    assert result.code == 1, result.out + result.err
    assert "Traceback" not in result.err
    report = result.json()
    assert isinstance(report, dict)
    assert [c["line"] for c in report["corrupted"]] == [3]
    async with open_store(dst, must_exist=True) as manager:
        record = await manager.get_workflow("w")
    assert record is not None and (record.status.value, record.metadata) == ("unfinished", {})


def test_import_holds_a_bounded_journal_per_workflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A workflow whose effect lines hold more than import's buffer before its checkpoints
    is refused (memory stays bounded), nothing of it written; the next workflow imports.
    In process, with the buffer made small."""
    from aiocheckpoint.cli import importer, main

    records = [asyncio.run(effect_bytes("big", 1, f"k{n}", done=True)) for n in range(3)]
    small = asyncio.run(effect_bytes("small", 1, "k", done=True))
    monkeypatch.setattr(importer, "EFFECT_BUFFER", len(records[0]) * 2 + 1)
    lines = [effect_line("big", 1, f"k{n}", False, r) for n, r in enumerate(records)]
    lines += [effect_line("small", 1, "k", False, small), end_line(0, 4)]
    path = v2_file(tmp_path / "big.jsonl", lines)
    dst = f"sqlite:{tmp_path}/dst.db"
    assert main(["--json", "import", str(path), dst]) == 1
    report = json.loads(capsys.readouterr().out)
    [refused] = report["refused"]
    assert (refused["workflow_id"], refused["line"]) == ("big", 4)
    assert "more than import holds" in refused["reason"]
    assert report["effects"]["written"] == 1
    assert asyncio.run(stored_of(dst, "big")) == ([], [])
    assert len(asyncio.run(stored_of(dst, "small"))[1]) == 1


@pytest.mark.parametrize("split", ["another-workflow", "full-page"])
async def test_import_refuses_an_effect_line_after_its_workflows_checkpoints(
    tmp_path: Path, split: str
) -> None:
    """A crafted file whose effect line of "late" comes after "late"'s checkpoints were
    written (another workflow's lines, or a full page of its own, flushed them): the effect
    would be stored after the checkpoints a resume replays from, so "late" is refused by
    name at that line and its effect is not written; the other workflow is imported."""
    count = 1 if split == "another-workflow" else PAGE
    lines: list[Any] = [
        checkpoint_line("late", step, await record_of("memory://", "late", step, {"n": step}))
        for step in range(count)
    ]
    if split == "another-workflow":
        lines.append(checkpoint_line("other", 0, await record_of("memory://", "other", 0, {})))
    else:  # one more checkpoint line makes the full page flush first
        step = count
        lines.append(checkpoint_line("late", step, await record_of("memory://", "late", step, {})))
    effect = await effect_bytes("late", count + 1, "k", done=True)
    lines.append(effect_line("late", count + 1, "k", False, effect))
    lines.append(end_line(len(lines) - 1, 1))
    path = v2_file(tmp_path / "late.jsonl", lines)
    dst = f"sqlite:{tmp_path}/dst.db"
    result = cli("--json", "import", str(path), dst)
    assert result.code == 1, result.out + result.err
    report = result.json()
    assert isinstance(report, dict)
    [refused] = report["refused"]
    assert (refused["workflow_id"], refused["line"]) == ("late", len(lines))
    assert "after its checkpoints were written" in refused["reason"]
    assert report["effects"]["written"] == 0
    async with open_store(dst, must_exist=False) as manager:
        assert await manager.storage.load_effects("late", count + 1) == []  # type: ignore[attr-defined]
        assert [r.step for r in await manager.storage.scan("other")] == (
            [0] if split == "another-workflow" else []
        )
