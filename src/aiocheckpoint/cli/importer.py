"""``import``: a JSON-lines export loaded into a store, every record verified first."""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import sys
from typing import IO, Any, Final

from .._validation import check_step, check_workflow_id
from ..codec import Sealer, decode_checkpoint, is_sealed_record
from ..errors import (
    CheckpointCorruptedError,
    EncryptionError,
    InvalidArgumentError,
    WorkflowTransferError,
)
from ..leases import WORKFLOW_KIND, WorkflowStatus, check_kind
from ..storage.base import StoredEffect
from ..storage.events import StoredEvent
from .eventlines import parse_event, put_events
from .export import EXPORT_FORMAT, EXPORT_VERSION, EXPORT_VERSIONS
from .journal import Effect, JournalSink, check_effect, check_entry, sealer_for
from .keys import command_keys
from .output import Output, Progress, printable
from .store import EXIT_STORE, PAGE, CommandError, locked, open_store
from .transfer import Sink, Tally, report

__all__ = ["cmd_import"]


class _BadLine(Exception):
    pass


#: The line types of each export format version.
_KINDS: Final = {
    1: ("checkpoint", "workflow", "end"),
    2: ("effect", "checkpoint", "workflow", "end"),
    3: ("effect", "checkpoint", "workflow", "event", "end"),
}
#: The most effect-record bytes held for one workflow until its checkpoints come: a
#: workflow's effects are all checked before any of its lines is written.
EFFECT_BUFFER: Final = 64 * 2**20


def _parse_line(raw: bytes, version: int = EXPORT_VERSION) -> dict[str, Any]:
    """One parsed line; _BadLine if it is malformed.

    A malformed effect line of a workflow it names raises WorkflowTransferError instead:
    that workflow is refused.
    """
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise _BadLine("not a JSON line") from exc
    except RecursionError as exc:
        raise _BadLine("nested too deeply to be an export line") from exc
    if type(obj) is not dict:
        raise _BadLine("not a JSON object")
    kind = obj.get("type")
    if kind not in _KINDS[version]:
        raise _BadLine(f"unknown line type {printable(repr(kind)[:100])}")
    try:
        if kind != "end":
            check_workflow_id(obj.get("workflow_id"))
        if kind == "effect":
            obj["effect"] = _parse_effect(obj)
        elif kind == "checkpoint":
            check_step(obj.get("step"))
            obj["record"] = _record(obj.get("record"))
        elif kind == "workflow":
            obj["status"] = WorkflowStatus(obj.get("status"))
            if type(obj.setdefault("metadata", None)) not in (dict, type(None)):
                raise _BadLine("metadata must be a JSON object")
            obj["kind"] = _kind(obj.get("kind", WORKFLOW_KIND))
        elif kind == "event":
            obj["event"] = parse_event(obj)
    except (InvalidArgumentError, binascii.Error, ValueError) as exc:
        raise _BadLine(str(exc)) from exc
    return obj


def _kind(value: object) -> str:
    """A workflow line's kind (absent: ``"workflow"``); _BadLine unless it is one."""
    try:
        return check_kind(value)
    except InvalidArgumentError:
        shown = printable(repr(value)[:40])
        raise _BadLine(f"not a workflow kind: {shown}") from None


def _record(value: object) -> bytes:
    if not isinstance(value, str):
        raise _BadLine("record must be a base64 string")
    return base64.b64decode(value, validate=True)


def _parse_effect(obj: dict[str, Any]) -> StoredEffect:
    """An effect line's record, its fields checked (not yet verified)."""
    workflow_id = obj["workflow_id"]
    entry = check_entry(workflow_id, obj.get("step"), obj.get("key"), obj.get("in_doubt"))
    try:
        data = _record(obj.get("record"))
    except (_BadLine, binascii.Error, ValueError) as exc:
        raise WorkflowTransferError(workflow_id, f"a malformed effect line: {exc}") from None
    return StoredEffect(entry.step, entry.key, entry.in_doubt, data)


def _read_header(fh: IO[bytes], path: str) -> int:
    first = fh.readline()
    try:
        header = json.loads(first)
    except (ValueError, RecursionError):
        header = None
    if type(header) is not dict or header.get("format") != EXPORT_FORMAT:
        raise CommandError(f"{path} is not an aiocheckpoint export (bad header line)", EXIT_STORE)
    version = header.get("version")
    if type(version) is not int or version not in EXPORT_VERSIONS:
        raise CommandError(
            f"{path} is export format version {printable(repr(version)[:40])}; this "
            f"aiocheckpoint reads versions {', '.join(map(str, EXPORT_VERSIONS))}",
            EXIT_STORE,
        )
    return version


def _read_lines(fh: IO[bytes], count: int) -> list[bytes]:
    lines = []
    for _ in range(count):
        line = fh.readline()
        if not line:
            break
        lines.append(line)
    return lines


class _Importer:
    """Feeds parsed lines to a Sink, one workflow's page at a time, its effects first.

    A workflow's effect lines are checked as they come and held (up to EFFECT_BUFFER
    bytes) until its lines are written, effects before checkpoints; an export writes them
    first, so a bad one refuses the workflow before anything of it is written, and its
    later lines are skipped. An effect line of a workflow something was already written for
    (its lines resumed after another workflow's, or after a full page of its checkpoints)
    refuses it: written after its checkpoints, the record would not be there when a resume
    from them replays the step.
    """

    def __init__(
        self,
        sink: Sink,
        effects: JournalSink,
        tally: Tally,
        sealer: Sealer | None = None,
        version: int = EXPORT_VERSION,
    ) -> None:
        self.sink = sink
        self.effect_sink = effects
        #: Unseals encrypted records to verify them (they are stored as they are).
        self.sealer = sealer
        self.tally = tally
        self.version = version
        self.workflow: str | None = None
        self.pending: dict[int, bytes] = {}
        self.held: list[Effect] = []
        self.held_bytes = 0
        self.seen: set[str] = set()
        self.refused: set[str] = set()
        #: Workflows something was written for (a refusal after that says so).
        self.started: set[str] = set()
        self.checkpoints = 0
        self.effects = 0
        self.end: dict[str, Any] | None = None
        #: The current workflow's event lines, put when its lines end.
        self.events: list[StoredEvent] = []
        #: Workflows whose workflow line was imported (their events may follow).
        self.statused: set[str] = set()

    async def flush(self) -> None:
        """Write the current workflow's held effects, then its pending checkpoints."""
        workflow_id = self.workflow
        if workflow_id is None:
            return
        if self.held:
            try:
                await self.effect_sink.check(workflow_id, self.held)
            except WorkflowTransferError as exc:
                self._refuse(exc, None)
                return
            await self.effect_sink.put(workflow_id, self.held)
            self.started.add(workflow_id)
            self.held, self.held_bytes = [], 0
        if self.pending:
            await self.sink.put(workflow_id, self.pending)
            self.started.add(workflow_id)
        self.pending = {}

    async def take(self, number: int, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            if self.end is not None:
                raise _BadLine("line after the end line")
            obj = _parse_line(raw, self.version)
        except _BadLine as exc:
            self.tally.corrupted.append({"line": number, "reason": str(exc)})
            return
        except WorkflowTransferError as exc:
            self.effects += 1
            if exc.workflow_id not in self.refused:
                await self._switch(exc.workflow_id)
                self._refuse(exc, number)
            return
        if obj["type"] == "end":
            self.end = obj
            return
        workflow_id = obj["workflow_id"]
        self.effects += obj["type"] == "effect"
        self.checkpoints += obj["type"] == "checkpoint"
        self.seen.add(workflow_id)
        if workflow_id in self.refused:
            return
        await self._switch(workflow_id)
        if obj["type"] == "effect":
            await self._hold(number, workflow_id, obj["effect"])
        elif obj["type"] == "workflow":
            await self.flush()
            if workflow_id not in self.refused:
                await self._status(number, workflow_id, obj)
                self.statused.add(workflow_id)
        elif obj["type"] == "event":
            self.events.append(obj["event"])
        else:
            await self._checkpoint(number, workflow_id, obj)

    async def _status(self, number: int, workflow_id: str, obj: dict[str, Any]) -> None:
        try:
            await self.sink.status(workflow_id, obj["status"], obj["metadata"], obj["kind"])
        except InvalidArgumentError as exc:
            where = {"line": number, "workflow_id": workflow_id}
            self.tally.corrupted.append({**where, "reason": str(exc)})

    async def _switch(self, workflow_id: str) -> None:
        """Flush the current workflow when ``workflow_id``'s lines start (or a page is full)."""
        if workflow_id != self.workflow or len(self.pending) >= PAGE:
            await self.flush()
            if workflow_id != self.workflow:
                await self.put_events()
                self.held, self.held_bytes = [], 0
            self.workflow = workflow_id

    async def put_events(self) -> None:
        """Make the current workflow's event lines its history (after its status)."""
        workflow_id, events, self.events = self.workflow, self.events, []
        if workflow_id in self.statused and events and workflow_id not in self.refused:
            assert workflow_id is not None
            await put_events(self.sink.manager, workflow_id, events)

    async def _hold(self, number: int, workflow_id: str, stored: StoredEffect) -> None:
        try:
            if workflow_id in self.started:
                raise WorkflowTransferError(
                    workflow_id,
                    "an effect line after its checkpoints were written (an export writes a "
                    "workflow's effect lines before its checkpoints, all together)",
                )
            effect = await check_effect(self.sealer, workflow_id, stored)
            self.held_bytes += len(effect.data)
            if self.held_bytes > EFFECT_BUFFER:
                raise WorkflowTransferError(
                    workflow_id,
                    f"its effect records are over {EFFECT_BUFFER // 2**20} MiB, more than "
                    "import holds before writing (copy the store instead)",
                )
        except WorkflowTransferError as exc:
            self._refuse(exc, number)
            return
        self.held.append(effect)

    def _refuse(self, exc: WorkflowTransferError, number: int | None) -> None:
        """Refuse a workflow: drop what is held of it, skip its later lines."""
        workflow_id = exc.workflow_id
        self.refused.add(workflow_id)
        self.seen.add(workflow_id)
        if workflow_id == self.workflow:
            self.held, self.held_bytes, self.pending = [], 0, {}
        if workflow_id in self.started:
            exc = WorkflowTransferError(
                workflow_id, f"{exc.reason} (its lines before this one were imported)"
            )
        self.tally.refuse(exc, **({} if number is None else {"line": number}))

    async def _checkpoint(self, number: int, workflow_id: str, obj: dict[str, Any]) -> None:
        try:
            await self._verify(workflow_id, obj["step"], obj["record"])
        except (CheckpointCorruptedError, EncryptionError) as exc:
            # Not imported either way; a key the keys given lack is said as such.
            if isinstance(exc, EncryptionError):
                reason: str = locked(exc, obj["record"])
            else:
                reason = exc.reason
            where = {"line": number, "workflow_id": workflow_id, "step": obj["step"]}
            self.tally.problem(reason, **where)
            return
        self._add(number, workflow_id, obj["step"], obj["record"])

    async def _verify(self, workflow_id: str, step: int, record: bytes) -> None:
        """Raise CheckpointCorruptedError unless the record verifies (unsealed, if sealed).

        EncryptionError when it is sealed and the keys given (if any) cannot unseal it.
        """
        if is_sealed_record(record):
            if self.sealer is None:
                raise EncryptionError("encrypted and no keys given")
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
        version = await asyncio.to_thread(_read_header, fh, args.file)
        async with open_store(
            args.url, must_exist=False, allow_shared=args.allow_shared, keys=command_keys(args)
        ) as dst:
            importer = _Importer(
                Sink(dst, tally, overwrite=args.overwrite),
                JournalSink(dst, tally, overwrite=args.overwrite),
                tally,
                sealer_for(command_keys(args)),
                version,
            )
            number = 1
            while lines := await asyncio.to_thread(_read_lines, fh, PAGE):
                for raw in lines:
                    number += 1
                    await importer.take(number, raw)
                progress.update(f"import: {tally.written} written, {tally.skipped} already there")
            await importer.flush()
            await importer.put_events()
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
        f"imported {tally.written} checkpoints and {tally.effects_written} effect records of "
        f"{tally.workflows - len(tally.refused)} workflows ({tally.skipped} checkpoints and "
        f"{tally.effects_skipped} effect records already there)",
    )


def _check_end(importer: _Importer, tally: Tally) -> None:
    end = importer.end
    if end is None:
        tally.corrupted.append({"reason": "the file is truncated: it has no end line"})
        return
    counts = [("checkpoints", importer.checkpoints)]
    if importer.version >= 2:
        counts.append(("effects", importer.effects))
    for name, held in counts:
        if end.get(name) != held:
            said = printable(repr(end.get(name))[:40])
            tally.corrupted.append(
                {"reason": f"the end line counts {said} {name}, the file holds {held}"}
            )
