"""``import``: a JSON-lines export loaded into a store, every record verified first."""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import sys
from typing import IO, Any

from .._validation import check_step, check_workflow_id
from ..codec.sealing import Sealer, is_sealed_record
from ..codec.v1 import decode_checkpoint
from ..errors import CheckpointCorruptedError, InvalidArgumentError
from ..leases import WorkflowStatus
from .export import EXPORT_FORMAT, EXPORT_VERSION
from .keys import KEYS_VARIABLE, command_keys
from .output import Output, Progress
from .store import EXIT_STORE, PAGE, CommandError, open_store
from .transfer import Sink, Tally, report

__all__ = ["cmd_import"]


class _BadLine(Exception):
    pass


def _parse_line(raw: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise _BadLine("not a JSON line") from exc
    except RecursionError as exc:
        raise _BadLine("nested too deeply to be an export line") from exc
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
    except (ValueError, RecursionError):
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

    def __init__(self, sink: Sink, tally: Tally, sealer: Sealer | None = None) -> None:
        self.sink = sink
        #: Unseals encrypted records to verify them (they are stored as they are).
        self.sealer = sealer
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
            await self._verify(workflow_id, obj["step"], obj["record"])
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
        self._add(number, workflow_id, obj["step"], obj["record"])

    async def _verify(self, workflow_id: str, step: int, record: bytes) -> None:
        """Raise CheckpointCorruptedError unless the record verifies (unsealed, if sealed)."""
        if is_sealed_record(record):
            if self.sealer is None:
                raise CheckpointCorruptedError(
                    f"encrypted: pass --keys FILE (or {KEYS_VARIABLE}) to verify it"
                )
            record = await self.sealer.unseal_record(workflow_id, step, record)
        decode_checkpoint(record, workflow_id=workflow_id, step=step)

    def _add(self, number: int, workflow_id: str, step: int, record: bytes) -> None:
        """Queue a record; a second one for the same step meets the rule the store applies."""
        have = self.pending.get(step)
        if have == record:
            self.tally.skipped += 1
        elif have is not None and not self.sink.overwrite:
            self.tally.conflicts.append({"line": number, "workflow_id": workflow_id, "step": step})
        else:
            self.pending[step] = record


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
        async with open_store(
            args.url, must_exist=False, allow_shared=args.allow_shared, keys=command_keys(args)
        ) as dst:
            keys = command_keys(args)
            sealer = None if keys is None else Sealer(keys, allow_plaintext=True)
            importer = _Importer(Sink(dst, tally, overwrite=args.overwrite), tally, sealer)
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
    return report(
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
