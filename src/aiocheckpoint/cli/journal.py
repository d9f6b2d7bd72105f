"""Effect journals in ``copy``, ``export`` and ``import``: read whole, verified, written first.

A workflow travels with its effect journal (``docs/effects.md``): a store that received its
checkpoints but not the record of a call already made would make that call again. So every
effect record of a workflow, the records of steps without a checkpoint included, is
verified before anything of the workflow is written: unsealed with ``--keys`` when it is
encrypted, decoded, and its workflow, step, key and in-doubt flag checked against where it
is stored. A workflow with a record that fails, or that differs at the destination, is
refused whole (:class:`~aiocheckpoint.WorkflowTransferError`). At the destination the
effect records are written before the checkpoints: a transfer stopped in between leaves a
journal without its checkpoints (a re-run completes it), never checkpoints without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .._validation import check_step, check_workflow_id
from ..codec import ENVELOPE_MAGIC, Keyring, Sealer, decode_effect
from ..errors import (
    CheckpointCorruptedError,
    CheckpointError,
    EncryptionError,
    WorkflowTransferError,
)
from ..manager import CheckpointManager
from ..storage.base import EffectListingStorage, EffectStorage, StoredEffect, check_effect_key
from .keys import KEYS_VARIABLE
from .redact import redact
from .store import locked

__all__ = [
    "Counts",
    "Effect",
    "Journal",
    "JournalSink",
    "check_effect",
    "check_entry",
    "sealer_for",
]


@dataclass(frozen=True, slots=True)
class Effect:
    """One effect record as carried: the stored bytes (or the plain record, decrypted)."""

    step: int
    key: str
    in_doubt: bool
    data: bytes


def sealer_for(keys: Keyring | None) -> Sealer | None:
    """The sealer that opens encrypted effect records with the command's keys, if any."""
    return None if keys is None else Sealer(keys, allow_plaintext=True)


async def check_effect(
    sealer: Sealer | None, workflow_id: str, stored: StoredEffect, *, plaintext: bool = False
) -> Effect:
    """The effect record as carried, once it verifies where it is stored.

    Raises :class:`~aiocheckpoint.WorkflowTransferError` naming the effect and the reason.
    With ``plaintext`` an encrypted record is carried decrypted.
    """
    where = f"effect {stored.key!r} of step {stored.step}"
    plain = stored.data
    try:
        if plain.startswith(ENVELOPE_MAGIC):
            if sealer is None:
                raise WorkflowTransferError(
                    workflow_id, f"{where} is encrypted: pass --keys FILE (or {KEYS_VARIABLE})"
                )
            plain = await sealer.unseal_effect(workflow_id, stored.step, stored.key, plain)
        record = decode_effect(plain)
    except CheckpointCorruptedError as exc:
        raise WorkflowTransferError(workflow_id, f"{where}: {redact(exc.reason)}") from None
    except EncryptionError as exc:  # a key the keys given lack: refused as unreadable
        reason = locked(exc, stored.data, effect=True)
        raise WorkflowTransferError(workflow_id, f"{where}: {reason}") from None
    if (record.workflow_id, record.step, record.key) != (workflow_id, stored.step, stored.key):
        raise WorkflowTransferError(
            workflow_id, f"{where} holds the record of another workflow, step or key"
        )
    if record.in_doubt != stored.in_doubt:
        raise WorkflowTransferError(
            workflow_id, f"{where} is {record.state.value} but stored with the wrong in-doubt flag"
        )
    return Effect(stored.step, stored.key, stored.in_doubt, plain if plaintext else stored.data)


def check_entry(workflow_id: str, step: object, key: object, in_doubt: object) -> StoredEffect:
    """The parts of an export's effect line, checked (``data`` left empty)."""
    try:
        return StoredEffect(check_step(step), check_effect_key(key), _flag(in_doubt), b"")
    except CheckpointError as exc:
        raise WorkflowTransferError(
            check_workflow_id(workflow_id), f"a malformed effect line: {exc}"
        ) from None


def _flag(value: object) -> bool:
    if type(value) is not bool:
        raise CheckpointCorruptedError(f"in_doubt must be true or false, not {value!r}"[:200])
    return value


class Journal:
    """A source store's effect journals, read and verified one step at a time."""

    def __init__(
        self, manager: CheckpointManager, sealer: Sealer | None, *, plaintext: bool = False
    ) -> None:
        storage = manager.storage
        self._storage = storage if isinstance(storage, EffectStorage) else None
        self._sealer = sealer
        self._plaintext = plaintext

    async def workflows(self) -> list[str]:
        """Every workflow with an effect record (none where the store lists none)."""
        if not isinstance(self._storage, EffectListingStorage):
            return []
        return await self._storage.effect_workflows()

    async def steps(self, workflow_id: str) -> list[int]:
        """The workflow's steps with effect records; refused if the store cannot list them."""
        if self._storage is None:
            return []
        if not isinstance(self._storage, EffectListingStorage):
            raise WorkflowTransferError(
                workflow_id,
                f"{type(self._storage).__name__} cannot list its effect journal "
                "(EffectListingStorage)",
            )
        return await self._storage.effect_steps(workflow_id)

    async def read(self, workflow_id: str, step: int) -> list[Effect]:
        """One step's effect records, each verified (WorkflowTransferError if one fails)."""
        assert self._storage is not None
        try:
            stored = await self._storage.load_effects(workflow_id, step)
        except CheckpointCorruptedError as exc:
            reason = f"the effects of step {step}: {redact(exc.reason)}"
            raise WorkflowTransferError(workflow_id, reason) from None
        return [
            await check_effect(self._sealer, workflow_id, item, plaintext=self._plaintext)
            for item in stored
        ]

    async def check(self, workflow_id: str) -> list[int]:
        """Verify the workflow's whole journal; its steps with effects."""
        steps = await self.steps(workflow_id)
        for step in steps:
            await self.read(workflow_id, step)
        return steps


class Counts(Protocol):
    """Where a sink counts the effect records it wrote and skipped (a transfer's Tally)."""

    effects_written: int
    effects_skipped: int


class JournalSink:
    """Writes effect records into a store, skipping those already there byte for byte."""

    def __init__(self, manager: CheckpointManager, counts: Counts, *, overwrite: bool) -> None:
        storage = manager.storage
        self._storage = storage if isinstance(storage, EffectStorage) else None
        self._limit: int = getattr(storage, "max_record_bytes", 0) or 2**63
        self._counts = counts
        self.overwrite = overwrite

    async def check(self, workflow_id: str, effects: list[Effect]) -> None:
        """WorkflowTransferError unless every record can be written (or is already there)."""
        if not effects:
            return
        if self._storage is None:
            raise WorkflowTransferError(workflow_id, "the destination keeps no effect journal")
        for effect in effects:
            if len(effect.data) > self._limit:
                raise WorkflowTransferError(
                    workflow_id,
                    f"effect {effect.key!r} of step {effect.step} is {len(effect.data)} bytes, "
                    f"over the destination's max_record_bytes ({self._limit})",
                )
        await self.pending(workflow_id, effects)

    async def put(self, workflow_id: str, effects: list[Effect]) -> None:
        """Write the records not already there (after :meth:`check` passed for them)."""
        if not effects:
            return
        todo = await self.pending(workflow_id, effects)
        assert self._storage is not None
        for effect in todo:
            await self._storage.put_effect(
                workflow_id, effect.step, effect.key, effect.data, in_doubt=effect.in_doubt
            )
        self._counts.effects_written += len(todo)
        self._counts.effects_skipped += len(effects) - len(todo)

    async def pending(self, workflow_id: str, effects: list[Effect]) -> list[Effect]:
        """The records not at the destination yet.

        Raises WorkflowTransferError for one that differs there (unless ``overwrite``).
        """
        assert self._storage is not None
        there: dict[tuple[int, str], StoredEffect] = {}
        for step in sorted({e.step for e in effects}):
            try:
                found = await self._storage.load_effects(workflow_id, step)
            except CheckpointCorruptedError as exc:
                if not self.overwrite:
                    reason = f"the destination's effects of step {step}: {redact(exc.reason)}"
                    raise WorkflowTransferError(workflow_id, reason) from None
                found = []
            there.update(((s.step, s.key), s) for s in found)
        todo = []
        for effect in effects:
            have = there.get((effect.step, effect.key))
            if have is not None and (have.in_doubt, have.data) == (effect.in_doubt, effect.data):
                continue
            if have is not None and not self.overwrite:
                raise WorkflowTransferError(
                    workflow_id,
                    f"effect {effect.key!r} of step {effect.step} differs at the destination "
                    "(--overwrite replaces it)",
                )
            todo.append(effect)
        return todo
