"""``rekey`` and ``encrypt``: every record of a store sealed under the primary key.

``rekey URL`` re-encrypts the records sealed under another key of the keyring, so that key
can be retired; ``encrypt URL`` also seals the plaintext ones. An incremental record, plain
or encrypted, becomes the equivalent whole record sealed under the primary key: its blobs
(sealed under whichever key wrote them) are then released, and later checkpoints are
incremental again. Each record is verified, sealed and saved on its own (a save
is atomic), so a run stopped anywhere, even by SIGKILL, leaves every record readable with
the keyring and the next run goes on where it stopped: records already under the primary key
are skipped. A record is rewritten only if it still holds the bytes that were read (checked
just before the save); a record a writer changed meanwhile is left to the writer. Effects in
doubt (a call running now) are left for a later run. On a store with leases a workflow's
effect records are re-sealed under its lease, each save fenced by it: a workflow a runner
holds is left to it (reported), and a runner that takes the workflow over refuses the rest.
``docs/encryption.md`` has the details.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Final

from ..codec import (
    FieldSealer,
    Sealer,
    decode_checkpoint,
    decode_effect,
    encode_checkpoint,
    sealed_key_id,
)
from ..control import OPERATOR
from ..errors import CheckpointCorruptedError, EncryptionError, LeaseHeldError, LeaseLostError
from ..format.sealed import is_sealed_tree_record
from ..leases import Lease
from ..manager import CheckpointManager
from ..storage.base import (
    EffectListingStorage,
    EffectStorage,
    StoredCheckpoint,
    StoredEffect,
    WorkflowStorage,
)
from .keys import KEYS_VARIABLE, command_keys
from .output import Output, Progress, bar, printable
from .redact import redact
from .resealfields import reseal_fields
from .store import (
    EXIT_PROBLEMS,
    EXIT_UNREADABLE,
    CommandError,
    Unreadable,
    foreign_json,
    iter_records,
    locked,
    open_store,
    workflow_ids,
)

__all__ = ["cmd_encrypt", "cmd_rekey"]

#: How long rekey holds a workflow's lease while it re-seals its effects (renewed at half).
_LEASE_TTL: Final = 30.0


class _Held(Exception):
    """A runner holds (or took over) the workflow: its effects are left to it."""


@dataclass
class _Tally:
    """What a run did and what it left."""

    checked: int = 0
    resealed: int = 0
    #: Sealed fields (events' texts, records' resume inputs and messages) sealed again.
    texts: int = 0
    #: Plaintext records a ``rekey`` leaves (``encrypt`` seals them).
    plaintext: int = 0
    #: Records a writer changed between the read and the save, and effects in doubt.
    left: int = 0
    bad: list[dict[str, Any]] = field(default_factory=list)
    #: Workflows whose lease a runner held: their effects are left to it.
    held: list[str] = field(default_factory=list)
    #: Records under a key the keyring lacks: left as they are, not corrupted.
    unreadable: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "resealed": self.resealed,
            "texts": self.texts,
            "plaintext": self.plaintext,
            "left": self.left,
            "corrupted": self.bad,
            **({"held": self.held} if self.held else {}),
            **({"unreadable": self.unreadable} if self.unreadable else {}),
        }


async def cmd_rekey(args: argparse.Namespace, out: Output) -> int:
    """Re-encrypt every record sealed under an older key with the primary key."""
    return await _run(args, out, encrypt=False)


async def cmd_encrypt(args: argparse.Namespace, out: Output) -> int:
    """Seal every plaintext record (and re-encrypt older keys' records) with the primary key."""
    return await _run(args, out, encrypt=True)


async def _run(args: argparse.Namespace, out: Output, *, encrypt: bool) -> int:
    keys = command_keys(args)
    if keys is None:
        raise CommandError(f"{args.command} needs the keys: --keys FILE or ${KEYS_VARIABLE}")
    tally = _Tally()
    progress = Progress(out.err)
    # A manager without keys: it decodes plaintext incremental records for ``encrypt``.
    async with open_store(args.url, must_exist=True, allow_shared=args.allow_shared) as plain:
        job = _Job(plain, Sealer(keys, allow_plaintext=True), keys.primary, encrypt, tally)
        listed = plain.storage
        journals = (
            await listed.effect_workflows() if isinstance(listed, EffectListingStorage) else []
        )
        ids, foreign = await workflow_ids(plain, [*journals, *await _recorded(plain)])
        for n, workflow_id in enumerate(ids, 1):
            await job.workflow(workflow_id)
            progress.update(f"{args.command}: {bar(n, len(ids))} workflows")
    progress.clear()
    return _report(out, tally, foreign_json(foreign), encrypt)


async def _recorded(manager: CheckpointManager) -> list[str]:
    """Every workflow with a record (one without checkpoints may hold sealed fields)."""
    if not isinstance(manager.storage, WorkflowStorage):
        return []
    found: list[str] = []
    cursor = None
    while True:
        page = await manager.list_workflows(kind=None, limit=1000, cursor=cursor)
        found += page
        cursor = getattr(page, "next_cursor", None)
        if cursor is None:
            return found


def _report(out: Output, tally: _Tally, foreign: dict[str, Any], encrypt: bool) -> int:
    ok = not (tally.bad or tally.left or foreign or (tally.plaintext and not encrypt))
    status = 0 if ok else EXIT_PROBLEMS
    if ok and tally.unreadable:
        status = EXIT_UNREADABLE
    if out.json_mode:
        out.json({"ok": status == 0, **tally.to_json(), **foreign})
        return status
    if tally.bad or tally.unreadable:
        found = tally.bad + tally.unreadable
        rows = [[printable(b["workflow_id"]), str(b["step"]), b["reason"]] for b in found]
        out.table(["WORKFLOW", "STEP", "PROBLEM"], rows)
    summary = f"checked {tally.checked} records: {tally.resealed} sealed under the primary key"
    if tally.texts:
        summary += f", {tally.texts} sealed texts of events and workflow records too"
    if tally.plaintext:
        summary += f", {tally.plaintext} plaintext left (aiocheckpoint encrypt seals them)"
    if tally.left:
        summary += f", {tally.left} changed meanwhile or in doubt (run again)"
    if tally.held:
        names = ", ".join(printable(w) for w in tally.held[:10])
        more = f" and {len(tally.held) - 10} more" if len(tally.held) > 10 else ""
        summary += f"; effects left to the runner holding {names}{more}"
    if tally.unreadable:
        summary += f", {len(tally.unreadable)} unreadable with these keys (left as they are)"
    out.line(out.style(summary, "green" if status == 0 else "red"))
    return status


class _Job:
    """Re-seals one store's records and effects, one record per save."""

    def __init__(
        self,
        plain: CheckpointManager,
        sealer: Sealer,
        primary: str,
        encrypt: bool,
        tally: _Tally,
    ) -> None:
        self.plain = plain
        self.storage = plain.storage
        # Reads encrypted incremental records (their blobs are sealed too).
        self.keyed = CheckpointManager(
            plain.storage, encryption=sealer.provider, allow_plaintext=True, incremental=False
        )
        self.sealer = sealer
        self.fields = FieldSealer(sealer)
        self.primary = primary
        self.encrypt = encrypt
        self.tally = tally
        #: The lease rekey holds on the current workflow while it re-seals its effects.
        self._lease: Lease | None = None
        self._granted = 0.0
        #: The current workflow has no workflow record: its saves are not fenced.
        self._unrecorded = False

    def _wanted(self, key_id: str | None) -> bool:
        """Whether a record under ``key_id`` (None: plaintext) is to be sealed again."""
        if key_id is None:
            self.tally.plaintext += not self.encrypt
            return self.encrypt
        return key_id != self.primary

    async def workflow(self, workflow_id: str) -> None:
        steps: list[int] = []
        async for record in iter_records(self.storage, workflow_id):
            steps.append(record.step)
            self.tally.checked += 1
            if isinstance(record, Unreadable):
                self._bad(workflow_id, record.step, record.reason)
            elif is_sealed_tree_record(record.data) or self._wanted(sealed_key_id(record.data)):
                await self._record(workflow_id, record)
        await reseal_fields(
            self.storage, self.fields, workflow_id, self.tally, plaintext=self.encrypt
        )
        storage = self.storage
        if not isinstance(storage, EffectStorage):
            return
        if isinstance(storage, EffectListingStorage):  # every step with effect records
            steps = await storage.effect_steps(workflow_id)
        else:  # effects sit at the steps of checkpoints and at the step after the latest
            steps = [*steps, steps[-1] + 1 if steps else 0]
        try:
            for step in steps:
                for item in await storage.load_effects(workflow_id, step):
                    await self._effect(workflow_id, item)
        except _Held:
            self.tally.left += 1
            self.tally.held.append(workflow_id)
        finally:
            await self._release()

    async def _record(self, workflow_id: str, stored: StoredCheckpoint) -> None:
        try:
            plain = await self._plain_record(workflow_id, stored)
        except CheckpointCorruptedError as exc:
            self._bad(workflow_id, stored.step, redact(exc.reason))
            return
        except EncryptionError as exc:
            reason = locked(exc, stored.data)
            self.tally.unreadable.append(
                {"workflow_id": workflow_id, "step": stored.step, "reason": reason}
            )
            return
        sealed = await self.sealer.seal_record(workflow_id, stored.step, plain)
        current = await self.storage.load(workflow_id, stored.step)
        if current is None or current.data != stored.data:
            self.tally.left += current is not None  # deleted meanwhile: nothing to do
            return
        await self.storage.save(workflow_id, stored.step, sealed)
        self.tally.resealed += 1

    async def _plain_record(self, workflow_id: str, stored: StoredCheckpoint) -> bytes:
        """The verified plain version-1 record a stored one holds."""
        data = stored.data
        if len(data) > 4 and data[4] == 2:  # an incremental record: made whole
            reader = self.keyed if is_sealed_tree_record(data) else self.plain
            checkpoint = await reader.decode_record(workflow_id, stored, view="stored")
            return encode_checkpoint(checkpoint)
        plain = await self.sealer.unseal_record(workflow_id, stored.step, data)
        await asyncio.to_thread(decode_checkpoint, plain, workflow_id=workflow_id, step=stored.step)
        return plain

    async def _effect(self, workflow_id: str, item: StoredEffect) -> None:
        self.tally.checked += 1
        if not self._wanted(sealed_key_id(item.data, effect=True)):
            return
        if item.in_doubt:  # its call may be running: its outcome is about to replace it
            self.tally.left += 1
            return
        try:
            plain = await self.sealer.unseal_effect(workflow_id, item.step, item.key, item.data)
            decode_effect(plain)
        except CheckpointCorruptedError as exc:
            self._bad(workflow_id, item.step, f"effect {item.key!r}: {redact(exc.reason)}")
            return
        except EncryptionError as exc:
            reason = f"effect {item.key!r}: {locked(exc, item.data, effect=True)}"
            self.tally.unreadable.append(
                {"workflow_id": workflow_id, "step": item.step, "reason": reason}
            )
            return
        sealed = await self.sealer.seal_effect(workflow_id, item.step, item.key, plain)
        fence = await self._fence(workflow_id)
        storage: Any = self.storage
        now = {e.key: e.data for e in await storage.load_effects(workflow_id, item.step)}
        if now.get(item.key) != item.data:
            self.tally.left += item.key in now
            return
        try:
            await storage.put_effect(
                workflow_id, item.step, item.key, sealed, in_doubt=False, fence=fence
            )
        except LeaseLostError as exc:  # a runner took the workflow over: its records stand
            raise _Held from exc
        self.tally.resealed += 1

    async def _fence(self, workflow_id: str) -> Lease | None:
        """The workflow's lease for an effect's save (None: the store has no leases).

        Held, a runner cannot write the record between the check and the save; a runner
        holding it now makes rekey leave the workflow's effects to it. A workflow without a
        record (effects of a first step run without a lease) has no lease to take: taking
        one would create its record, and make it claimable.
        """
        storage = self.storage
        if not isinstance(storage, WorkflowStorage) or self._unrecorded:
            return None
        try:
            if self._lease is None:
                if await storage.get_workflow(workflow_id) is None:
                    self._unrecorded = True
                    return None
                self._lease = await storage.acquire_lease(workflow_id, OPERATOR, _LEASE_TTL)
                self._granted = time.monotonic()
            elif time.monotonic() - self._granted > _LEASE_TTL / 2:
                self._lease = await storage.renew_lease(self._lease, _LEASE_TTL)
                self._granted = time.monotonic()
        except (LeaseHeldError, LeaseLostError) as exc:
            raise _Held from exc
        return self._lease

    async def _release(self) -> None:
        lease, self._lease, self._unrecorded = self._lease, None, False
        if lease is not None and isinstance(self.storage, WorkflowStorage):
            await self.storage.release_lease(lease)

    def _bad(self, workflow_id: str, step: int, reason: str) -> None:
        self.tally.bad.append({"workflow_id": workflow_id, "step": step, "reason": reason})
