"""The command line tells a record it cannot read from a corrupted one (docs/cli.md).

An operator who reads "corrupted" restores a backup over good data: a record sealed under a
key the keys given lack is "unreadable: key k2 not in the keyring", counted apart, with its
own exit status (5). Real subprocesses against real stores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiocheckpoint import CheckpointManager, Keyring, open_storage
from tests.test_cli import BACKENDS, NewStore, cli, new_store
from tests.test_cli_encryption import effect, keys_file

__all__ = ["new_store"]

K1, K2 = os.urandom(32), os.urandom(32)
OLD = Keyring(keys={"k1": K1}, primary="k1")
BOTH = Keyring(keys={"k1": K1, "k2": K2}, primary="k2")
EXIT_UNREADABLE = 5


async def rotated(url: str) -> None:
    """wf-0 and wf-1: steps 0..2 under k1; wf-0's step 3 and its effect under k2."""
    async with CheckpointManager(open_storage(url), encryption=OLD) as old:
        for wf in ("wf-0", "wf-1"):
            for step in range(3):
                await old.create_checkpoint(wf, step, "a", "completed", {"n": step})
                await old.record_effect(effect(wf, step, {"out": step}))
    async with CheckpointManager(open_storage(url), encryption=BOTH) as new:
        await new.create_checkpoint("wf-0", 3, "a", "completed", {"n": 3})
        await new.record_effect(effect("wf-0", 3, {"out": 3}))


async def corrupt(url: str, workflow_id: str, step: int) -> None:
    async with open_storage(url) as storage:
        record = await storage.load(workflow_id, step)
        assert record is not None
        await storage.save(workflow_id, step, record.data[:-9] + bytes(9))


@pytest.mark.parametrize("kind", BACKENDS)
async def test_verify_counts_unreadable_apart_from_corrupted(
    kind: str, new_store: NewStore, tmp_path: Path
) -> None:
    url = new_store(kind)
    await rotated(url)
    old = keys_file(tmp_path / "old.json", {"k1": K1}, "k1")
    both = keys_file(tmp_path / "both.json", {"k1": K1, "k2": K2}, "k2")
    result = cli("verify", url, "--keys", old)
    assert result.code == EXIT_UNREADABLE, result.out + result.err
    assert "unreadable: key k2 not in the keyring" in result.out
    assert "0 corrupted, 1 unreadable" in result.out
    report = cli("--json", "verify", url, "--keys", old)
    assert report.code == EXIT_UNREADABLE
    found = report.json()
    assert isinstance(found, dict) and found["ok"] is False and found["corrupted"] == []
    assert [(u["workflow_id"], u["step"]) for u in found["unreadable"]] == [("wf-0", 3)]
    assert found["unreadable"][0]["reason"] == "unreadable: key k2 not in the keyring"
    keyless = cli("verify", url)
    assert keyless.code == EXIT_UNREADABLE
    assert "unreadable: encrypted under key k1: pass --keys FILE" in keyless.out
    assert "0 corrupted, 7 unreadable" in keyless.out
    assert cli("verify", url, "--keys", both).code == 0
    await corrupt(url, "wf-1", 1)  # damage wins: exit status 1, both counted
    damaged = cli("verify", url, "--keys", old)
    assert damaged.code == 1
    assert "1 corrupted, 1 unreadable" in damaged.out


@pytest.mark.parametrize("kind", BACKENDS)
async def test_show_and_history_say_unreadable_not_corrupted(
    kind: str, new_store: NewStore, tmp_path: Path
) -> None:
    url = new_store(kind)
    await rotated(url)
    old = keys_file(tmp_path / "old.json", {"k1": K1}, "k1")
    shown = cli("show", url, "wf-0", "--keys", old)
    assert shown.code == EXIT_UNREADABLE
    line = shown.error_line()
    assert "unreadable: key k2 not in the keyring" in line and "corrupt" not in line
    assert cli("show", url, "wf-0", "2", "--keys", old).code == 0
    history = cli("--json", "history", url, "wf-0", "--keys", old)
    assert history.code == 0, history.err
    rows = history.json()["checkpoints"]  # type: ignore[call-overload,index]
    assert [r["status"] for r in rows] == ["unreadable", "completed", "completed", "completed"]
    assert rows[0]["reason"] == "unreadable: key k2 not in the keyring"
    assert rows[0]["effects"] == {"unreadable": "unreadable: key k2 not in the keyring"}
    table = cli("history", url, "wf-0", "--keys", old)
    assert table.code == 0 and "unreadable" in table.out and "corrupted" not in table.out


@pytest.mark.parametrize("kind", BACKENDS)
async def test_sweep_without_the_keys_says_what_it_kept_and_fails(
    kind: str, new_store: NewStore, tmp_path: Path
) -> None:
    """A sweep that kept everything because it read nothing does not exit 0."""
    url = new_store(kind)
    await rotated(url)
    old = keys_file(tmp_path / "old.json", {"k1": K1}, "k1")
    both = keys_file(tmp_path / "both.json", {"k1": K1, "k2": K2}, "k2")
    rules = ("--keep-last", "1", "--drop-terminal", "--dry-run")
    keyless = cli("sweep", url, *rules)
    assert keyless.code == EXIT_UNREADABLE
    assert "kept 7 checkpoints it could not read" in keyless.err
    assert "k1, k2" in keyless.err and "--keys FILE" in keyless.err
    partly = cli("--json", "sweep", url, *rules, "--keys", old)
    assert partly.code == EXIT_UNREADABLE
    report = partly.json()
    assert isinstance(report, dict)
    assert (report["skipped_no_key"], report["missing_keys"]) == (1, ["k2"])
    assert "not in the keyring" in partly.err
    whole = cli("--json", "sweep", url, *rules, "--keys", both)
    assert whole.code == 0
    assert whole.json()["checkpoints_deleted"] == 5  # type: ignore[call-overload,index]


@pytest.mark.parametrize("kind", ["sqlite"])
async def test_copy_and_import_name_what_is_under_a_key_they_lack_and_go_on(
    kind: str, new_store: NewStore, tmp_path: Path
) -> None:
    """No abort part way through: what needs the missing key is left out, named as
    unreadable, and the rest is carried (a workflow whose journal it cannot carry whole is
    refused whole)."""
    url = new_store(kind)
    await rotated(url)
    async with CheckpointManager(open_storage(url), encryption=BOTH) as new:
        await new.create_checkpoint("wf-2", 0, "a", "completed", {"n": 0})  # no effect
    old = keys_file(tmp_path / "old.json", {"k1": K1}, "k1")
    both = keys_file(tmp_path / "both.json", {"k1": K1, "k2": K2}, "k2")
    export = tmp_path / "sealed.jsonl"
    assert cli("export", url, str(export), "--keys", both).code == 0
    missing = "unreadable: key k2 not in the keyring"
    imported = cli("--json", "import", str(export), new_store(kind), "--keys", old)
    copied = cli("--json", "copy", url, new_store(kind), "--keys", old)
    for result in (imported, copied):
        assert result.code == 1, result.err
        report = result.json()
        assert isinstance(report, dict)
        assert [(r["workflow_id"], r["reason"]) for r in report["refused"]] == [
            ("wf-0", f"effect 'call' of step 3: {missing}")
        ]
    report = imported.json()
    assert isinstance(report, dict) and report["written"] == 3  # wf-1's
    for result in (imported, copied):
        report = result.json()
        assert isinstance(report, dict) and report["corrupted"] == []
        assert [(c["workflow_id"], c["step"], c["reason"]) for c in report["unreadable"]] == [
            ("wf-2", 0, missing)
        ]


async def sealed_checkpoints(url: str) -> None:
    """wf-a: steps 0..1 under k1; wf-b: step 0 under k1, step 1 under k2 (no effects)."""
    async with CheckpointManager(open_storage(url), encryption=OLD) as old:
        for wf in ("wf-a", "wf-b"):
            for step in range(2):
                await old.create_checkpoint(wf, step, "a", "completed", {"n": step})
    async with CheckpointManager(open_storage(url), encryption=BOTH) as new:
        await new.create_checkpoint("wf-b", 2, "a", "completed", {"n": 2})


def problems(report: object, name: str) -> list[tuple[str, int, str]]:
    assert isinstance(report, dict)
    return [(p["workflow_id"], p["step"], p["reason"]) for p in report.get(name, [])]


@pytest.mark.parametrize("command", ["copy", "export"])
async def test_copy_and_export_say_unreadable_not_corrupted(
    command: str, new_store: NewStore, tmp_path: Path
) -> None:
    """A sealed record's only checksum is its authentication tag: copy and export must read
    it to verify it. Without its key it is left out and listed as unreadable, apart from
    corrupted records, with exit status 5; a corrupted record as well makes it 1."""
    url = new_store("sqlite")
    await sealed_checkpoints(url)
    old = keys_file(tmp_path / "old.json", {"k1": K1}, "k1")
    target = [new_store("sqlite")] if command == "copy" else [str(tmp_path / "out.jsonl")]

    def run(*keys: str) -> object:
        result = cli("--json", command, url, *target, *keys)
        if command == "copy":
            target[0] = new_store("sqlite")
        else:
            (tmp_path / "out.jsonl").unlink(missing_ok=True)
        return result

    bare = run()
    assert bare.code == EXIT_UNREADABLE, bare.err
    report = bare.json()
    assert problems(report, "corrupted") == []
    unread = problems(report, "unreadable")
    assert [(wf, step) for wf, step, _ in unread] == [
        ("wf-a", 0),
        ("wf-a", 1),
        ("wf-b", 0),
        ("wf-b", 1),
        ("wf-b", 2),
    ]
    assert unread[0][2].startswith("unreadable: encrypted under key k1: pass --keys FILE")
    assert report["ok"] is False and report["written"] == 0
    lacking = run("--keys", old)
    assert lacking.code == EXIT_UNREADABLE, lacking.err
    report = lacking.json()
    assert problems(report, "corrupted") == []
    assert problems(report, "unreadable") == [("wf-b", 2, "unreadable: key k2 not in the keyring")]
    assert report["written"] == 4
    text = cli(command, url, *target, "--keys", old)
    assert text.code == EXIT_UNREADABLE
    assert "unreadable with these keys (not transferred):" in text.out
    assert "corrupted" not in text.out
    await corrupt(url, "wf-a", 0)
    both = run("--keys", old)
    assert both.code == 1, both.err
    report = both.json()
    assert [(wf, step) for wf, step, _ in problems(report, "corrupted")] == [("wf-a", 0)]
    assert [(wf, step) for wf, step, _ in problems(report, "unreadable")] == [("wf-b", 2)]
