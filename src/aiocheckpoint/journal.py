"""The effect journal: what the manager asks of an :class:`EffectStorage` (``docs/effects.md``).

:class:`EffectJournal` checks the arguments, takes effect records through the record
pipeline (their results through the value stage, their bytes sealed when the manager seals)
and makes the storage calls; :class:`EffectJournalMethods` is the part of
:class:`~aiocheckpoint.CheckpointManager`'s API that delegates to it. What runs an effect
for a step is :mod:`aiocheckpoint.effects`; how an effect in doubt is settled,
:mod:`aiocheckpoint.doubt`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from ._telemetry import round_trip
from ._validation import check_step, check_workflow_id
from .codec import EffectRecord, RecordCodec
from .doubt import open_records, reopen_before_settle, settled
from .errors import InvalidArgumentError, LeaseLostError, UnsupportedOperationError
from .leases import Lease, fence_token
from .storage.base import CheckpointStorage, EffectStorage, check_effect_key
from .workflow_records import WorkflowRecords

__all__ = ["EffectJournal", "EffectJournalMethods"]

#: The owner and TTL of the lease :meth:`EffectJournal.resolve` takes for its write.
_RESOLVER: Final = "aiocheckpoint-resolve-effect"
_RESOLVE_TTL: Final = 30.0


class EffectJournal:
    """The effect journal of one storage, for one manager.

    ``codec`` is the manager's record pipeline; ``records`` its workflow records, whose
    leases fence the journal's writes.
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        codec: RecordCodec,
        records: WorkflowRecords,
        check_open: Callable[[], None],
    ) -> None:
        self._storage = storage
        self._codec = codec
        self._records = records
        self._check_open = check_open
        # Checked once: a runtime protocol check walks the protocol's members (~90 us), and
        # every effect record would pay it.
        self._effects: EffectStorage | None = (
            storage if isinstance(storage, EffectStorage) else None
        )

    @property
    def supported(self) -> bool:
        """Whether the storage keeps an effect journal."""
        return self._effects is not None

    def storage(self) -> EffectStorage:
        """The storage, as an :class:`EffectStorage`; UnsupportedOperationError if it is not."""
        if self._effects is None:
            raise UnsupportedOperationError(
                f"{type(self._storage).__name__} keeps no effect journal (docs/effects.md)"
            )
        return self._effects

    async def record(self, record: EffectRecord, lease: Lease | None) -> EffectRecord:
        """``record_effect``: an intent or outcome stored, as it will read back."""
        self._check_open()
        workflow_id = check_workflow_id(record.workflow_id)
        step = check_step(record.step)
        key = check_effect_key(record.key)
        codec = self._codec
        data, result = codec.encode_effect(record)
        data = await codec.seal_effect(workflow_id, step, key, data)
        if lease is not None:
            fence_token(lease, workflow_id)
            self._records.workflow_storage()  # raises if the storage keeps no leases
        await round_trip(
            self.storage().put_effect,
            workflow_id,
            step,
            key,
            data,
            in_doubt=record.in_doubt,
            fence=lease,
        )
        return record if result is record.result else replace(record, result=result)

    async def load(self, workflow_id: str, step: int) -> list[EffectRecord]:
        """``get_effects``: one step's journal, ordered by key."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        stored = await round_trip(self.storage().load_effects, workflow_id, check_step(step))
        return await open_records(self._codec.open_effect, workflow_id, stored)

    async def in_doubt(self, workflow_id: str) -> list[EffectRecord]:
        """``list_in_doubt_effects``: the workflow's effects in doubt, by step then key."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        stored = await round_trip(self.storage().in_doubt_effects, workflow_id)
        return await open_records(self._codec.open_effect, workflow_id, stored)

    async def in_doubt_workflows(self) -> list[str]:
        """``list_in_doubt_workflows``: every workflow with an effect in doubt, sorted."""
        self._check_open()
        return await self.storage().in_doubt_workflows()

    async def resolve(
        self, workflow_id: str, step: int, key: str, happened: Any, result: Any, lease: Any
    ) -> EffectRecord:
        """``resolve_effect``: an effect in doubt settled, under ``lease`` or one of its own."""
        if not isinstance(happened, bool):
            raise InvalidArgumentError(f"happened must be a bool, not {happened!r}")
        records = self._records
        if lease is not None or not records.supported:
            return await self._resolve(workflow_id, step, key, happened, result, lease)
        own = await records.acquire(workflow_id, _RESOLVER, _RESOLVE_TTL)
        try:
            return await self._resolve(workflow_id, step, key, happened, result, own)
        finally:
            await records.release(own)

    async def _resolve(
        self,
        workflow_id: str,
        step: int,
        key: str,
        happened: bool,
        result: Any,
        lease: Lease | None,
    ) -> EffectRecord:
        wanted = check_effect_key(key)
        found = [r for r in await self.load(workflow_id, step) if r.key == wanted]
        if not found or not found[0].in_doubt:
            await self._check_current(lease, workflow_id)
            raise InvalidArgumentError(
                f"step {step} of workflow {workflow_id!r} has no effect {wanted!r} in doubt"
            )
        record = settled(found[0], happened, result)
        records = self._records
        if lease is not None and records.supported:
            self._codec.encode_effect(record)  # an unstorable result fails before any write
            await reopen_before_settle(records.workflow_storage(), self.storage(), record, lease)
        return await self.record(record, lease)

    async def _check_current(self, lease: Lease | None, workflow_id: str) -> None:
        """LeaseLostError if ``lease`` is no longer the workflow's (a runner taken over)."""
        if lease is None or not self._records.supported:
            return
        record = await self._records.get(workflow_id)
        if record is None or record.fencing_token != fence_token(lease, workflow_id):
            raise LeaseLostError(
                f"lease {lease.token} on workflow {workflow_id!r} is no longer current"
            )


class EffectJournalMethods:
    """:class:`~aiocheckpoint.CheckpointManager`'s effect journal (``docs/effects.md``)."""

    _journal: EffectJournal

    def supports_effects(self) -> bool:
        """Whether the storage keeps an effect journal (every bundled backend does)."""
        return self._journal.supported

    async def record_effect(
        self, record: EffectRecord, *, lease: Lease | None = None
    ) -> EffectRecord:
        """Durably store an effect's intent or outcome (fenced by ``lease`` when given).

        :meth:`ResumableWorkflow.effect <aiocheckpoint.ResumableWorkflow.effect>` calls it.
        Its result is copied through the value stage, so an unstorable result raises
        :class:`~aiocheckpoint.CheckpointSerializationError` before anything is written;
        returns the record as stored (holding that copy).
        """
        return await self._journal.record(record, lease)

    async def get_effects(self, workflow_id: str, step: int) -> list[EffectRecord]:
        """The effect journal of one step, ordered by key (empty when it has none)."""
        return await self._journal.load(workflow_id, step)

    async def list_in_doubt_effects(self, workflow_id: str) -> list[EffectRecord]:
        """The workflow's effects in doubt (to :meth:`resolve_effect`), by step then key."""
        return await self._journal.in_doubt(workflow_id)

    async def list_in_doubt_workflows(self) -> list[str]:
        """Every workflow with an effect in doubt (an intent without an outcome), sorted.

        An effect whose call is running right now is in this list too, until it returns.
        """
        return await self._journal.in_doubt_workflows()

    async def resolve_effect(
        self,
        workflow_id: str,
        step: int,
        key: str,
        *,
        happened: bool,
        result: Any = None,
        lease: Lease | None = None,
    ) -> EffectRecord:
        """Settle an effect in doubt, once you know whether its call happened.

        ``happened=True`` records ``result`` as its result (the step's re-run returns it
        without calling the function); ``happened=False`` records it as failed (the re-run
        calls the function again). Raises :class:`~aiocheckpoint.InvalidArgumentError` if
        the step has no effect ``key`` in doubt, or :class:`~aiocheckpoint.LeaseLostError`
        first when ``lease`` is no longer the workflow's (another runner may have settled it).

        The write is fenced: by ``lease`` when given (a runner settling its own effect);
        otherwise, on a backend with leases, by a lease of its own taken for the write and
        released after it, so that it raises :class:`~aiocheckpoint.LeaseHeldError` while
        a runner holds the workflow, and a stale runner cannot write after it. A workflow
        FAILED on an effect in doubt is UNFINISHED again (claimable) once its last one is
        settled (:mod:`aiocheckpoint.doubt`).
        """
        return await self._journal.resolve(workflow_id, step, key, happened, result, lease)
