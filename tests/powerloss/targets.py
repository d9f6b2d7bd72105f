"""The systems a power-loss trial writes to and then checks, behind one small interface.

A target is named ``"module:Class"`` so that a writer process can build it; it is made with
the directory it lives in (on the LazyFS mount) and a JSON-ready dict of options. Besides
aiocheckpoint's stores, ``RenameWithoutFsync`` is a deliberately unsafe writer that the
harness must catch; the peers of the bench (LangGraph, the seed) are in bench/powerloss.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .workload import digest

#: What ``records`` and ``load`` give for one step: the state's digest, or "!" + why it
#: does not verify.
Outcome = str


def warm() -> None:
    """Import what the writers use before the zygote forks them (stores open lazily)."""
    from aiocheckpoint import open_storage

    for url in ("file:/nonexistent", "sqlite:/nonexistent.db"):
        open_storage(url)


class Target:
    """One store under trial. Reads return digests so the parent can compare them."""

    def __init__(self, path: Path, options: dict[str, Any]) -> None:
        self.path = path
        self.options = options

    async def open(self) -> None:
        """Open (or create) the store."""

    async def save(self, wf: str, step: int, state: dict[str, Any], keep: int | None) -> None:
        """Save durably; return only when the system says the checkpoint is stored."""
        raise NotImplementedError

    async def collect(self) -> None:
        """One round of the system's garbage collection, if it has one."""

    def audit_lazyfs(self, disk: str, report: Callable[[str], object]) -> None:
        """Before the first write: check what LazyFS answers against its disk (audit.py), if
        the target can; ``disk`` is LazyFS's backing directory, ``report`` sends a line."""

    async def workflows(self) -> list[str]:
        """Every workflow with a visible record."""
        raise NotImplementedError

    async def records(self, wf: str, since: int) -> dict[int, Outcome]:
        """Every visible step from ``since`` on, with its outcome."""
        raise NotImplementedError

    async def load(self, wf: str, step: int) -> Outcome | None:
        """One step's outcome, or None if it is not there."""
        raise NotImplementedError

    async def latest(self, wf: str) -> int | None:
        """Where a restarted workflow would resume from: the step of its latest record."""
        raise NotImplementedError

    def record_inodes(self, wf: str, low: int) -> dict[int, int]:
        """The inodes of the files holding the workflow's records from step ``low`` on, by
        step (empty if the target keeps no record in a file of its own)."""
        return {}

    async def close(self) -> None:
        """Release everything."""


class Aiocheckpoint(Target):
    """``CheckpointManager`` over ``open_storage``: options ``backend`` ("file" or "sqlite")
    and ``storage`` (the store's constructor options)."""

    async def open(self) -> None:
        from aiocheckpoint import CheckpointManager, open_storage

        backend = self.options["backend"]
        url = f"file:{self.path / 'store'}" if backend == "file" else f"sqlite:{self.path}/store.db"
        self.storage = open_storage(url, **self.options.get("storage", {}))
        self.managers: dict[int | None, CheckpointManager] = {}
        self.reader = self.manager(None)

    def audit_lazyfs(self, disk: str, report: Callable[[str], object]) -> None:
        if self.options["backend"] != "file":
            return
        import logging

        from .audit import GCReadAudit

        self.storage._os = self.fsync_audit(disk, report)
        workflows = self.storage._root
        logging.getLogger("aiocheckpoint.storage.file.gc").addHandler(
            GCReadAudit(str(self.path), disk, workflows, report)
        )

    def fsync_audit(self, disk: str, report: Callable[[str], object]) -> Any:
        """The file store's OS calls, each fsync audited (audit.py)."""
        from .audit import FsyncAudit

        return FsyncAudit(str(self.path), disk, report)

    def record_inodes(self, wf: str, low: int) -> dict[int, int]:
        if self.options["backend"] != "file":
            return {}
        from aiocheckpoint.storage.file.names import parse_step_name

        out: dict[int, int] = {}
        with (
            contextlib.suppress(FileNotFoundError),
            os.scandir(self.storage.workflow_dir(wf)) as it,
        ):
            for entry in it:
                step = parse_step_name(entry.name)
                if step is not None and step >= low:
                    out[step] = entry.inode()
        return out

    def manager(self, keep: int | None) -> Any:
        """The manager that applies retention ``keep`` (one per value, one storage)."""
        from aiocheckpoint import CheckpointManager

        if keep not in self.managers:
            self.managers[keep] = CheckpointManager(self.storage, max_checkpoints=keep)
        return self.managers[keep]

    async def save(self, wf: str, step: int, state: dict[str, Any], keep: int | None) -> None:
        await self.manager(keep).create_checkpoint(wf, step, "powerloss", "completed", state)

    async def collect(self) -> None:
        import contextlib

        from aiocheckpoint import CheckpointCorruptedError

        # A record it could not read holds it back (logged, audited): it deletes nothing.
        with contextlib.suppress(CheckpointCorruptedError):
            await self.storage.collect_garbage()

    async def workflows(self) -> list[str]:
        return list(await self.reader.list_workflows())

    async def records(self, wf: str, since: int) -> dict[int, Outcome]:
        from aiocheckpoint import CheckpointCorruptedError

        out: dict[int, Outcome] = {}
        for stored in await self.storage.scan(wf, after=since - 1 if since else None):
            try:
                checkpoint = await self.reader.decode_record(wf, stored)
            except CheckpointCorruptedError as exc:
                out[stored.step] = f"!{exc}"
            else:
                out[stored.step] = digest(checkpoint.state_snapshot.data)
        return out

    async def load(self, wf: str, step: int) -> Outcome | None:
        from aiocheckpoint import CheckpointCorruptedError, CheckpointNotFoundError

        try:
            checkpoint = await self.reader.get_checkpoint(wf, step)
        except CheckpointNotFoundError:
            return None
        except CheckpointCorruptedError as exc:
            return f"!{exc}"
        return digest(checkpoint.state_snapshot.data)

    async def latest(self, wf: str) -> int | None:
        latest = await self.reader.get_latest_checkpoint(wf)
        resume = await self.reader.get_resume_point(wf)
        if latest is None or resume is None:
            return None
        return min(latest.step, resume[0] - 1)  # saved COMPLETED: resume at the next step

    async def close(self) -> None:
        await self.reader.close()


class AiocheckpointEffects(Aiocheckpoint):
    """As :class:`Aiocheckpoint`, each save first durably records an effect of its step
    (``put_effect``, the state's digest as the record), then checkpoints the step: with
    many writer tasks, effect records and checkpoints share group commits.

    A step's outcome is its state's digest only if its effect record is there and holds
    that digest: the effect was acknowledged before the checkpoint was written, so a visible
    checkpoint, and every acknowledged step, must have it (``!effect ...`` otherwise).
    """

    async def save(self, wf: str, step: int, state: dict[str, Any], keep: int | None) -> None:
        await self.put_effect(wf, step, digest(state).encode())
        await super().save(wf, step, state, keep)

    async def put_effect(self, wf: str, step: int, record: bytes) -> None:
        """Record the step's effect; durable when it returns."""
        await self.storage.put_effect(wf, step, "effect", record, in_doubt=False)

    async def effects(self, wf: str, step: int) -> list[tuple[str, bool, bytes]]:
        """The step's effect records: key, in doubt, bytes."""
        return [(e.key, e.in_doubt, e.data) for e in await self.storage.load_effects(wf, step)]

    async def records(self, wf: str, since: int) -> dict[int, Outcome]:
        found = await super().records(wf, since)
        return {step: await self._with_effect(wf, step, out) for step, out in found.items()}

    async def load(self, wf: str, step: int) -> Outcome | None:
        outcome = await super().load(wf, step)
        return None if outcome is None else await self._with_effect(wf, step, outcome)

    async def _with_effect(self, wf: str, step: int, outcome: Outcome) -> Outcome:
        if outcome.startswith("!"):
            return outcome
        effects = await self.effects(wf, step)
        if effects != [("effect", False, outcome.encode())]:
            return f"!effect lost or torn: {effects!r}"
        return outcome


class EffectsWithoutFsync(AiocheckpointEffects):
    """Deliberately unsafe effect records (a file written without fsync) beside the store's
    checkpoints: the harness must catch the effect records it loses."""

    def _path(self, wf: str, step: int) -> Path:
        return self.path / "unsafe-effects" / wf / str(step)

    async def put_effect(self, wf: str, step: int, record: bytes) -> None:
        path = self._path(wf, step)
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(path.write_bytes, record)

    async def effects(self, wf: str, step: int) -> list[tuple[str, bool, bytes]]:
        try:
            return [("effect", False, await asyncio.to_thread(self._path(wf, step).read_bytes))]
        except FileNotFoundError:
            return []


class RenameWithoutFsync(Target):
    """Deliberately unsafe: a JSON file per step, written and renamed into place without
    any fsync (what the seed's file store does). The harness must catch it losing data."""

    def _dir(self, wf: str) -> Path:
        return self.path / "unsafe" / wf

    def _save(self, wf: str, step: int, state: dict[str, Any]) -> None:
        directory = self._dir(wf)
        directory.mkdir(parents=True, exist_ok=True)
        temp = directory / f".{step}.tmp"
        temp.write_text(json.dumps(state))
        os.rename(temp, directory / f"{step}.json")

    async def save(self, wf: str, step: int, state: dict[str, Any], keep: int | None) -> None:
        await asyncio.to_thread(self._save, wf, step, state)

    async def workflows(self) -> list[str]:
        root = self.path / "unsafe"
        return sorted(os.listdir(root)) if root.is_dir() else []

    def _steps(self, wf: str) -> list[int]:
        return sorted(int(n[:-5]) for n in os.listdir(self._dir(wf)) if n.endswith(".json"))

    def _outcome(self, wf: str, step: int) -> Outcome | None:
        try:
            text = (self._dir(wf) / f"{step}.json").read_text()
        except FileNotFoundError:
            return None
        try:
            return digest(json.loads(text))
        except ValueError as exc:
            return f"!{exc}"

    async def records(self, wf: str, since: int) -> dict[int, Outcome]:
        return {s: o for s in self._steps(wf) if s >= since and (o := self._outcome(wf, s))}

    async def load(self, wf: str, step: int) -> Outcome | None:
        return self._outcome(wf, step)

    async def latest(self, wf: str) -> int | None:
        steps = self._steps(wf)
        return steps[-1] if steps else None


class DiskDropsAnFsync(Aiocheckpoint):
    """As :class:`Aiocheckpoint`, but in every other trial of a store the first record of a
    workflow without retention loses its data on LazyFS's disk right after its fsync (it
    is truncated there, as a LazyFS that does not honour an fsync leaves it). The writer's
    audit sees it: the harness must blame LazyFS for that record, and only for it."""

    def fsync_audit(self, disk: str, report: Callable[[str], object]) -> Any:
        from .audit import FsyncAudit

        trial = 0
        while True:  # metadata is durable on LazyFS at once: a count that survives cuts
            try:
                os.mkdir(self.path / f"trial-{trial}")
                break
            except FileExistsError:
                trial += 1
        drop = trial % 2 == 0

        class Dropping(FsyncAudit):
            def fsync(self, fd: int) -> None:
                nonlocal drop
                found = self.on_disk(fd)
                if not (drop and found and "-all/.tmp-" in found[0]):
                    super().fsync(fd)
                    return
                drop = False
                super(FsyncAudit, self).fsync(fd)
                os.truncate(found[0], 0)
                self.check(fd)

        return Dropping(str(self.path), disk, self.reporter(report))

    def reporter(self, report: Callable[[str], object]) -> Callable[[str], object]:
        """Where the audit's reports go."""
        return report


class DiskDropsAnFsyncUnseen(DiskDropsAnFsync):
    """As :class:`DiskDropsAnFsync`, with the audit's reports thrown away: the same loss,
    without the evidence that LazyFS caused it, is the store's and fails the trials."""

    def reporter(self, report: Callable[[str], object]) -> Callable[[str], object]:
        return lambda line: None
