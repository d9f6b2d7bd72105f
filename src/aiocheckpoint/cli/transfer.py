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
import os
from dataclasses import dataclass, field
from typing import Any

from .._validation import MAX_STEP
from ..errors import WorkflowTransferError
from ..leases import WORKFLOW_KIND, WorkflowRecord, WorkflowStatus
from ..manager import CheckpointManager
from ..storage.base import StoredCheckpoint, WorkflowStorage
from ..storage.lifecycle import cancel_reason
from .eventlines import carry_events
from .journal import Journal, JournalSink, sealer_for
from .keys import command_keys
from .output import Output, Progress, bar, printable
from .store import (
    EXIT_PROBLEMS,
    EXIT_UNREADABLE,
    EXIT_USAGE,
    CommandError,
    Foreign,
    Locked,
    Record,
    foreign_json,
    location,
    open_store,
    portable,
    read_page,
    workflow_ids,
)

__all__ = ["Sink", "Tally", "cmd_copy", "list_records", "report", "verified"]


@dataclass
class Tally:
    """What a transfer did, and every problem it met."""

    written: int = 0
    skipped: int = 0
    verified: int = 0
    workflows: int = 0
    effects_written: int = 0
    effects_skipped: int = 0
    effects_verified: int = 0
    #: Workflows not carried whole (WorkflowTransferError): nothing of them was written.
    refused: list[dict[str, Any]] = field(default_factory=list)
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    corrupted: list[dict[str, Any]] = field(default_factory=list)
    #: Records not transferred because the keys given cannot read them (:class:`Locked`).
    unreadable: list[dict[str, Any]] = field(default_factory=list)
    mismatched: list[dict[str, Any]] = field(default_factory=list)
    foreign: list[Foreign] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether nothing went wrong."""
        return not (self.damaged or self.unreadable)

    @property
    def damaged(self) -> bool:
        """Whether anything went wrong other than records the keys given cannot read."""
        return bool(
            self.conflicts or self.corrupted or self.mismatched or self.foreign or self.refused
        )

    @property
    def status(self) -> int:
        """The exit status: 1 if anything is damaged, else 5 if a record needs other keys."""
        if self.damaged:
            return EXIT_PROBLEMS
        return EXIT_UNREADABLE if self.unreadable else 0

    def problem(self, reason: str, **where: Any) -> None:
        """Report a record not transferred: ``unreadable`` if ``reason`` is Locked."""
        unreadable = isinstance(reason, Locked)
        (self.unreadable if unreadable else self.corrupted).append({**where, "reason": reason})

    def refuse(self, exc: WorkflowTransferError, **where: Any) -> None:
        """Report a workflow not carried whole."""
        self.refused.append({**where, "workflow_id": exc.workflow_id, "reason": exc.reason})

    def to_json(self) -> dict[str, Any]:
        """The tally as a JSON object."""
        return {
            "ok": self.ok,
            "workflows": self.workflows,
            "written": self.written,
            "skipped": self.skipped,
            "verified": self.verified,
            "effects": {
                "written": self.effects_written,
                "skipped": self.effects_skipped,
                "verified": self.effects_verified,
            },
            "refused": self.refused,
            "conflicts": self.conflicts,
            "corrupted": self.corrupted,
            **({"unreadable": self.unreadable} if self.unreadable else {}),
            "mismatched": self.mismatched,
            "notes": self.notes,
            **foreign_json(self.foreign),
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
        self.overwrite = overwrite

    async def put(self, workflow_id: str, records: dict[int, bytes]) -> None:
        """Write one workflow's records (step -> bytes), concurrently so writes can batch."""
        low = min(records)
        there = await _present(self._manager, workflow_id, low - 1 if low else None, max(records))
        writes = []
        for step, data in records.items():
            have = there.get(step)
            if isinstance(have, StoredCheckpoint) and have.data == data:
                self._tally.skipped += 1
            elif have is not None and not self.overwrite:
                self._tally.conflicts.append({"workflow_id": workflow_id, "step": step})
            else:
                writes.append(self._manager.storage.save(workflow_id, step, data))
        results = await asyncio.gather(*writes, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        self._tally.written += len(writes)

    @property
    def manager(self) -> CheckpointManager:
        """The destination."""
        return self._manager

    async def kind(self, workflow_id: str, kind: str) -> None:
        """Give the workflow's record ``kind`` at the destination, creating it if missing.

        Called before anything of the workflow is written, so a record of another kind than
        ``"workflow"`` is never one a runner pool or a sweep at the destination would take.
        A record there of another kind than the default keeps its own.
        """
        storage = self._manager.storage
        if kind != WORKFLOW_KIND and isinstance(storage, WorkflowStorage):
            await storage.register_workflow(workflow_id, kind=kind)

    async def status(
        self,
        workflow_id: str,
        status: WorkflowStatus,
        metadata: dict[str, Any] | None = None,
        kind: str = WORKFLOW_KIND,
        reason: str | None = None,
    ) -> None:
        """Give the workflow ``status``, ``metadata`` and ``kind`` at the destination.

        Only where it keeps workflow records (else a note says they were not carried).
        ``reason`` is a cancelled workflow's.
        """
        if not self._manager.supports_workflow_records():
            note = (
                "the destination keeps no workflow records: workflow statuses and metadata "
                "not copied"
            )
            if note not in self._tally.notes:
                self._tally.notes.append(note)
            return
        await self.kind(workflow_id, kind)
        record = await self._manager.get_workflow(workflow_id)
        if metadata and (record is None or record.metadata != metadata):
            record = await self._manager.register_workflow(workflow_id, metadata=metadata)
        if record is None or record.status is not status:
            await _mark(self._manager, workflow_id, status, reason, record)


async def _mark(
    manager: CheckpointManager,
    workflow_id: str,
    status: WorkflowStatus,
    reason: str | None,
    record: WorkflowRecord | None = None,
) -> None:
    """Give the workflow ``status``: into CANCELLED by a cancel, out of it by a retry.

    ``record`` is the destination's, as it stands (None: none, or not cancelled). Those are
    the only ways in and out; a status write never moves a cancelled record. On
    the way into CANCELLED it is PAUSED, never UNFINISHED: no runner at the destination may
    claim a workflow its source had cancelled, even if the command dies between the writes.
    """
    if record is not None and record.status is WorkflowStatus.CANCELLED:
        await manager.retry_workflow(workflow_id)
    if status is not WorkflowStatus.CANCELLED:
        await manager.mark_workflow(workflow_id, status)
        return
    await manager.mark_workflow(workflow_id, WorkflowStatus.PAUSED)
    await manager.cancel_workflow(workflow_id, reason=reason)


async def list_records(manager: CheckpointManager) -> dict[str, WorkflowRecord]:
    """The store's workflow records by id (none where the backend keeps none)."""
    if not manager.supports_workflow_records():
        return {}
    return {r.workflow_id: r for r in await manager.list_workflow_records(kind=None)}


def report(out: Output, tally: Tally, summary: str) -> int:
    """Print the tally (its problems, then ``summary``) and return the exit status."""
    if out.json_mode:
        out.json(tally.to_json())
    else:
        for note in tally.notes:
            out.note(f"note: {note}")
        for title, items in (
            ("corrupted (not transferred)", tally.corrupted),
            ("unreadable with these keys (not transferred)", tally.unreadable),
            (
                "conflicts (different bytes at the destination; --overwrite replaces)",
                tally.conflicts,
            ),
            ("not verified at the destination", tally.mismatched),
            ("workflows not carried (nothing of them written)", tally.refused),
        ):
            if items:
                out.line(out.style(f"{title}:", "red"))
                for item in items:
                    where = f"line {item['line']}: " if "line" in item else ""
                    wf = item.get("workflow_id")
                    what = "" if wf is None else printable(wf)
                    if "step" in item:
                        what += f" step {item['step']}"
                    if "key" in item:
                        what += f" effect {printable(item['key'])}"
                    reason = f": {printable(item['reason'])}" if "reason" in item else ""
                    out.line(f"  {where}{what}{reason}")
        if tally.foreign:
            out.line(out.style("foreign rows (not transferred):", "red"))
            for row in tally.foreign:
                out.line(f"  workflow id {printable(row.shown)}: {row.reason}")
        out.line(summary)
    return tally.status


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
        open_store(
            args.src, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
        ) as src,
        open_store(
            args.dst, must_exist=False, allow_shared=args.allow_shared, keys=command_keys(args)
        ) as dst,
    ):
        if _same_store(args.src, src, args.dst, dst):
            raise CommandError("the source and destination are the same store", EXIT_USAGE)
        records = await list_records(src)
        journal = Journal(src, sealer_for(command_keys(args)))
        ids, tally.foreign = await workflow_ids(src, [*records, *await journal.workflows()])
        tally.workflows = len(ids)
        sink = Sink(dst, tally, overwrite=args.overwrite)
        effects = JournalSink(dst, tally, overwrite=args.overwrite)
        for n, workflow_id in enumerate(ids, 1):
            record = records.get(workflow_id)
            try:
                steps = await check_journal(journal, effects, workflow_id)
            except WorkflowTransferError as exc:
                tally.refuse(exc)
                continue
            if record is not None:
                await sink.kind(workflow_id, record.kind)
            await carry_journal(journal, effects, workflow_id, steps)
            cursor: int | None = None
            while page := await read_page(src.storage, workflow_id, after=cursor):
                cursor = page[-1].step
                good = await verified(src, workflow_id, page, tally)
                if good:
                    await sink.put(workflow_id, good)
                progress.update(
                    f"copy: {bar(n - 1, len(ids))} workflows, {tally.written} written, "
                    f"{tally.skipped} already there"
                )
            if record is not None:
                reason = (
                    cancel_reason(record) if record.status is WorkflowStatus.CANCELLED else None
                )
                await sink.status(workflow_id, record.status, record.metadata, record.kind, reason)
                await carry_events(src, dst, workflow_id)
        refused = {r["workflow_id"] for r in tally.refused}
        carried = [i for i in ids if i not in refused]
        await _verify_copy(src, dst, carried, tally, progress)
        await _verify_journals(journal, dst, carried, tally)
    progress.clear()
    return report(
        out,
        tally,
        f"copied {tally.written} checkpoints and {tally.effects_written} effect records of "
        f"{tally.workflows - len(tally.refused)} workflows ({tally.skipped} checkpoints and "
        f"{tally.effects_skipped} effect records already there); verified {tally.verified} "
        f"checkpoints and {tally.effects_verified} effect records at the destination",
    )


async def check_journal(journal: Journal, sink: JournalSink, workflow_id: str) -> list[int]:
    """The steps of the workflow's effect journal, once all of it verifies and fits.

    The first of two passes over the source: it checks every record (and the destination's
    records under the same keys) before anything is written; :func:`carry_journal` writes.
    Raises :class:`~aiocheckpoint.WorkflowTransferError`, having written nothing.
    """
    steps = await journal.steps(workflow_id)
    for step in steps:
        await sink.check(workflow_id, await journal.read(workflow_id, step))
    return steps


async def carry_journal(
    journal: Journal, sink: JournalSink, workflow_id: str, steps: list[int]
) -> None:
    """Copy the workflow's effect records of ``steps``, checked by :func:`check_journal`."""
    for step in steps:
        await sink.put(workflow_id, await journal.read(workflow_id, step))


async def _verify_journals(
    journal: Journal, dst: CheckpointManager, ids: list[str], tally: Tally
) -> None:
    """Every carried effect record must be at the destination as is."""
    check = JournalSink(dst, tally, overwrite=False)
    for workflow_id in ids:
        for step in await journal.steps(workflow_id):
            try:
                effects = await journal.read(workflow_id, step)
                missing = await check.pending(workflow_id, effects)
            except WorkflowTransferError as exc:
                where = {"workflow_id": workflow_id, "step": step}
                tally.mismatched.append({**where, "reason": exc.reason})
                continue
            for effect in missing:
                where = {"workflow_id": workflow_id, "step": step, "key": effect.key}
                tally.mismatched.append({**where, "reason": "not at the destination"})
            tally.effects_verified += len(effects) - len(missing)


async def verified(
    src: CheckpointManager,
    workflow_id: str,
    page: list[Record],
    tally: Tally,
    *,
    plaintext: bool = False,
) -> dict[int, bytes]:
    """The page's records that verify, as portable bytes; the others go to the tally.

    Encrypted records stay encrypted unless ``plaintext``.
    """
    good: dict[int, bytes] = {}
    for record in page:
        result = await portable(src, workflow_id, record, plaintext=plaintext)
        if isinstance(result, str):
            tally.problem(result, workflow_id=workflow_id, step=record.step)
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
    left = tally.conflicts + tally.corrupted + tally.unreadable
    skip = {(c["workflow_id"], c["step"]) for c in left}
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
