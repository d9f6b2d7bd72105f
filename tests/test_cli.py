"""The ``aiocheckpoint`` command, run as a real subprocess against real stores.

Every store is real: a directory of the file backend, a SQLite database file and a fresh
schema in the PostgreSQL server (nothing skips: the server must be up).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path

import pytest

from aiocheckpoint import SharedState
from aiocheckpoint.cli.store import open_store
from tests import cli_runner
from tests.pg_support import DSN, drop_schema, new_schema_name

SRC = Path(__file__).resolve().parent.parent / "src"
BACKENDS = ["file", "sqlite", "postgres"]
ODD = "beta/\u03b3 'quoted' ../x"  # ids are arbitrary text: slashes, quotes, unicode, dots

SGR = re.compile(r"\x1b\[[0-9;]*m")  # a colour escape
NewStore = Callable[[str], str]


def cli(*args: str, stdin: int | None = subprocess.DEVNULL, **kwargs: object) -> Result:
    """Run ``python -m aiocheckpoint ARGS`` with this worktree's code (a process forked from a
    warmed-up interpreter, or a fresh one: tests/cli_runner.py)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "AIOCHECKPOINT_DEBUG")}
    env["PYTHONPATH"] = str(SRC)
    proc = cli_runner.run(args, stdin=stdin, timeout=120, env=env, **kwargs)
    return Result(proc.returncode, proc.stdout, proc.stderr)


class Result:
    """A finished command: exit status, stdout, stderr."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> object:
        return json.loads(self.out)

    def error_line(self) -> str:
        """The single error line (failing commands print exactly one, never a traceback)."""
        assert self.code != 0, self.out
        assert "Traceback" not in self.err, self.err
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        assert lines[0].startswith("aiocheckpoint"), lines[0]
        return lines[0]


@pytest.fixture
async def new_store(tmp_path: Path) -> AsyncIterator[NewStore]:
    """Make URLs of fresh, empty stores of a backend; PostgreSQL schemas are dropped after."""
    schemas: list[str] = []

    def make(kind: str) -> str:
        n = len(list(tmp_path.iterdir()))
        if kind == "file":
            return f"file:{tmp_path}/files{n}"
        if kind == "sqlite":
            return f"sqlite://{tmp_path}/db{n}.sqlite"
        schemas.append(new_schema_name())
        return f"{DSN}?schema={schemas[-1]}"

    yield make
    for schema in schemas:
        await drop_schema(schema)


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, new_store: NewStore) -> str:
    """A populated store of each backend (see ``populate``)."""
    url = new_store(request.param)
    await populate(url)
    return url


async def populate(url: str) -> None:
    """Workflow "alpha" has steps 0..11 and an evolving state; ODD has steps 0..2."""
    async with open_store(url, must_exist=False) as manager:
        state = SharedState({"plan": {"items": ["a", "b"]}, "count": 0, "notes": "draft"})
        for step in range(12):
            state.set("count", step)
            if step == 3:
                state.set("plan.items", ["a", "c", "d"])
            if step == 4:
                state.delete("notes")
                state.set("result", {"ok": True})
            status = "running" if step % 4 == 0 else "completed"
            await manager.create_checkpoint("alpha", step, f"agent-{step % 3}", status, state)
        for step in range(3):
            status = "failed" if step == 2 else "completed"
            await manager.create_checkpoint(ODD, step, "worker", status, {"x": step})


async def raw(url: str) -> dict[tuple[str, int], bytes]:
    """Every record of a store, as stored."""
    async with open_store(url, must_exist=True) as manager:
        return {
            (wf, r.step): r.data
            for wf in await manager.list_workflows()
            for r in await manager.storage.scan(wf)
        }


async def save_raw(url: str, workflow_id: str, step: int, data: bytes) -> None:
    """Store bytes as they are, bypassing the manager (how corruption is simulated)."""
    async with open_store(url, must_exist=True) as manager:
        await manager.storage.save(workflow_id, step, data)


def flip_on_disk(base: Path, name: str) -> None:
    """Flip a bit in the first checkpoint file called ``name`` under a file store."""
    victim = sorted(base.glob(f"workflows/*/{name}"))[0]
    victim.write_bytes(flipped(victim.read_bytes()))


def flipped(data: bytes) -> bytes:
    """``data`` with one bit of its last byte flipped."""
    return data[:-1] + bytes([data[-1] ^ 1])


# --- inspecting ----------------------------------------------------------------------------


async def test_workflows_lists_every_workflow(store: str) -> None:
    """`workflows` shows each workflow's step count, latest step and status, in text and JSON."""
    text = cli("workflows", store)
    assert text.code == 0, text.err
    rows = [line.split() for line in text.out.splitlines()]
    assert rows[0][:4] == ["WORKFLOW", "STEPS", "LATEST", "STATUS"]
    assert rows[1][:4] == ["alpha", "12", "11", "completed"]
    data = cli("workflows", store, "--json").json()
    assert isinstance(data, dict)
    by_id = {w["workflow_id"]: w for w in data["workflows"]}
    assert by_id["alpha"]["steps"] == 12
    odd = by_id[ODD]
    assert datetime.fromisoformat(odd.pop("last_write")).tzinfo is not None
    keeps_records = not store.startswith("file:")  # SQLite and PostgreSQL keep records
    assert odd == {
        "workflow_id": ODD,
        "steps": 3,
        "latest_step": 2,
        "latest_status": "failed",
        "workflow_status": "unfinished" if keeps_records else None,
        "kind": "workflow" if keeps_records else None,
        "finished": False if keeps_records else None,
    }


async def test_workflows_unfinished_needs_workflow_records(store: str) -> None:
    """`--unfinished` fails with one clear line on a backend without workflow records, and
    lists the unfinished workflows on one with them."""
    result = cli("workflows", store, "--unfinished", "--json")
    if store.startswith("file:"):
        assert result.code == 2
        assert "needs workflow records" in result.error_line()
        return
    assert result.code == 0, result.err
    data = result.json()
    assert isinstance(data, dict)
    assert sorted(w["workflow_id"] for w in data["workflows"]) == sorted(["alpha", ODD])


async def test_history_pages_newest_first(store: str) -> None:
    """`history` lists N checkpoints newest first and hints at the next page until the end."""
    first = cli("history", store, "alpha", "--limit", "5")
    assert first.code == 0, first.err
    steps = [int(line.split()[0]) for line in first.out.splitlines()[1:]]
    assert steps == [11, 10, 9, 8, 7]
    assert "--limit 5 --before 7" in first.err
    page = cli("history", store, "alpha", "--limit", "5", "--before", "7", "--json").json()
    assert isinstance(page, dict)
    assert [c["step"] for c in page["checkpoints"]] == [6, 5, 4, 3, 2]
    assert page["next_before"] == 2
    assert page["checkpoints"][0]["agent_id"] == "agent-0"
    assert page["checkpoints"][0]["size"] > 20
    last = cli("history", store, "alpha", "--limit", "5", "--before", "2", "--json").json()
    assert isinstance(last, dict)
    assert [c["step"] for c in last["checkpoints"]] == [1, 0]
    assert last["next_before"] is None


async def test_show_prints_one_checkpoint(store: str) -> None:
    """`show` prints the latest (or a given) checkpoint's state; --json gives it whole."""
    text = cli("show", store, "alpha", "3")
    assert text.code == 0, text.err
    assert "agent-0" in text.out
    assert '"c",' in text.out  # the state, pretty-printed
    latest = cli("show", store, ODD, "--json").json()
    assert isinstance(latest, dict)
    assert latest["step"] == 2
    assert latest["status"] == "failed"
    assert latest["state"]["data"] == {"x": 2}
    assert latest["size"] == len((await raw(store))[(ODD, 2)])


async def test_diff_lists_changes_path_by_path(store: str) -> None:
    """`diff` reports added, removed and changed values with dot paths and [i] indexes."""
    data = cli("diff", store, "alpha", "2", "5", "--json").json()
    assert isinstance(data, dict)
    assert data["changes"] == [
        {"op": "changed", "path": "plan.items[1]", "keys": ["plan", "items", 1], "old": "b",
         "new": "c"},
        {"op": "added", "path": "plan.items[2]", "keys": ["plan", "items", 2], "new": "d"},
        {"op": "changed", "path": "count", "keys": ["count"], "old": 2, "new": 5},
        {"op": "removed", "path": "notes", "keys": ["notes"], "old": "draft"},
        {"op": "added", "path": "result", "keys": ["result"], "new": {"ok": True}},
    ]  # fmt: skip
    text = cli("diff", store, "alpha", "2", "5")
    assert text.code == 0, text.err
    assert text.out.splitlines() == [
        '~ plan.items[1]: "b" -> "c"',
        '+ plan.items[2]: "d"',
        "~ count: 2 -> 5",
        '- notes: "draft"',
        '+ result: {"ok": true}',
    ]
    same = cli("diff", store, "alpha", "7", "7")
    assert same.code == 0
    assert "no changes" in same.out


# --- verifying and maintaining -------------------------------------------------------------


async def test_verify_finds_corrupted_records(store: str) -> None:
    """`verify` exits 0 on a sound store, and 1 listing each corrupted record otherwise."""
    clean = cli("verify", store, "--json")
    assert clean.code == 0, clean.err
    assert clean.json() == {"ok": True, "workflows": 2, "checkpoints": 15, "corrupted": []}
    records = await raw(store)
    await save_raw(store, "alpha", 5, flipped(records[("alpha", 5)]))
    await save_raw(store, ODD, 1, b"not a record at all")
    await save_raw(store, ODD, 2, records[("alpha", 2)])  # a valid record, wrong place
    bad = cli("verify", store, "--json")
    assert bad.code == 1
    report = bad.json()
    assert isinstance(report, dict)
    assert report["checkpoints"] == 15
    assert [(c["workflow_id"], c["step"]) for c in report["corrupted"]] == [
        ("alpha", 5),
        (ODD, 1),
        (ODD, 2),
    ]
    assert "checksum" in report["corrupted"][0]["reason"]
    text = cli("verify", store)
    assert text.code == 1
    assert "3 corrupted" in text.out
    shown = cli("show", store, "alpha", "5")
    assert shown.code == 4
    assert "corrupted" in shown.error_line()
    history = cli("history", store, "alpha", "--json", "--limit", "100").json()
    assert isinstance(history, dict)
    assert {c["step"]: c["status"] for c in history["checkpoints"]}[5] == "corrupted"


async def test_prune_keeps_the_newest(store: str) -> None:
    """`prune --keep N` deletes all but the newest N checkpoints of every workflow."""
    dry = cli("prune", store, "--keep", "4", "--dry-run", "--json").json()
    assert isinstance(dry, dict)
    assert dry["deleted"] == 8
    assert len(await raw(store)) == 15
    one = cli("prune", store, "alpha", "--keep", "10")
    assert one.code == 0, one.err
    assert sorted(s for wf, s in await raw(store) if wf == "alpha") == list(range(2, 12))
    every = cli("prune", store, "--keep", "2", "--json").json()
    assert isinstance(every, dict)
    assert every["deleted"] == 8 + 1
    assert sorted(await raw(store)) == [("alpha", 10), ("alpha", 11), (ODD, 1), (ODD, 2)]


async def test_rm_deletes_a_step_or_a_workflow(store: str) -> None:
    """`rm` deletes one step; with --yes a whole workflow; missing ones exit 3."""
    assert cli("rm", store, "alpha", "3").code == 0
    assert ("alpha", 3) not in await raw(store)
    assert cli("rm", store, "alpha", "3").code == 3
    gone = cli("rm", store, ODD, "--yes", "--json")
    assert gone.code == 0, gone.err
    assert gone.json() == {"deleted": True, "workflow_id": ODD, "step": None}
    remaining = await raw(store)
    assert all(wf == "alpha" for wf, _ in remaining)
    assert len(remaining) == 11


async def test_fork_makes_a_workflow_from_a_history(store: str) -> None:
    """`fork` copies the history up to a step under a new id; bad requests change nothing."""
    done = cli("fork", store, "alpha", "5", "alpha-what-if")
    assert done.code == 0, done.err
    assert "6 checkpoints" in done.out
    stored = await raw(store)
    assert sorted(s for wf, s in stored if wf == "alpha-what-if") == list(range(6))
    async with open_store(store, must_exist=True) as manager:
        point = await manager.get_resume_point("alpha-what-if")
        assert point is not None and point[0] == 6
    assert "already exists" in cli("fork", store, "alpha", "5", ODD).error_line()
    assert cli("fork", store, "alpha", "5", ODD).code == 2
    assert cli("fork", store, "alpha", "99", "other").code == 3
    assert cli("fork", store, "nope", "0", "other").code == 3
    assert await raw(store) == stored


async def test_rm_refuses_without_a_terminal(new_store: NewStore) -> None:
    """Without --yes and with no terminal to ask on, `rm` refuses and deletes nothing."""
    url = new_store("file")
    await populate(url)
    result = cli("rm", url, "alpha")
    assert result.code == 2
    assert "--yes" in result.error_line()
    assert len(await raw(url)) == 15


async def test_rm_asks_on_a_terminal(new_store: NewStore) -> None:
    """On a terminal `rm` asks y/N: "n" keeps the workflow, "y" deletes it."""
    url = new_store("sqlite")
    await populate(url)
    for answer, code, left in (("n", 1, 15), ("y", 0, 3)):
        master, slave = pty.openpty()
        try:
            os.write(master, f"{answer}\n".encode())
            result = cli("rm", url, "alpha", stdin=slave)
        finally:
            os.close(slave)
            os.close(master)
        assert result.code == code, result.err
        assert "[y/N]" in result.err
        assert len(await raw(url)) == left


# --- copy, export, import ------------------------------------------------------------------

PAIRS = [("file", "sqlite"), ("sqlite", "postgres"), ("postgres", "file")]


@pytest.mark.parametrize(("src_kind", "dst_kind"), PAIRS)
async def test_copy_moves_every_record_byte_for_byte(
    new_store: NewStore, src_kind: str, dst_kind: str
) -> None:
    """`copy` reproduces every record at the destination, byte for byte, and verifies it."""
    src, dst = new_store(src_kind), new_store(dst_kind)
    await populate(src)
    result = cli("copy", src, dst, "--json")
    assert result.code == 0, result.err
    report = result.json()
    assert isinstance(report, dict)
    assert (report["written"], report["skipped"], report["verified"]) == (15, 0, 15)
    assert await raw(dst) == await raw(src)
    assert cli("verify", dst).code == 0


async def test_copy_resumes_where_it_stopped(new_store: NewStore) -> None:
    """A second `copy` skips records already there and writes only the missing ones."""
    src, dst = new_store("sqlite"), new_store("file")
    await populate(src)
    assert cli("copy", src, dst).code == 0
    async with open_store(dst, must_exist=True) as manager:
        for step in (0, 5, 11):
            await manager.delete_checkpoints("alpha", step)
    again = cli("copy", src, dst, "--json").json()
    assert isinstance(again, dict)
    assert (again["written"], again["skipped"], again["verified"]) == (3, 12, 15)
    assert await raw(dst) == await raw(src)


async def test_copy_reports_conflicts_and_corruption(new_store: NewStore) -> None:
    """Differing records at the destination are kept (exit 1) unless --overwrite; corrupted
    source records are never copied."""
    src, dst = new_store("file"), new_store("sqlite")
    await populate(src)
    assert cli("copy", src, dst).code == 0
    records = await raw(src)
    await save_raw(src, "alpha", 7, flipped(records[("alpha", 7)]))
    async with open_store(dst, must_exist=True) as manager:
        await manager.create_checkpoint("alpha", 4, "other", "completed", {"different": True})
        await manager.delete_checkpoints("alpha", 7)
    before = await raw(dst)
    result = cli("copy", src, dst)
    assert result.code == 1
    assert "alpha step 4" in result.out and "alpha step 7" in result.out
    assert await raw(dst) == before
    forced = cli("copy", src, dst, "--overwrite", "--json").json()
    assert isinstance(forced, dict)
    assert forced["written"] == 1
    assert [(c["workflow_id"], c["step"]) for c in forced["corrupted"]] == [("alpha", 7)]
    after = await raw(dst)
    assert after[("alpha", 4)] == records[("alpha", 4)]
    assert ("alpha", 7) not in after


async def test_copy_refuses_to_copy_a_store_onto_itself(new_store: NewStore) -> None:
    """Copying a store onto itself is refused with one line."""
    url = new_store("file")
    await populate(url)
    assert "same store" in cli("copy", url, url).error_line()


@pytest.mark.parametrize(("src_kind", "dst_kind"), [("file", "postgres"), ("postgres", "sqlite")])
async def test_export_then_import_round_trips(
    new_store: NewStore, tmp_path: Path, src_kind: str, dst_kind: str
) -> None:
    """`export` writes the documented JSON lines and `import` restores them byte for byte."""
    src, dst = new_store(src_kind), new_store(dst_kind)
    await populate(src)
    path = tmp_path / "backup.jsonl"
    assert cli("export", src, str(path)).code == 0
    lines = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    assert lines[0]["format"] == "aiocheckpoint-export"
    assert lines[0]["version"] == 3
    assert lines[-1] == {"type": "end", "checkpoints": 15, "effects": 0, "workflows": 2}
    first = lines[1]
    assert set(first) == {"type", "workflow_id", "step", "record"}
    assert base64.b64decode(first["record"]) == (await raw(src))[(first["workflow_id"], 0)]
    result = cli("import", str(path), dst, "--json")
    assert result.code == 0, result.err
    assert await raw(dst) == await raw(src)
    again = cli("import", str(path), dst, "--json").json()
    assert isinstance(again, dict)
    assert (again["written"], again["skipped"]) == (0, 15)


async def test_import_verifies_each_record(new_store: NewStore, tmp_path: Path) -> None:
    """A tampered record, a malformed line and a missing end line are reported (exit 1);
    every sound record is still imported."""
    src, dst = new_store("sqlite"), new_store("file")
    await populate(src)
    path = tmp_path / "backup.jsonl"
    assert cli("export", src, str(path)).code == 0
    lines = path.read_text("utf-8").splitlines()
    entry = json.loads(lines[3])
    entry["record"] = base64.b64encode(flipped(base64.b64decode(entry["record"]))).decode()
    lines[3] = json.dumps(entry)
    lines[4] = "{not json"
    path.write_text("\n".join(lines[:-1]) + "\n", "utf-8")  # and drop the end line
    result = cli("import", str(path), dst, "--json")
    assert result.code == 1
    report = result.json()
    assert isinstance(report, dict)
    reasons = [c["reason"] for c in report["corrupted"]]
    assert reasons[0] == "checksum mismatch"
    assert reasons[1] == "not a JSON line"
    assert "truncated" in reasons[2]
    assert report["written"] == 13
    assert len(await raw(dst)) == 13


async def test_import_refuses_a_file_that_is_not_an_export(
    new_store: NewStore, tmp_path: Path
) -> None:
    """A file without the export header is refused with one line, and creates no store."""
    path = tmp_path / "other.jsonl"
    path.write_text('{"hello": 1}\n', "utf-8")
    dst = new_store("sqlite")
    result = cli("import", str(path), dst)
    assert result.code == 4
    assert "not an aiocheckpoint export" in result.error_line()
    assert "missing.jsonl" in cli("import", str(tmp_path / "missing.jsonl"), dst).error_line()


# --- errors --------------------------------------------------------------------------------


async def test_missing_workflow_and_step_exit_3(store: str) -> None:
    """Asking for a workflow or step that is not there is one line and exit status 3."""
    assert "'nope'" in cli("show", store, "nope").error_line()
    assert cli("show", store, "nope").code == 3
    assert "step 99" in cli("show", store, "alpha", "99").error_line()
    assert cli("history", store, "nope").code == 3
    assert cli("diff", store, "alpha", "1", "99").code == 3
    assert cli("prune", store, "nope", "--keep", "1").code == 3


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_missing_store_is_reported_not_created(tmp_path: Path, kind: str) -> None:
    """Read-only commands on a file/SQLite store that does not exist say so and create
    nothing."""
    target = tmp_path / "absent"
    for args in (["workflows"], ["verify"], ["history", "alpha"], ["export"]):
        extra = [str(tmp_path / "out.jsonl")] if args == ["export"] else []
        result = cli(args[0], f"{kind}:{target}", *args[1:], *extra)
        assert result.code == 3
        assert str(target) in result.error_line()
    assert not target.exists()
    assert not (tmp_path / "out.jsonl").exists()


def test_bad_urls_and_arguments_are_one_line(tmp_path: Path) -> None:
    """A bad URL names the accepted forms; bad arguments name the problem; exit status 2."""
    bad = cli("workflows", "ftp://example.com/x")
    assert bad.code == 2
    assert "accepted forms" in bad.error_line()
    for args in (
        ["history"],
        ["history", "memory://", "wf", "--limit", "0"],
        ["show", "memory://", "wf", "minus-one"],
        ["prune", "memory://"],
        ["frobnicate"],
    ):
        result = cli(*args)
        assert result.code == 2, args
        result.error_line()
    assert "workflow id" in cli("show", "memory://", "").error_line()


def test_a_file_that_is_not_a_database_is_one_line(tmp_path: Path) -> None:
    """A SQLite URL naming a file that is not a database fails with one line, exit 4."""
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a database" * 100)
    result = cli("workflows", f"sqlite:{path}")
    assert result.code == 4
    result.error_line()
    assert path.read_bytes() == b"this is not a database" * 100


async def test_on_disk_bit_flip_is_found(new_store: NewStore) -> None:
    """A bit flipped in a file store's checkpoint file on disk is found by `verify`."""
    url = new_store("file")
    await populate(url)
    flip_on_disk(Path(url.removeprefix("file:")), "00000000000000000006.ckpt")
    result = cli("verify", url)
    assert result.code == 1
    assert "1 corrupted" in result.out


# --- terminal behaviour --------------------------------------------------------------------


def _on_terminal(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run with stdout and stderr on a pseudo-terminal; return the exit status and output."""
    master, slave = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    environ.update(PYTHONPATH=str(SRC), COLUMNS="200", **(env or {}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiocheckpoint", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=environ,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=120), b"".join(chunks).decode("utf-8", "replace")


async def test_colours_only_on_a_terminal_without_no_color(new_store: NewStore) -> None:
    """Colours appear on a terminal, never when piped or when NO_COLOR is set."""
    url = new_store("sqlite")
    await populate(url)
    code, shown = _on_terminal("workflows", url)
    assert code == 0
    assert SGR.search(shown)
    code, plain = _on_terminal("workflows", url, env={"NO_COLOR": "1"})
    assert code == 0
    assert not SGR.search(plain)
    assert "alpha" in plain
    piped = cli("workflows", url)
    assert "\x1b" not in piped.out + piped.err


async def test_progress_only_on_a_terminal(new_store: NewStore) -> None:
    """`verify` draws its progress line on a terminal's stderr, and nothing when piped."""
    url = new_store("file")
    await populate(url)
    code, shown = _on_terminal("verify", url)
    assert code == 0
    assert "\r\x1b[Kverify: [" in shown
    piped = cli("verify", url)
    assert piped.err == ""
    assert "\r" not in piped.out


@pytest.mark.parametrize(
    "args",
    [
        ["workflows", "{url}"],
        ["history", "{url}", "alpha"],
        ["show", "{url}", "alpha", "1"],
        ["diff", "{url}", "alpha", "1", "2"],
        ["verify", "{url}"],
        ["prune", "{url}", "--keep", "20"],
        ["rm", "{url}", "alpha", "0"],
        ["fork", "{url}", "alpha", "3", "alpha-2"],
        ["copy", "{url}", "{url2}"],
        ["export", "{url}", "{file}"],
        ["import", "{file0}", "{url2}"],
    ],
    ids=lambda a: a[0],
)
async def test_every_command_has_json(new_store: NewStore, tmp_path: Path, args: list[str]) -> None:
    """Every command prints one JSON document on stdout with --json."""
    url, url2 = new_store("file"), new_store("sqlite")
    await populate(url)
    file0 = tmp_path / "in.jsonl"
    if "{file0}" in args:
        assert cli("export", url, str(file0)).code == 0
    values = {"url": url, "url2": url2, "file": str(tmp_path / "out.jsonl"), "file0": str(file0)}
    result = cli(*[a.format(**values) for a in args], "--json")
    assert result.code == 0, result.err
    assert isinstance(result.json(), dict)


async def test_copy_killed_midway_resumes(new_store: NewStore) -> None:
    """A `copy` killed with SIGKILL mid-way leaves only whole records; running it again
    skips exactly those and completes the copy."""
    src, dst = new_store("sqlite"), new_store("file")
    async with open_store(src, must_exist=False) as manager:
        await asyncio.gather(
            *(
                manager.create_checkpoint(f"wf-{i % 3}", i, "a", "completed", {"i": i})
                for i in range(600)
            )
        )
    base = Path(dst.removeprefix("file:"))
    kill_copy_midway(src, dst, base)
    landed = count_files(base)
    again = cli("copy", src, dst, "--json")
    assert again.code == 0, again.err
    report = again.json()
    assert isinstance(report, dict)
    assert (report["skipped"], report["written"]) == (landed, 600 - landed)
    assert report["verified"] == 600
    assert await raw(dst) == await raw(src)


def count_files(base: Path) -> int:
    """How many checkpoint files a file store holds (temporary files are not counted)."""
    return len(list(base.glob("workflows/*/*.ckpt")))


def kill_copy_midway(src: str, dst: str, base: Path) -> None:
    """Start `copy SRC DST` and SIGKILL it once 50 records have landed (or it ended)."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiocheckpoint", "copy", src, dst],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        while proc.poll() is None and count_files(base) < 50:
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)


async def test_export_to_stdout_and_import_from_stdin(new_store: NewStore) -> None:
    """`export URL -` streams the file to stdout and `import - URL` reads it from stdin."""
    src, dst = new_store("sqlite"), new_store("file")
    await populate(src)
    exported = cli("export", src, "-")
    assert exported.code == 0, exported.err
    assert "exported 15 checkpoints" in exported.err
    imported = cli("import", "-", dst, stdin=None, input=exported.out)
    assert imported.code == 0, imported.err
    assert await raw(dst) == await raw(src)


async def test_commands_read_and_copy_incremental_checkpoints(tmp_path: Path) -> None:
    """verify, show and copy handle a file store whose large states are stored as blobs."""
    from aiocheckpoint import CheckpointManager, FileCheckpointStorage, open_storage

    src = tmp_path / "src"
    big = {"docs": [{"id": i, "text": f"document {i} " * 20} for i in range(400)]}
    async with CheckpointManager(FileCheckpointStorage(src)) as manager:
        assert manager.incremental
        for step in range(3):
            await manager.create_checkpoint("big", step, "a", "completed", {**big, "n": step})
    assert any((src / "blobs").rglob("*")), "the state was not stored as blobs"
    verify = cli("--json", "verify", f"file:{src}")
    assert verify.code == 0, verify.err
    shown = cli("--json", "show", f"file:{src}", "big", "1")
    assert shown.code == 0, shown.err
    assert json.dumps(shown.json()).count("document 399") >= 1
    dst = tmp_path / "copy.db"
    copied = cli("copy", f"file:{src}", f"sqlite:{dst}")
    assert copied.code == 0, copied.err
    async with CheckpointManager(open_storage(f"sqlite:{dst}")) as manager:
        got = await manager.get_checkpoint("big", 2)
        assert got.state_snapshot.data == {**big, "n": 2}


async def test_a_closed_pipe_ends_the_command_quietly(new_store: NewStore) -> None:
    """`aiocheckpoint workflows URL | head -2`: when the reader closes the pipe early the
    command stops with status 141 and prints nothing on stderr (no BrokenPipeError)."""
    url = new_store("sqlite")
    async with open_store(url, must_exist=False) as manager:
        for i in range(300):  # ~80 KB of table: more than a pipe buffers, so a write must fail
            await manager.create_checkpoint(f"wf-{i:03d}-" + "x" * 240, 0, "a", "completed", {})
    code, head, err = read_two_lines_then_close("workflows", url)
    assert code == 141
    assert head[0].startswith(b"WORKFLOW") and head[1].startswith(b"wf-000-")
    assert err == b""


def read_two_lines_then_close(*args: str) -> tuple[int, list[bytes], bytes]:
    """Run the command with stdout a pipe, read two lines, close the pipe (as `| head -2`
    does); return the exit status, the two lines and everything written on stderr."""
    env = {k: v for k, v in os.environ.items() if k != "AIOCHECKPOINT_DEBUG"}
    env["PYTHONPATH"] = str(SRC)
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiocheckpoint", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    head = [proc.stdout.readline() for _ in range(2)]
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(timeout=120), head, err
