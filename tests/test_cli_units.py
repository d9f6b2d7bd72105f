"""In-process tests of the command line: state diffs, and workflow records (in-memory only).

The in-memory backend is the only one that keeps workflow records so far and it lives in one
process, so these tests call ``main(argv)`` directly with a populated store handed to
``open_storage``.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import CheckpointManager, InMemoryCheckpointStorage
from aiocheckpoint.cli import build_parser, main
from aiocheckpoint.cli import store as cli_store
from aiocheckpoint.cli.diff import diff_states, format_path


def test_paths_follow_shared_state_dot_paths() -> None:
    """Dict keys join with dots, list indexes are [i], awkward keys are quoted."""
    assert format_path(("plan", "items", 2, "title")) == "plan.items[2].title"
    assert format_path(("a.b", 0)) == '["a.b"][0]'
    assert format_path(("", "x y", "q'")) == '[""].x y["q\'"]'
    assert format_path(("line\nbreak",)) == '["line\\nbreak"]'


def test_diff_is_strict_about_types_but_not_about_nan() -> None:
    """True vs 1 and 1 vs 1.0 are changes; NaN to NaN is not; a list becoming a dict is."""
    old = {"flag": 1, "n": 1, "x": math.nan, "shape": [1, 2]}
    new = {"flag": True, "n": 1.0, "x": math.nan, "shape": {"0": 1}}
    assert [(c.op, c.path) for c in diff_states(old, new)] == [
        ("changed", "flag"),
        ("changed", "n"),
        ("changed", "shape"),
    ]


def test_diff_walks_lists_of_dicts() -> None:
    """Changes inside dicts inside lists get full paths; shorter lists report removals."""
    old = {"steps": [{"id": 1, "ok": False}, {"id": 2}, {"id": 3}]}
    new = {"steps": [{"id": 1, "ok": True}, {"id": 2, "note": "n"}]}
    changes = diff_states(old, new)
    assert [(c.op, c.path, c.old, c.new) for c in changes] == [
        ("changed", "steps[0].ok", False, True),
        ("added", "steps[1].note", None, "n"),
        ("removed", "steps[2]", {"id": 3}, None),
    ]


class KeepOnClose(InMemoryCheckpointStorage):
    """The in-memory store, except that closing keeps its contents for inspection."""

    async def close(self) -> None:
        self._closed = True


async def _store_with_records() -> KeepOnClose:
    storage = KeepOnClose()
    manager = CheckpointManager(storage)
    for step in range(3):
        await manager.create_checkpoint("done", step, "a", "completed", {"step": step})
    await manager.mark_workflow("done", "finished")
    await manager.create_checkpoint("broken", 0, "a", "failed", {})
    await manager.mark_workflow("broken", "failed")
    await manager.create_checkpoint("going", 0, "a", "running", {})
    await manager.register_workflow("queued")
    return storage


def _run(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    *stores: Any,
) -> tuple[int, str, str]:
    queue = list(stores)
    monkeypatch.setattr(cli_store, "open_storage", lambda url, **_: queue.pop(0))
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_workflows_shows_workflow_records(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With workflow records, `workflows` shows each one's status, even with no checkpoint."""
    store = asyncio.run(_store_with_records())
    code, out, _ = _run(monkeypatch, capsys, ["workflows", "memory://", "--json"], store)
    assert code == 0
    rows = {r["workflow_id"]: r for r in json.loads(out)["workflows"]}
    assert {k: (r["workflow_status"], r["finished"], r["steps"]) for k, r in rows.items()} == {
        "broken": ("failed", True, 1),
        "done": ("finished", True, 3),
        "going": ("unfinished", False, 1),
        "queued": ("unfinished", False, 0),
    }
    assert rows["queued"]["latest_step"] is None


def test_workflows_unfinished_filters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--unfinished` keeps only the workflows whose record says unfinished."""
    store = asyncio.run(_store_with_records())
    code, out, _ = _run(monkeypatch, capsys, ["workflows", "memory://", "--unfinished"], store)
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["going", "queued"]


def test_copy_and_import_carry_workflow_statuses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Statuses travel with `copy` and through `export`/`import` between stores that keep
    them."""
    copied = KeepOnClose()
    args = ["copy", "memory://", "memory://", "--json"]
    code, out, _ = _run(monkeypatch, capsys, args, asyncio.run(_store_with_records()), copied)
    assert code == 0, out
    assert json.loads(out)["written"] == 5
    path = tmp_path / "e.jsonl"
    args = ["export", "memory://", str(path)]
    assert _run(monkeypatch, capsys, args, asyncio.run(_store_with_records()))[0] == 0
    lines = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    queued = {
        "type": "workflow",
        "workflow_id": "queued",
        "status": "unfinished",
        "kind": "workflow",
    }
    assert queued in lines
    imported = KeepOnClose()
    assert _run(monkeypatch, capsys, ["import", str(path), "memory://"], imported)[0] == 0

    async def statuses(storage: KeepOnClose) -> dict[str, str]:
        storage._closed = False
        records = await CheckpointManager(storage).list_workflow_records()
        return {r.workflow_id: r.status.value for r in records}

    expected = {
        "broken": "failed",
        "done": "finished",
        "going": "unfinished",
        "queued": "unfinished",
    }
    assert asyncio.run(statuses(copied)) == expected
    assert asyncio.run(statuses(imported)) == expected


def test_main_returns_exit_statuses() -> None:
    """main() returns 0 for --version and 2 for a usage error, without raising."""
    assert main(["--version"]) == 0
    assert main(["history"]) == 2
    assert main(["workflows", "nope:"]) == 2


def test_huge_ints_print_in_show_and_diff(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """States holding ints beyond Python's default digit limit still print in full."""
    huge = 10**5000 + 7
    digits = "1" + "0" * 4999 + "7"  # str(huge) would hit the test's own digit limit

    async def store() -> KeepOnClose:
        storage = KeepOnClose()
        manager = CheckpointManager(storage)
        await manager.create_checkpoint("w", 0, "a", "completed", {"n": 1})
        await manager.create_checkpoint("w", 1, "a", "completed", {"n": huge})
        return storage

    code, out, _ = _run(
        monkeypatch, capsys, ["show", "memory://", "w", "--json"], asyncio.run(store())
    )
    assert code == 0
    assert out.count(digits) == 1
    code, out, _ = _run(
        monkeypatch, capsys, ["diff", "memory://", "w", "0", "1"], asyncio.run(store())
    )
    assert code == 0
    assert out.startswith("~ n: 1 -> " + digits[:50])


def test_workflows_table_names_the_workflow_status_column(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table's last column holds the workflow record's status (finished, failed,
    unfinished), and its header says so: it is not a yes/no "finished" column."""
    store = asyncio.run(_store_with_records())
    code, out, _ = _run(monkeypatch, capsys, ["workflows", "memory://"], store)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.endswith("WORKFLOW STATUS")
    column = header.index("WORKFLOW STATUS")
    assert {row.split()[0]: row[column:] for row in rows} == {
        "broken": "failed",
        "done": "finished",
        "going": "unfinished",
        "queued": "unfinished",
    }


_DOC_VALUES = {
    "URL": "memory://",
    "SRC_URL": "sqlite:a.db",
    "DST_URL": "sqlite:b.db",
    "WORKFLOW": "wf",
    "STEP": "3",
    "STEP_A": "1",
    "STEP_B": "2",
    "N": "5",
    "FILE.jsonl": "f.jsonl",
    "TIME": "2026-01-31T12:00:00Z",
    "KEY=VALUE": "tenant=acme",
    "K": "10",
    "DURATION": "30d",
    "JSON": '{"charged": 30}',
    "TEXT": "runaway",
}


def _doc_synopses() -> list[str]:
    """Every command synopsis in docs/cli.md: the `### \\`...\\`` headings of its commands."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text("utf-8")
    synopses = []
    for heading in re.findall(r"^### (.+)$", text, flags=re.MULTILINE):
        synopses += re.findall(r"`([^`]+)`", heading)
    return synopses


def _doc_examples() -> list[list[str]]:
    """Every `$ aiocheckpoint ...` command line in docs/cli.md's console examples."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text("utf-8")
    lines = re.findall(r"^\$ aiocheckpoint (.+)$", text, flags=re.MULTILINE)
    return [shlex.split(line.split("<")[0], comments=True) for line in lines]


def _variants(synopsis: str) -> list[list[str]]:
    """The synopsis with each subset of its `[optional]` parts, placeholders filled in."""
    optional = re.findall(r"\[([^\]]+)\]", synopsis)
    variants = []
    for mask in range(2 ** len(optional)):
        text = synopsis
        for i, part in enumerate(optional):
            text = text.replace(f"[{part}]", part if mask >> i & 1 else "", 1)
        variants.append([_DOC_VALUES.get(word, word) for word in text.split()])
    return variants


def test_every_synopsis_in_the_docs_parses() -> None:
    """Each command synopsis in docs/cli.md (every combination of its optional parts) and
    each example command line parses with the real parser; `prune URL --keep N WORKFLOW`
    takes the workflow."""
    synopses = _doc_synopses()
    commands = {"workflows", "history", "show", "diff", "verify", "prune", "rm", "fork", "copy"}
    commands |= {"sweep", "compact", "effect", "serve", "resume", "retry", "cancel", "events"}
    assert {s.split()[0] for s in synopses} == commands | {"export", "import", "rekey", "encrypt"}
    parser = build_parser()
    for synopsis in synopses:
        for argv in _variants(synopsis):
            args = parser.parse_args(argv)
            assert args.command == argv[0], argv
    examples = [argv for argv in _doc_examples() if argv != ["--help"]]
    assert len(examples) >= 10
    for argv in examples:
        assert parser.parse_args(argv).command == argv[0], argv
    late = parser.parse_args(["prune", "memory://", "--keep", "5", "wf"])
    assert (late.workflow, late.keep) == ("wf", 5)


def test_every_command_takes_allow_shared_before_or_after_its_name() -> None:
    """`--allow-shared` (docs/cli.md, "Other users' stores") is taken by every command of the
    docs, before the command name, after it or after its arguments; without it, it is off."""
    parser = build_parser()
    for synopsis in _doc_synopses():
        argv = _variants(synopsis)[-1]
        assert parser.parse_args(argv).allow_shared is False, argv
        for given in (["--allow-shared", *argv], [argv[0], "--allow-shared", *argv[1:]]):
            assert parser.parse_args(given).allow_shared is True, given
        assert parser.parse_args([*argv, "--allow-shared"]).allow_shared is True, argv
