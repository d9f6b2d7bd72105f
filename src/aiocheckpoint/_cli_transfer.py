"""Moving raw records between stores and files: ``copy``, ``export`` and ``import``.

Records travel as the exact bytes the manager wrote (header, checksum and JSON body), so a
copy or an export/import round trip reproduces every checkpoint byte for byte. Each record
is verified before it is written anywhere, and a record already at the destination with
identical bytes is skipped, which makes every transfer resumable: run it again after an
interruption and it picks up where it stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import os
import sys
from dataclasses import dataclass, field
from typing import IO, Any, Final

from ._cli_output import Output, Progress, bar, printable
from ._cli_store import (
    EXIT_PROBLEMS,
    EXIT_STORE,
    EXIT_USAGE,
    PAGE,
    CommandError,
    Record,
    location,
    open_store,
    portable,
    read_page,
)
from ._validation import MAX_STEP, check_step, check_workflow_id
from .errors import CheckpointCorruptedError, InvalidArgumentError
from .leases import WorkflowRecord, WorkflowStatus
from .manager import CheckpointManager
from .models import utcnow
from .serde import FORMAT_VERSION as RECORD_FORMAT
from .serde import decode_checkpoint
from .storage.base import StoredCheckpoint

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "cmd_copy", "cmd_export", "cmd_import"]

#: The export file's format name and version (the header line carries both).
EXPORT_FORMAT: Final = "aiocheckpoint-export"
EXPORT_VERSION: Final = 1


@dataclass
class Tally:
    """What a transfer did, and every problem it met."""

    written: int = 0
    skipped: int = 0
    verified: int = 0
    workflows: int = 0
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    corrupted: list[dict[str, Any]] = field(default_factory=list)
    mismatched: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether nothing went wrong."""
        return not (self.conflicts or self.corrupted or self.mismatched)

    def to_json(self) -> dict[str, Any]:
        """The tally as a JSON object."""
        return {
            "ok": self.ok,
            "workflows": self.workflows,
            "written": self.written,
            "skipped": self.skipped,
            "verified": self.verified,
            "conflicts": self.conflicts,
            "corrupted": self.corrupted,
            "mismatched": self.mismatched,
            "notes": self.notes,
        }


async def _present(
    manager: CheckpointManager, workflow_id: str, after: int | None, last: int
) -> dict[int, Record]:
    """The destination's records with ``after < step <= last``."""
    before = None if last >= MAX_STEP else last + 1
    page = await read_page(manager.storage, workflow_id, after=after, before=before, limit=None)
    return {record.step: record for record in page}


class Sink:
    """Writes raw records into a store, skipping those already there byte for byte."""

    def __init__(self, manager: CheckpointManager, tally: Tally, *, overwrite: bool) -> None:
        self._manager = manager
        self._tally = tally
        self._overwrite = overwrite

    async def put(self, workflow_id: str, records: dict[int, bytes]) -> None:
        """Write one workflow's records (step -> bytes), concurrently so writes can batch."""
        low = min(records)
        there = await _present(self._manager, workflow_id, low - 1 if low else None, max(records))
        writes = []
        for step, data in records.items():
            have = there.get(step)
            if isinstance(have, StoredCheckpoint) and have.data == data:
                self._tally.skipped += 1
            elif have is not None and not self._overwrite:
                self._tally.conflicts.append({"workflow_id": workflow_id, "step": step})
            else:
                writes.append(self._manager.storage.save(workflow_id, step, data))
        results = await asyncio.gather(*writes, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        self._tally.written += len(writes)

    async def status(self, workflow_id: str, status: WorkflowStatus) -> None:
        """Give the workflow ``status`` at the destination, if it keeps workflow records."""
        if not self._manager.supports_workflow_records():
            note = "the destination keeps no workflow records: workflow statuses not copied"
            if note not in self._tally.notes:
                self._tally.notes.append(note)
            return
        record = await self._manager.get_workflow(workflow_id)
        if record is None or record.status is not status:
            await self._manager.mark_workflow(workflow_id, status)


async def _records(manager: CheckpointManager) -> dict[str, WorkflowRecord]:
    if not manager.supports_workflow_records():
        return {}
    return {r.workflow_id: r for r in await manager.list_workflow_records()}


def _report(out: Output, tally: Tally, summary: str) -> int:
    if out.json_mode:
        out.json(tally.to_json())
    else:
        for note in tally.notes:
            out.note(f"note: {note}")
        for title, items in (
            ("corrupted (not transferred)", tally.corrupted),
            (
                "conflicts (different bytes at the destination; --overwrite replaces)",
                tally.conflicts,
            ),
            ("not verified at the destination", tally.mismatched),
        ):
            if items:
                out.line(out.style(f"{title}:", "red"))
                for item in items:
                    where = f"line {item['line']}: " if "line" in item else ""
                    wf = item.get("workflow_id")
                    what = f"{printable(wf)!s} step {item.get('step')}" if wf is not None else ""
                    reason = f": {item['reason']}" if "reason" in item else ""
                    out.line(f"  {where}{what}{reason}")
        out.line(summary)
    return 0 if tally.ok else EXIT_PROBLEMS


# --- copy ------------------------------------------------------------------------------


def _same_store(src: str, src_m: CheckpointManager, dst: str, dst_m: CheckpointManager) -> bool:
    a, b = location(src, src_m.storage), location(dst, dst_m.storage)
    if a is not None and b is not None:
        return os.path.realpath(a) == os.path.realpath(b)
    return src == dst and not src.lower().startswith("memory:")


async def cmd_copy(args: argparse.Namespace, out: Output) -> int:
    """Copy every workflow's records from one store into another, then verify them."""
    tally = Tally()
    progress = Progress(out.err)
    async with (
        open_store(args.src, must_exist=True) as src,
        open_store(args.dst, must_exist=False) as dst,
    ):
        if _same_store(args.src, src, args.dst, dst):
            raise CommandError("the source and destination are the same store", EXIT_USAGE)
        records = await _records(src)
        ids = sorted(set(await src.list_workflows()) | set(records))
        tally.workflows = len(ids)
        sink = Sink(dst, tally, overwrite=args.overwrite)
        for n, workflow_id in enumerate(ids, 1):
            cursor: int | None = None
            while page := await read_page(src.storage, workflow_id, after=cursor):
                cursor = page[-1].step
                good = await _verified(src, workflow_id, page, tally)
                if good:
                    await sink.put(workflow_id, good)
                progress.update(
                    f"copy: {bar(n - 1, len(ids))} workflows, {tally.written} written, "
                    f"{tally.skipped} already there"
                )
            if workflow_id in records:
                await sink.status(workflow_id, records[workflow_id].status)
        await _verify_copy(src, dst, ids, tally, progress)
    progress.clear()
    return _report(
        out,
        tally,
        f"copied {tally.written} checkpoints of {tally.workflows} workflows "
        f"({tally.skipped} already there); verified {tally.verified} at the destination",
    )


async def _verified(
    src: CheckpointManager, workflow_id: str, page: list[Record], tally: Tally
) -> dict[int, bytes]:
    good: dict[int, bytes] = {}
    for record in page:
        result = await portable(src, workflow_id, record)
        if isinstance(result, str):
            tally.corrupted.append(
                {"workflow_id": workflow_id, "step": record.step, "reason": result}
            )
        else:
            good[record.step] = result
    return good


async def _verify_copy(
    src: CheckpointManager,
    dst: CheckpointManager,
    ids: list[str],
    tally: Tally,
    progress: Progress,
) -> None:
    """Read both stores again: every good source record must be at the destination as is."""
    skip = {(c["workflow_id"], c["step"]) for c in tally.conflicts + tally.corrupted}
    for n, workflow_id in enumerate(ids, 1):
        cursor: int | None = None
        while page := await read_page(src.storage, workflow_id, after=cursor):
            prev, cursor = cursor, page[-1].step
            there = await _present(dst, workflow_id, prev, cursor)
            for record in page:
                if (workflow_id, record.step) in skip or not isinstance(record, StoredCheckpoint):
                    continue
                have = there.get(record.step)
                expected = await portable(src, workflow_id, record)
                if isinstance(have, StoredCheckpoint) and have.data == expected:
                    tally.verified += 1
                else:
                    tally.mismatched.append({"workflow_id": workflow_id, "step": record.step})
            progress.update(f"verify: {bar(n - 1, len(ids))} workflows, {tally.verified} verified")


# --- export ----------------------------------------------------------------------------


class _ExportFile:
    """Lines written to a temporary file that replaces FILE only once it is complete."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._tmp: str | None = None
        self._fh: IO[bytes]
        if path == "-":
            self._fh = sys.stdout.buffer
            return
        directory = os.path.dirname(os.path.abspath(path))
        self._tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
        try:
            self._fh = open(self._tmp, "xb")  # noqa: SIM115 - closed by commit/discard
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc.strerror}", EXIT_STORE) from exc

    async def write(self, lines: list[str]) -> None:
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        await asyncio.to_thread(self._fh.write, data)

    async def commit(self) -> None:
        await asyncio.to_thread(self._commit)

    def _commit(self) -> None:
        self._fh.flush()
        if self._tmp is None:
            return
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self._tmp, self._path)
        fd = os.open(os.path.dirname(os.path.abspath(self._path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._tmp = None

    def discard(self) -> None:
        if self._tmp is not None:
            self._fh.close()
            os.unlink(self._tmp)
            self._tmp = None


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


async def cmd_export(args: argparse.Namespace, out: Output) -> int:
    """Write every verified record of a store to a JSON-lines file."""
    tally = Tally()
    progress = Progress(out.err)
    async with open_store(args.url, must_exist=True) as src:
        records = await _records(src)
        ids = sorted(set(await src.list_workflows()) | set(records))
        tally.workflows = len(ids)
        file = _ExportFile(args.file)
        try:
            header = {
                "format": EXPORT_FORMAT,
                "version": EXPORT_VERSION,
                "record_format": RECORD_FORMAT,
                "exported_at": utcnow().isoformat(),
                "source": args.url.split(":", 1)[0].lower(),
            }
            await file.write([_line(header)])
            for n, workflow_id in enumerate(ids, 1):
                await _export_workflow(src, workflow_id, records.get(workflow_id), file, tally)
                progress.update(
                    f"export: {bar(n, len(ids))} workflows, {tally.written} checkpoints"
                )
            end = {"type": "end", "checkpoints": tally.written, "workflows": len(ids)}
            await file.write([_line(end)])
            await file.commit()
        except OSError as exc:
            file.discard()
            raise CommandError(f"cannot write {args.file}: {exc.strerror}", EXIT_STORE) from exc
        except BaseException:
            file.discard()
            raise
    progress.clear()
    if args.file == "-":
        out = Output(out.err, out.err, json_mode=out.json_mode)
    return _report(
        out, tally, f"exported {tally.written} checkpoints of {tally.workflows} workflows"
    )


async def _export_workflow(
    src: CheckpointManager,
    workflow_id: str,
    record: WorkflowRecord | None,
    file: _ExportFile,
    tally: Tally,
) -> None:
    cursor: int | None = None
    while page := await read_page(src.storage, workflow_id, after=cursor):
        cursor = page[-1].step
        good = await _verified(src, workflow_id, page, tally)
        await file.write(
            [
                _line(
                    {
                        "type": "checkpoint",
                        "workflow_id": workflow_id,
                        "step": step,
                        "record": base64.b64encode(data).decode("ascii"),
                    }
                )
                for step, data in good.items()
            ]
        )
        tally.written += len(good)
    if record is not None:
        await file.write(
            [_line({"type": "workflow", "workflow_id": workflow_id, "status": record.status.value})]
        )


# --- import ----------------------------------------------------------------------------


class _BadLine(Exception):
    pass


def _parse_line(raw: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise _BadLine("not a JSON line") from exc
    if type(obj) is not dict:
        raise _BadLine("not a JSON object")
    kind = obj.get("type")
    if kind not in ("checkpoint", "workflow", "end"):
        raise _BadLine(f"unknown line type {kind!r}")
    try:
        if kind != "end":
            check_workflow_id(obj.get("workflow_id"))
        if kind == "checkpoint":
            check_step(obj.get("step"))
            if not isinstance(obj.get("record"), str):
                raise _BadLine("record must be a base64 string")
            obj["record"] = base64.b64decode(obj["record"], validate=True)
        elif kind == "workflow":
            obj["status"] = WorkflowStatus(obj.get("status"))
    except (InvalidArgumentError, binascii.Error, ValueError) as exc:
        raise _BadLine(str(exc)) from exc
    return obj


def _read_header(fh: IO[bytes], path: str) -> None:
    first = fh.readline()
    try:
        header = json.loads(first)
    except ValueError:
        header = None
    if type(header) is not dict or header.get("format") != EXPORT_FORMAT:
        raise CommandError(f"{path} is not an aiocheckpoint export (bad header line)", EXIT_STORE)
    version = header.get("version")
    if version != EXPORT_VERSION:
        raise CommandError(
            f"{path} is export format version {version!r}; this aiocheckpoint reads "
            f"version {EXPORT_VERSION}",
            EXIT_STORE,
        )


def _read_lines(fh: IO[bytes], count: int) -> list[bytes]:
    lines = []
    for _ in range(count):
        line = fh.readline()
        if not line:
            break
        lines.append(line)
    return lines


class _Importer:
    """Feeds parsed lines to a Sink, one workflow's page at a time."""

    def __init__(self, sink: Sink, tally: Tally) -> None:
        self.sink = sink
        self.tally = tally
        self.workflow: str | None = None
        self.pending: dict[int, bytes] = {}
        self.seen: set[str] = set()
        self.checkpoints = 0
        self.end: dict[str, Any] | None = None

    async def flush(self) -> None:
        if self.workflow is not None and self.pending:
            await self.sink.put(self.workflow, self.pending)
        self.pending = {}

    async def take(self, number: int, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            if self.end is not None:
                raise _BadLine("line after the end line")
            obj = _parse_line(raw)
        except _BadLine as exc:
            self.tally.corrupted.append({"line": number, "reason": str(exc)})
            return
        if obj["type"] == "end":
            self.end = obj
            return
        workflow_id = obj["workflow_id"]
        if workflow_id != self.workflow or len(self.pending) >= PAGE:
            await self.flush()
            self.workflow = workflow_id
        self.seen.add(workflow_id)
        if obj["type"] == "workflow":
            await self.flush()
            await self.sink.status(workflow_id, obj["status"])
            return
        self.checkpoints += 1
        try:
            decode_checkpoint(obj["record"], workflow_id=workflow_id, step=obj["step"])
        except CheckpointCorruptedError as exc:
            self.tally.corrupted.append(
                {
                    "line": number,
                    "workflow_id": workflow_id,
                    "step": obj["step"],
                    "reason": exc.reason,
                }
            )
            return
        self.pending[obj["step"]] = obj["record"]


async def cmd_import(args: argparse.Namespace, out: Output) -> int:
    """Load a JSON-lines export into a store, verifying every record first."""
    tally = Tally()
    progress = Progress(out.err)
    try:
        fh: IO[bytes] = (
            sys.stdin.buffer if args.file == "-" else await asyncio.to_thread(open, args.file, "rb")
        )
    except OSError as exc:
        raise CommandError(f"cannot read {args.file}: {exc.strerror}", EXIT_STORE) from exc
    try:
        await asyncio.to_thread(_read_header, fh, args.file)
        async with open_store(args.url, must_exist=False) as dst:
            importer = _Importer(Sink(dst, tally, overwrite=args.overwrite), tally)
            number = 1
            while lines := await asyncio.to_thread(_read_lines, fh, PAGE):
                for raw in lines:
                    number += 1
                    await importer.take(number, raw)
                progress.update(f"import: {tally.written} written, {tally.skipped} already there")
            await importer.flush()
    except OSError as exc:
        raise CommandError(f"cannot read {args.file}: {exc.strerror}", EXIT_STORE) from exc
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()
    progress.clear()
    tally.workflows = len(importer.seen)
    _check_end(importer, tally)
    return _report(
        out,
        tally,
        f"imported {tally.written} checkpoints of {tally.workflows} workflows "
        f"({tally.skipped} already there)",
    )


def _check_end(importer: _Importer, tally: Tally) -> None:
    end = importer.end
    if end is None:
        tally.corrupted.append({"reason": "the file is truncated: it has no end line"})
    elif end.get("checkpoints") != importer.checkpoints:
        tally.corrupted.append(
            {
                "reason": f"the end line counts {end.get('checkpoints')!r} checkpoints, "
                f"the file holds {importer.checkpoints}"
            }
        )
