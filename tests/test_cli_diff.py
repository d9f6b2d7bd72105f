"""``aiocheckpoint diff`` walks both trees (the manager's ``diff_records``, the web
inspector's diff too) and prints exactly what the whole read printed: every pair of steps
of real stores (SQLite, file, PostgreSQL; plain and encrypted), text and JSON, and the
errors (a missing step, a missing key, a damaged chunk). The whole read is the command's
own fallback, forced here by a manager that walks nothing (bytes read counted on SQLite,
never times: bench/web.py --cli)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from aiocheckpoint import CheckpointManager
from aiocheckpoint.cli import main
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.test_cli import NewStore, new_store
from tests.test_cli_encryption import keys_file
from tests.test_partial_reads import KEY as STORY_KEY
from tests.test_partial_reads import story
from tests.test_web_peek import fetched
from tests.test_web_treediff import history

__all__ = ["new_store"]


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The command's exit code, stdout and stderr (run in a thread: it runs its own loop)."""
    capsys.readouterr()
    code = await anyio.to_thread.run_sync(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def both(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str
) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """The command walking the trees, then reading both states whole."""
    walked = await run(capsys, *argv)

    async def nothing(*_: Any, **__: Any) -> None:
        return None

    with monkeypatch.context() as patch:
        patch.setattr(CheckpointManager, "diff_records", nothing)
        whole = await run(capsys, *argv)
    return walked, whole


@pytest.mark.parametrize(
    ("kind", "every"),
    [
        # The fast tier: each edit once, on one store (the whole set takes 10-17 s a store).
        pytest.param("sqlite", False, id="sqlite-each-edit"),
        *(
            pytest.param(k, True, marks=pytest.mark.slow, id=k)
            for k in ("sqlite", "postgres", "file")
        ),
    ],
)
async def test_diff_prints_what_the_whole_read_printed(
    kind: str,
    every: bool,
    new_store: NewStore,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each step against the one before, the first against each, a step against itself and
    a later against an earlier one: the same text and JSON, byte for byte; on SQLite the
    one-key edit reads a small part of the ~2 MB states."""
    url = new_store(kind)
    steps = await history(url)
    sizes = fetched(monkeypatch)
    pairs = [(s - 1, s) for s in range(1, steps)] + [(0, s) for s in range(2, steps) if every]
    for old, new in [*pairs, (3, 3), (5, 2)]:
        for json in ([], ["--json"]) if every or (old, new) == (0, 1) else ([],):
            sizes.clear()
            walked, whole = await both(
                capsys, monkeypatch, "diff", url, "big", str(old), str(new), *json
            )
            if (old, new) == (0, 1) and kind == "sqlite" and not json:
                assert 0 < sum(sizes) < 100_000, sum(sizes)
            assert walked[0] == 0, walked
            assert walked == whole, (old, new, json)
    code, out, _ = await run(capsys, "diff", url, "big", "0", "1")
    assert code == 0 and out.startswith("~ k01000: ")


async def test_diff_of_encrypted_trees_with_and_without_keys(
    new_store: NewStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With --keys the sealed trees are walked (a part of their blobs read) and print what
    the whole read prints; without keys, and with another key, the same refusal."""
    url = new_store("sqlite")
    await story(url)
    keys = keys_file(tmp_path / "keys.json", {"k1": STORY_KEY}, "k1")
    other = keys_file(tmp_path / "other.json", {"k2": bytes(32)}, "k2")
    sizes = fetched(monkeypatch)
    walked, whole = await both(capsys, monkeypatch, "diff", url, "big", "0", "1", "--keys", keys)
    assert walked == whole and walked[0] == 0 and "edited" in walked[1]
    for old, new in [(1, 2), (0, 2), (2, 0)]:
        argv = ("diff", url, "big", str(old), str(new), "--keys", keys, "--json")
        walked, whole = await both(capsys, monkeypatch, *argv)
        assert walked == whole and walked[0] == 0 and '"op": "added"' in walked[1]
    decoded: list[int] = []
    decode = CheckpointManager.decode_record

    async def counted(self: CheckpointManager, *args: Any, **kwargs: Any) -> Any:
        decoded.append(1)
        return await decode(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointManager, "decode_record", counted)
    sizes.clear()
    walked, whole = await both(capsys, monkeypatch, "diff", url, "big", "0", "1", "--keys", keys)
    assert walked == whole and len(decoded) == 2  # the walk decodes nothing whole
    assert sum(sizes) > 1_200_000, sum(sizes)  # the whole read: two states of ~640 KB
    sizes.clear()
    await run(capsys, "diff", url, "big", "0", "1", "--keys", keys)
    # The one-key edit reads ~40 KB; never more than one state's worth (the dict chunks
    # of one side read before the other side's index nodes show they are shared).
    assert 0 < sum(sizes) < 700_000, sum(sizes)
    for extra in ([], ["--keys", other]):
        walked, whole = await both(capsys, monkeypatch, "diff", url, "big", "0", "1", *extra)
        assert walked == whole and walked[0] != 0 and "edited" not in walked[1]


async def test_diff_errors_are_the_whole_reads(
    new_store: NewStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that is not there, and a chunk that differs and no longer matches its hash:
    the walk gives way to the whole read, which prints and exits as it always did."""
    url = new_store("sqlite")
    await history(url)
    walked, whole = await both(capsys, monkeypatch, "diff", url, "big", "1", "99")
    assert walked == whole and walked[0] == 3
    storage = SQLiteCheckpointStorage(url.removeprefix("sqlite://"))
    with sqlite3.connect(storage.path) as con:
        for name, blob in con.execute("SELECT hash, data FROM blobs").fetchall():
            if b'"edited"' in blob:  # the chunk holding step 1's k01000
                damaged = blob.replace(b'"edited"', b'"editex"', 1)
                con.execute("UPDATE blobs SET data = ? WHERE hash = ?", (damaged, name))
    walked, whole = await both(capsys, monkeypatch, "diff", url, "big", "0", "1")
    assert walked == whole and walked[0] != 0 and "corrupted" in walked[2]
    assert "editex" not in walked[1]
