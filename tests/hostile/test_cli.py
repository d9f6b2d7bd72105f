"""The ``aiocheckpoint`` command facing hostile input (issue #22, the CLI items).

Stores crafted by hand (records written byte by byte, SQLite rows edited with the sqlite3
module), export files with hostile lines, URLs holding passwords, exports killed with
SIGKILL. Every command runs as a real subprocess, except the unit tests of the helpers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sqlite3
import stat
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from aiocheckpoint.cli.output import MAX_INT_DIGITS, int_text
from aiocheckpoint.cli.redact import redact, redact_url
from aiocheckpoint.cli.store import open_store
from aiocheckpoint.format import MAX_INT_DIGITS as STORE_INT_DIGITS
from tests.pg_support import DSN, drop_schema, new_schema_name
from tests.test_cli import SRC, Result, cli

SECRET = "S3cret-pw"


def v1_record(body: bytes) -> bytes:
    """A version-1 record around ``body``: magic, version, reserved, length, CRC-32."""
    return struct.pack(">4sBBHQI", b"ACKP", 1, 0, 0, len(body), zlib.crc32(body)) + body


async def record_of(url: str, workflow_id: str, step: int, state: dict[str, object]) -> bytes:
    """The bytes the manager stores for a checkpoint of ``state``."""
    async with open_store(url, must_exist=False) as manager:
        await manager.create_checkpoint(workflow_id, step, "a", "completed", state)
        stored = await manager.storage.load(workflow_id, step)
    assert stored is not None
    return stored.data


# --- 3: ints of a hundred thousand digits ----------------------------------------------------


@pytest.mark.slow
async def test_an_int_of_as_many_digits_as_a_store_keeps_is_decoded_and_printed_shortened(
    tmp_path: Path,
) -> None:
    """A record holding a 100,000-digit int (the store limit, STORE_INT_DIGITS): `verify`
    decodes it with the library's own parser (Python's digit limit stays on) and
    `show`/`diff` print it shortened, first and last digits and the digit count, instead of
    spending seconds converting it.

    100,000 digits is 23 times Python's 4,300-digit limit, 10 times the CLI's
    MAX_INT_DIGITS and far past BIG_INT_BITS and decimal_to_int's 4,000-digit split; a
    full conversion would print every digit and fail the assertions on the output."""
    url = f"sqlite:{tmp_path}/big.db"
    await record_of(url, "w", 0, {"n": 7})
    small = await record_of(url, "w", 1, {"n": 7})
    assert small[4] == 1  # a version-1 record: header then the JSON body
    digits = b"9" + b"0" * (STORE_INT_DIGITS - 2) + b"7"
    body = small[20:].replace(b'{"n":7}', b'{"n":' + digits + b"}")
    assert len(body) > STORE_INT_DIGITS
    async with open_store(url, must_exist=True) as manager:
        await manager.storage.save("w", 1, v1_record(body))
    shortened = "9" + "0" * 19 + "…" + "0" * 19 + "7 (100000 digits)"

    verify = cli("--json", "verify", url)
    assert verify.code == 0, verify.err
    assert verify.json() == {"ok": True, "workflows": 1, "checkpoints": 2, "corrupted": []}
    shown = cli("--json", "show", url, "w")
    assert shown.code == 0, shown.err
    assert shown.json()["state"]["data"] == {"n": shortened}  # type: ignore[index]
    text = cli("show", url, "w")
    assert text.code == 0, text.err
    assert f'"n": {shortened}' in text.out
    assert len(text.out) < 5_000
    diff = cli("diff", url, "w", "0", "1")
    assert diff.code == 0, diff.err
    assert diff.out.startswith("~ n: 7 -> 90000000000000000000…")


def python_digits(n: int) -> str:
    """``str(n)`` computed by Python itself, its digit limit lifted for the call."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return str(n)
    finally:
        sys.set_int_max_str_digits(limit)


def test_ints_print_whole_up_to_the_limit_then_shortened() -> None:
    """Up to MAX_INT_DIGITS digits an int prints whole (beyond Python's 4300-digit limit);
    past it, first and last 20 digits and the count; the sign is kept."""
    whole = 10 ** (MAX_INT_DIGITS - 1) + 3
    assert int_text(whole) == "1" + "0" * (MAX_INT_DIGITS - 2) + "3"
    assert int_text(-whole).startswith("-1000")
    longer = 10**MAX_INT_DIGITS + 3
    assert int_text(longer) == f"1{'0' * 19}…{'0' * 19}3 ({MAX_INT_DIGITS + 1} digits)"
    digits = python_digits(2**70_000)
    assert int_text(-(2**70_000)) == f"-{digits[:20]}…{digits[-20:]} ({len(digits)} digits)"
    assert int_text(12) == "12"


# --- 15, 16: hostile export files ------------------------------------------------------------


def export_file(path: Path, lines: list[bytes | str | dict[str, object]]) -> Path:
    """Write an export: the header, ``lines`` (JSON objects or raw text), no end line."""
    header = {"format": "aiocheckpoint-export", "version": 1, "record_format": 1}
    out = [json.dumps(header).encode()]
    for line in lines:
        if isinstance(line, dict):
            out.append(json.dumps(line).encode())
        else:
            out.append(line.encode() if isinstance(line, str) else line)
    path.write_bytes(b"\n".join(out) + b"\n")
    return path


def checkpoint_line(workflow_id: str, step: int, record: bytes) -> dict[str, object]:
    """An export's checkpoint line."""
    rec = base64.b64encode(record).decode()
    return {"type": "checkpoint", "workflow_id": workflow_id, "step": step, "record": rec}


def end_line(checkpoints: int, workflows: int = 1) -> dict[str, object]:
    """An export's end line."""
    return {"type": "end", "checkpoints": checkpoints, "workflows": workflows}


@pytest.mark.parametrize("opening", ["[", '{"a":'], ids=["lists", "objects"])
def test_import_refuses_a_deeply_nested_header(tmp_path: Path, opening: str) -> None:
    """A header line of 100,000 nested lists or objects is "not an export" (status 4, one
    line), not a RecursionError traceback."""
    path = tmp_path / "deep.jsonl"
    path.write_text(opening * 100_000 + "\n", "utf-8")
    result = cli("import", str(path), f"sqlite:{tmp_path}/dst.db")
    assert result.code == 4
    assert "is not an aiocheckpoint export" in result.error_line()


async def test_import_reports_deeply_nested_lines_and_imports_the_rest(tmp_path: Path) -> None:
    """Deeply nested body lines are reported as malformed lines (status 1); every sound
    record around them is imported."""
    record = await record_of("memory://", "w", 0, {"x": 1})
    path = export_file(
        tmp_path / "deep.jsonl",
        ["[" * 100_000, '{"a":' * 100_000, checkpoint_line("w", 0, record), end_line(1)],
    )
    dst = f"sqlite:{tmp_path}/dst.db"
    result = cli("--json", "import", str(path), dst)
    assert result.code == 1, result.err
    report = result.json()
    assert isinstance(report, dict)
    assert [(c["line"], "nested too deeply" in c["reason"]) for c in report["corrupted"]] == [
        (2, True),
        (3, True),
    ]
    assert report["written"] == 1
    async with open_store(dst, must_exist=True) as manager:
        assert (await manager.get_checkpoint("w", 0)).state_snapshot.data == {"x": 1}


@pytest.mark.parametrize("between", [0, 120], ids=["same-page", "next-page"])
async def test_two_records_for_one_step_in_a_file_are_a_conflict(
    tmp_path: Path, between: int
) -> None:
    """An export holding two different records for the same workflow and step is a conflict
    (status 1) whether they land in one page or two; the first is kept."""
    first = await record_of("memory://", "w", 0, {"v": "first"})
    second = await record_of("memory://", "w", 0, {"v": "second"})
    fill = []
    async with open_store("memory://", must_exist=False) as manager:
        for step in range(1, between + 1):
            await manager.create_checkpoint("w", step, "a", "completed", {"s": step})
            stored = await manager.storage.load("w", step)
            assert stored is not None
            fill.append(checkpoint_line("w", step, stored.data))
    lines = [checkpoint_line("w", 0, first), *fill, checkpoint_line("w", 0, second)]
    path = export_file(tmp_path / "dup.jsonl", [*lines, end_line(len(lines))])
    dst = f"sqlite:{tmp_path}/dst.db"
    result = cli("--json", "import", str(path), dst)
    assert result.code == 1, result.err
    report = result.json()
    assert isinstance(report, dict)
    assert [(c["workflow_id"], c["step"]) for c in report["conflicts"]] == [("w", 0)]
    assert (report["ok"], report["written"]) == (False, 1 + between)
    async with open_store(dst, must_exist=True) as manager:
        stored = await manager.storage.load("w", 0)
    assert stored is not None and stored.data == first


async def test_the_same_record_twice_in_a_file_is_skipped(tmp_path: Path) -> None:
    """An exact duplicate line is not a conflict: it is skipped, as a record already at the
    destination with the same bytes is."""
    record = await record_of("memory://", "w", 0, {"v": 1})
    line = checkpoint_line("w", 0, record)
    path = export_file(tmp_path / "twice.jsonl", [line, line, end_line(2)])
    result = cli("--json", "import", str(path), f"sqlite:{tmp_path}/dst.db")
    assert result.code == 0, result.err
    report = result.json()
    assert isinstance(report, dict)
    assert (report["ok"], report["written"], report["skipped"]) == (True, 1, 1)


# --- 17: export files are private, and a killed export's temporary file goes away --------


def temporaries(directory: Path, name: str) -> list[Path]:
    """The temporary files of exports to ``directory/name``."""
    return sorted(directory.glob(f".{name}.tmp-*"))


def export_with_umask_022(src: str, target: Path) -> subprocess.Popen[bytes]:
    """Start `export SRC TARGET` under umask 022 (files would be 0644 by default)."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    script = 'umask 022; exec "$0" -m aiocheckpoint export "$1" "$2"'
    return subprocess.Popen(
        ["sh", "-c", script, sys.executable, src, str(target)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )


def kill_export_midway(src: str, target: Path) -> Path:
    """Start an export and SIGKILL it once its temporary file holds 1 MB; return that file."""
    proc = export_with_umask_022(src, target)
    try:
        while proc.poll() is None:
            found = temporaries(target.parent, target.name)
            if found and found[0].stat().st_size > 1_000_000:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the export ended before it could be killed"
    (left,) = temporaries(target.parent, target.name)
    return left


@pytest.mark.slow  # a kill loop or a decoding bomb: the slow tier
async def test_exports_are_private_and_killed_exports_are_cleaned(tmp_path: Path) -> None:
    """Under umask 022 an export is written 0600, its temporary file is 0600 from the start
    (one left by a SIGKILL is 0600), and the next export to the same file removes the
    temporaries of dead exports while keeping one whose process still runs."""
    src = f"sqlite:{tmp_path}/src.db"
    async with open_store(src, must_exist=False) as manager:
        for start in range(0, 8000, 500):
            await asyncio.gather(
                *(
                    manager.create_checkpoint("w", step, "a", "completed", {"t": "x" * 600})
                    for step in range(start, start + 500)
                )
            )
    target = tmp_path / "out" / "dump.jsonl"
    target.parent.mkdir()
    left = kill_export_midway(src, target)
    assert stat.S_IMODE(left.stat().st_mode) == 0o600
    alive = target.parent / f".dump.jsonl.tmp-{os.getpid()}"  # this test's process runs
    alive.write_bytes(b"")
    other = target.parent / ".other.jsonl.tmp-1"  # another export's file: not ours to touch
    other.write_bytes(b"")

    proc = export_with_umask_022(src, target)
    assert proc.wait(timeout=300) == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert temporaries(target.parent, target.name) == [alive]
    assert other.exists()
    lines = target.read_text("utf-8").splitlines()
    assert json.loads(lines[-1]) == {
        "type": "end",
        "checkpoints": 8000,
        "effects": 0,
        "workflows": 1,
    }


# --- 19: control and bidi characters from state values ------------------------------------

HOSTILE = "a\u009bb\u009dc\u202ed\x1b[31m\u2028e"
RAW = ("\u009b", "\u009d", "\u202e", "\x1b", "\u2028")


async def test_show_and_diff_escape_control_and_bidi_characters(tmp_path: Path) -> None:
    """C1 controls (U+009B, U+009D), bidi overrides (U+202E), ESC and line separators in
    state keys, values and metadata never reach the terminal raw: text output escapes them,
    JSON output uses JSON escapes and still parses to the exact values."""
    url = f"sqlite:{tmp_path}/s.db"
    await record_of(url, "w", 0, {"k": "plain"})
    state = {"k": HOSTILE, HOSTILE: [HOSTILE], "nested": {"v": HOSTILE}}
    async with open_store(url, must_exist=True) as manager:
        await manager.create_checkpoint("w", 1, "a", "completed", state, metadata={"m": HOSTILE})
    runs = {
        "show": cli("show", url, "w", "1"),
        "show --json": cli("--json", "show", url, "w", "1"),
        "diff": cli("diff", url, "w", "0", "1"),
        "diff --json": cli("--json", "diff", url, "w", "0", "1"),
    }
    for name, result in runs.items():
        assert result.code == 0, (name, result.err)
        assert not [c for c in RAW if c in result.out], name
    assert "\\x9b" in runs["show"].out and "\\u202e" in runs["show"].out
    assert "\\x9b" in runs["diff"].out
    shown = runs["show --json"].json()
    assert isinstance(shown, dict)
    assert (shown["state"]["data"], shown["metadata"]) == (state, {"m": HOSTILE})
    changes = runs["diff --json"].json()
    assert isinstance(changes, dict)
    assert {c["path"]: c["new"] for c in changes["changes"]}["k"] == HOSTILE


# --- 11: passwords in URLs --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "quoted"),
    [
        (f"postgress://app:{SECRET}@db.example/agents", True),
        (f"postgresql://app:{SECRET}@127.0.0.1:notaport/db", True),  # open_storage checks
        (f"postgress://db.example/agents?sslmode=require&password={SECRET}", True),
        (f"postgres-ql://app:{SECRET}/with/slash@127.0.0.1/db", True),
        (f"file://app:{SECRET}@host/x", True),
    ],
    ids=["scheme-typo", "bad-port", "query", "unencoded-slash", "file-host"],
)
def test_errors_never_print_a_password(url: str, quoted: bool) -> None:
    """A mistyped or malformed store URL fails with one error line (no traceback) that never
    holds the password; where the message quotes the URL, *** stands for it."""
    result = cli("workflows", url)
    line = result.error_line()
    assert SECRET not in result.err and SECRET not in result.out
    assert ("***" in line) is quoted, line


async def test_the_history_hint_never_prints_the_password() -> None:
    """The `more:` hint of `history` repeats the store URL without its password."""
    parts = urlsplit(DSN)
    netloc = f"{parts.username or 'postgres'}:{SECRET}@{parts.hostname}:{parts.port or 5432}"
    schema = new_schema_name()
    url = urlunsplit(parts._replace(netloc=netloc, query=f"schema={schema}"))
    try:
        async with open_store(url, must_exist=False) as manager:
            for step in range(5):
                await manager.create_checkpoint("w", step, "a", "completed", {})
        result = cli("history", url, "w", "--limit", "2")
    finally:
        await drop_schema(schema)
    assert result.code == 0, result.err
    (hint,) = [line for line in result.err.splitlines() if line.startswith("more: ")]
    assert SECRET not in hint
    assert f"{parts.username or 'postgres'}:***@" in hint


def test_redact_hides_passwords_and_doubtful_user_info() -> None:
    """redact_url (the library's urls.redacted) keeps the user of a URL and hides its password,
    also when the user info is malformed; redact finds URLs inside messages."""
    assert redact_url("postgresql://app:pw@h/db") == "postgresql://app:***@h/db"
    assert redact_url("postgresql://app:p@ss@h/db") == "postgresql://app:***@h/db"
    assert redact_url("postgresql://app@h/db") == "postgresql://app@h/db"
    assert redact_url("postgresql://app:pa/ss@h/db") == "postgresql://app:***@h/db"
    assert redact_url("postgresql:app:pw@h/db") == "postgresql:***@h/db"
    assert redact_url("postgresql://[::1:pw@h/db") == "postgresql://[:***@h/db"
    assert redact_url("postgresql://h/db?password=pw&a=1") == "postgresql://h/db?password=***&a=1"
    assert redact_url("sqlite:///abs/x.db") == "sqlite:///abs/x.db"
    message = "bad store URL 'x://u:my pw@h/db': unknown; also \"y://v:it's@h\" and z://w:q@h"
    assert redact(message) == (
        "bad store URL 'x://u:***@h/db': unknown; also \"y://v:***@h\" and z://w:***@h"
    )
    assert redact("no checkpoint for workflow 'user:alice@example.com'") == (
        "no checkpoint for workflow 'user:alice@example.com'"
    )


# --- 18: rows no valid workflow can have ------------------------------------------------------


async def damaged_sqlite_store(path: Path) -> list[object]:
    """A SQLite store with workflow "good" and rows whose ids were damaged by hand (a bytes
    id, one holding NUL), its constraints bypassed; the ids the storage now lists."""
    url = f"sqlite:{path}"
    for workflow_id in ("good", "bytes", "nul"):
        await record_of(url, workflow_id, 0, {"x": 1})
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA ignore_check_constraints = ON")
        for table in ("checkpoints", "workflows"):
            db.execute(
                f"UPDATE {table} SET workflow_id = CAST(workflow_id AS BLOB) "
                "WHERE workflow_id = 'bytes'"
            )
            db.execute(
                f"UPDATE {table} SET workflow_id = 'n' || char(0) || 'ul' WHERE workflow_id = 'nul'"
            )
    async with open_store(url, must_exist=True) as manager:
        return list(await manager.list_workflows())


def assert_foreign_reported(result: Result, listed: list[object]) -> None:
    """The command ended without a traceback and reported every damaged row: the store lists
    only valid ids and names its damaged rows (two ids, each in both tables) by rowid."""
    assert "Traceback" not in result.err, result.err
    report = result.json()
    assert isinstance(report, dict)
    assert listed == ["good"]
    shown = sorted(f["id"].split(" rowid ")[0] for f in report.get("foreign", []))
    assert shown == ["checkpoints", "checkpoints", "workflows", "workflows"], report


async def test_foreign_rows_in_a_sqlite_store_are_reported_not_fatal(tmp_path: Path) -> None:
    """A bytes workflow id (and one with NUL) in a SQLite table: `workflows`, `verify`,
    `export` and `copy` report those rows as foreign and handle the valid workflow."""
    listed = await damaged_sqlite_store(tmp_path / "src.db")
    src = f"sqlite:{tmp_path / 'src.db'}"

    workflows = cli("--json", "workflows", src)
    assert workflows.code == 0, workflows.err
    assert_foreign_reported(workflows, listed)
    rows = workflows.json()["workflows"]  # type: ignore[index]
    assert [(r["workflow_id"], r["steps"]) for r in rows if r["workflow_id"] == "good"] == [
        ("good", 1)
    ]
    verify = cli("--json", "verify", src)
    assert verify.code == 1
    assert_foreign_reported(verify, listed)
    exported = cli("--json", "export", src, str(tmp_path / "e.jsonl"))
    assert exported.code == 1
    assert_foreign_reported(exported, listed)
    assert '"workflow_id":"good"' in (tmp_path / "e.jsonl").read_text("utf-8")
    copied = cli("--json", "copy", src, f"sqlite:{tmp_path / 'dst.db'}")
    assert copied.code == 1
    assert_foreign_reported(copied, listed)
    assert copied.json()["verified"] == 1  # type: ignore[index]
    text = cli("verify", src)
    assert "foreign row" in text.out and "Traceback" not in text.err


# --- a file store's entries that are no workflow's directory ----------------------------------


async def test_verify_lists_a_file_stores_foreign_entries(tmp_path: Path) -> None:
    """Directories under a file store's workflows/ that are not the store's (a name that is no
    id's, a hashed directory with a wrong id file, a planted file, a symlink, a name holding
    C1 and bidi characters): `verify` lists each as a foreign row by its path, escaped in the
    table, exact in JSON, and exits 1; the store's own temporaries are not listed."""
    url = f"file:{tmp_path}/store"
    await record_of(url, "good", 0, {"x": 1})
    clean = cli("--json", "verify", url)
    assert (clean.code, clean.json()) == (
        0,
        {"ok": True, "workflows": 1, "checkpoints": 1, "corrupted": []},
    )
    root = tmp_path / "store" / "workflows"
    hashed = "#" + "0" * 64
    hostile = "x\u009by\u202ez"
    for name in ("UPPER", hashed, hostile, ".new-0-1-x"):
        (root / name).mkdir()
        (root / name / "00000000000000000000.ckpt").write_bytes(b"forged")
    (root / hashed / "id").write_bytes(b"good")
    (root / "planted.txt").write_bytes(b"x")
    (root / "link").symlink_to(root / "good")
    os.mkdir(os.fsencode(root) + b"/not-utf8-\xff")

    report = cli("--json", "verify", url)
    assert report.code == 1 and "Traceback" not in report.err
    found = report.json()
    assert isinstance(found, dict) and (found["workflows"], found["corrupted"]) == (1, [])
    names = (hashed, "UPPER", "link", "not-utf8-\udcff", "planted.txt", hostile)
    paths = [f"workflows/{n}" for n in names]
    assert [f["id"] for f in found["foreign"]] == paths
    text = cli("verify", url)
    assert text.code == 1
    assert not [c for c in RAW if c in text.out]
    rows = [line for line in text.out.splitlines() if line.startswith("workflows/")]
    escaped = ["workflows/not-utf8-\\udcff", paths[4], "workflows/x\\x9by\\u202ez"]
    assert [row.split()[0] for row in rows] == [*paths[:3], *escaped]
    assert all("foreign row: " in row for row in rows)
    assert text.out.splitlines()[-1].endswith(", 6 foreign rows")


# --- stores another user owns or may write: --allow-shared ----------------------------------


def entries(top: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every entry under ``top``: mode, owner, size, modification time (what a write changes)."""
    found = {}
    for path in [top, *top.rglob("*")]:
        info = path.lstat()
        found[str(path)] = (info.st_mode, info.st_uid, info.st_size, info.st_mtime_ns)
    return found


def share(target: Path, how: str) -> str:
    """Make ``target`` (and what is under it) another uid's, or writable by its group; the
    words of the refusal expected for it."""
    if how == "group-writable":
        mode = 0o770 if target.is_dir() else 0o660
        target.chmod(mode)
        return f"mode {mode:04o} lets group or others write it"
    for path in [target, *target.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    return f"belongs to uid 65534, not to this process's uid {os.geteuid()}"


@pytest.mark.parametrize(
    "how",
    ["group-writable", pytest.param("another uid", marks=pytest.mark.root)],  # chown
)
@pytest.mark.parametrize("scheme", ["file", "sqlite"])
async def test_allow_shared_opens_a_store_that_is_refused_without_it(
    tmp_path: Path, scheme: str, how: str
) -> None:
    """A file store directory or SQLite database made group-writable or another uid's (as
    root: the root tier): every command refuses it, exit status 4, one line naming the path, the
    reason and `--allow-shared`, and changes nothing; with `--allow-shared` (before or after
    the command) it is read and written; it stays refused without the flag."""
    top = tmp_path / "shared"
    target = top / ("store" if scheme == "file" else "store.db")
    url = f"{scheme}:{target}"
    await record_of(url, "wf", 0, {"x": 1})
    expected = share(target, how)
    before = entries(top)
    for argv in (["verify", url], ["fork", url, "wf", "0", "wf2"], ["--json", "workflows", url]):
        line = cli(*argv).error_line()
        assert line.startswith(f"aiocheckpoint: error: refusing to open '{target}': "), line
        assert expected in line and line.endswith(
            "(on the command line: aiocheckpoint --allow-shared)"
        )
    assert entries(top) == before
    assert cli("verify", url).code == 4

    verify = cli("--allow-shared", "verify", url)
    assert (verify.code, verify.err) == (0, "")
    assert "checked 1 checkpoints in 1 workflows: 0 corrupted" in verify.out
    forked = cli("fork", url, "wf", "0", "wf2", "--allow-shared")
    assert forked.code == 0, forked.err
    listed = cli("--json", "workflows", "--allow-shared", url)
    assert listed.code == 0, listed.err
    assert [w["workflow_id"] for w in listed.json()["workflows"]] == ["wf", "wf2"]  # type: ignore[index]
    assert cli("show", url, "wf2").code == 4


def test_allow_shared_is_harmless_where_there_is_no_owner_check() -> None:
    """`--allow-shared` with a store that has no owner check (memory://) is accepted."""
    result = cli("--allow-shared", "--json", "workflows", "memory://")
    assert (result.code, result.json()) == (0, {"workflows": []})
