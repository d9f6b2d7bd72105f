"""``export``: every verified record of a store, written to a JSON-lines file.

The file is written to a temporary file next to it, fsynced and renamed into place, so the
named file is never a partial export; both are private to their owner (0600).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import stat
import sys
from typing import IO, Any, Final

from ..codec import FieldSealer
from ..errors import WorkflowTransferError
from ..format import FORMAT_VERSION as RECORD_FORMAT
from ..leases import WorkflowRecord
from ..manager import CheckpointManager
from ..models import utcnow
from .eventlines import event_line, read_events
from .journal import Journal, sealer_for
from .keys import command_keys
from .output import Output, Progress, bar, printable
from .store import EXIT_STORE, CommandError, open_store, read_page, workflow_ids
from .transfer import Tally, list_records, report, verified

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "EXPORT_VERSIONS", "cmd_export"]

#: The export file's format name and version (the header line carries both).
EXPORT_FORMAT: Final = "aiocheckpoint-export"
EXPORT_VERSION: Final = 3
#: The versions ``import`` reads (version 1 files hold no effect records, 2 no events).
EXPORT_VERSIONS: Final = (1, 2, 3)


#: An export is written to ``.FILE.tmp-PID`` next to FILE, then renamed to FILE.
_TMP_INFIX: Final = ".tmp-"


class _ExportFile:
    """Lines written to a private temporary file that replaces FILE once it is complete.

    The temporary file is created 0600 (an export holds the store's data; stores are
    private), so FILE ends up 0600 too. An export killed mid-way leaves its temporary file
    behind: the next export to the same FILE removes the ones whose process is gone.
    """

    def __init__(self, path: str, fh: IO[bytes], tmp: str | None) -> None:
        self._path = path
        self._fh = fh
        self._tmp = tmp

    @classmethod
    async def create(cls, path: str) -> _ExportFile:
        """The export file for ``path`` (``-``: stdout), its temporary file created."""
        if path == "-":
            return cls(path, sys.stdout.buffer, None)
        try:
            return await asyncio.to_thread(cls._create, path)
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc.strerror}", EXIT_STORE) from exc

    @classmethod
    def _create(cls, path: str) -> _ExportFile:
        directory, name = os.path.split(os.path.abspath(path))
        _remove_stale_temporaries(directory, name)
        tmp = os.path.join(directory, f".{name}{_TMP_INFIX}{os.getpid()}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(tmp, flags, 0o600)
        return cls(path, os.fdopen(fd, "wb"), tmp)

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


def _remove_stale_temporaries(directory: str, name: str) -> None:
    """Remove the temporary files of exports to ``name`` whose process no longer runs.

    Only regular files of this user named exactly ``.NAME.tmp-PID`` are touched. One whose
    PID has been reused by a live process stays until a run after that process ends.
    """
    prefix = f".{name}{_TMP_INFIX}"
    with os.scandir(directory) as entries:
        for entry in entries:
            pid = entry.name[len(prefix) :] if entry.name.startswith(prefix) else ""
            if not (pid.isascii() and pid.isdigit() and len(pid) <= 10) or _running(int(pid)):
                continue
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def _running(pid: int) -> bool:
    """Whether a process other than this one has id ``pid``."""
    if pid in (0, os.getpid()):
        return False  # our own id: a dead process had it, since we have not written yet
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except (OverflowError, OSError):
        return False
    return True


def _line(obj: dict[str, Any]) -> str:
    """One JSON line, with control, bidi and other unprintable characters as JSON escapes.

    Ids and keys are arbitrary text: written raw, a C1 control or a bidi override would
    reach a terminal that shows the file. Escaped, the line is still equal JSON.
    """
    return printable(json.dumps(obj, ensure_ascii=False, separators=(",", ":")), json_escapes=True)


async def cmd_export(args: argparse.Namespace, out: Output) -> int:
    """Write every verified record of a store to a JSON-lines file."""
    tally = Tally()
    progress = Progress(out.err)
    async with open_store(
        args.url, must_exist=True, allow_shared=args.allow_shared, keys=command_keys(args)
    ) as src:
        records = await list_records(src)
        journal = Journal(src, sealer_for(command_keys(args)), plaintext=args.plaintext)
        fields = FieldSealer(sealer_for(command_keys(args))) if args.plaintext else None
        ids, tally.foreign = await workflow_ids(src, [*records, *await journal.workflows()])
        tally.workflows = len(ids)
        file = await _ExportFile.create(args.file)
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
                try:
                    await _export_journal(journal, workflow_id, file, tally)
                except WorkflowTransferError as exc:
                    tally.refuse(exc)
                    continue
                await _export_workflow(
                    src, workflow_id, records.get(workflow_id), file, tally, fields
                )
                progress.update(
                    f"export: {bar(n, len(ids))} workflows, {tally.written} checkpoints"
                )
            end = {
                "type": "end",
                "checkpoints": tally.written,
                "effects": tally.effects_written,
                "workflows": len(ids) - len(tally.refused),
            }
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
        out,
        tally,
        f"exported {tally.written} checkpoints and {tally.effects_written} effect records of "
        f"{tally.workflows - len(tally.refused)} workflows",
    )


async def _export_journal(
    journal: Journal, workflow_id: str, file: _ExportFile, tally: Tally
) -> None:
    """The workflow's effect lines, before its checkpoints; refused before any is written.

    WorkflowTransferError when a record does not verify (the first pass reads them all).
    """
    for step in await journal.check(workflow_id):
        effects = await journal.read(workflow_id, step)
        await file.write(
            [
                _line(
                    {
                        "type": "effect",
                        "workflow_id": workflow_id,
                        "step": step,
                        "key": effect.key,
                        "in_doubt": effect.in_doubt,
                        "record": base64.b64encode(effect.data).decode("ascii"),
                    }
                )
                for effect in effects
            ]
        )
        tally.effects_written += len(effects)


async def _export_workflow(
    src: CheckpointManager,
    workflow_id: str,
    record: WorkflowRecord | None,
    file: _ExportFile,
    tally: Tally,
    fields: FieldSealer | None,
) -> None:
    """The workflow's checkpoint, workflow and event lines; ``fields``: written decrypted."""
    plaintext = fields is not None
    cursor: int | None = None
    while page := await read_page(src.storage, workflow_id, after=cursor):
        cursor = page[-1].step
        good = await verified(src, workflow_id, page, tally, plaintext=plaintext)
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
        line: dict[str, Any] = {
            "type": "workflow",
            "workflow_id": workflow_id,
            "status": record.status.value,
            "kind": record.kind,
        }
        if record.metadata:
            line["metadata"] = record.metadata
        await file.write([_line(line)])
        events = await read_events(src, workflow_id)
        lines = [event_line(workflow_id, e) for e in events]
        if fields is not None:  # --plaintext: the sealed fields opened, as the records are
            for line in lines:
                line["data"] = await fields.open_event(workflow_id, line["kind"], line["data"])
        await file.write([_line(line) for line in lines])
