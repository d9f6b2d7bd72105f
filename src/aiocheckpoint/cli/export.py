"""``export``: every verified record of a store, written to a JSON-lines file.

The file is written to a temporary file next to it, fsynced and renamed into place, so the
named file is never a partial export.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
from typing import IO, Any, Final

from ..format import FORMAT_VERSION as RECORD_FORMAT
from ..leases import WorkflowRecord
from ..manager import CheckpointManager
from ..models import utcnow
from .output import Output, Progress, bar
from .store import EXIT_STORE, CommandError, open_store, read_page
from .transfer import Tally, list_records, report, verified

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "cmd_export"]

#: The export file's format name and version (the header line carries both).
EXPORT_FORMAT: Final = "aiocheckpoint-export"
EXPORT_VERSION: Final = 1


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
        records = await list_records(src)
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
    return report(
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
        good = await verified(src, workflow_id, page, tally)
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
