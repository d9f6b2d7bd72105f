"""Durable effects: the journal of one step's calls to the outside world (``docs/effects.md``).

:class:`StepEffects` is what :meth:`ResumableWorkflow.effect
<aiocheckpoint.ResumableWorkflow.effect>` runs for one attempt of one step: it reads the
step's journal once, names each effect (its explicit key, or ``#n`` from the call order),
and for each call records an intent, calls the function, records the outcome, or returns
the recorded result instead of calling again.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

from ._telemetry import record_in_doubt, traced
from .codec import EffectRecord, EffectState, Reconciled
from .errors import EffectInDoubtError, EffectOrderError, InvalidArgumentError, LeaseError
from .leases import Lease
from .manager import CheckpointManager
from .storage.base import MAX_EFFECTS_PER_STEP, check_effect_key

__all__ = ["Reconcile", "StepEffects", "idempotency_key"]

logger = logging.getLogger(__name__)

#: A ``reconcile`` callback: asked about an effect in doubt, says whether it happened.
Reconcile = Callable[[EffectRecord], Awaitable[Reconciled]]

#: Keys derived from the call order start with this; explicit keys may not.
_DERIVED = "#"


def idempotency_key(workflow_id: str, step: int, key: str) -> str:
    """The idempotency key of an effect: the same on every attempt, unique per effect."""
    digest = hashlib.sha256(f"{workflow_id}\0{step}\0{key}".encode()).hexdigest()
    return f"ack-{digest[:40]}"


class StepEffects:
    """The effects of one attempt of one step."""

    def __init__(
        self,
        manager: CheckpointManager,
        workflow_id: str,
        step: int,
        lease: Callable[[], Lease | None],
    ) -> None:
        self._manager = manager
        self._workflow_id = workflow_id
        self._step = step
        self._lease = lease
        self._journal: dict[str, EffectRecord] | None = None
        self._loading = asyncio.Lock()
        self._order = 0
        self._running: set[str] = set()

    @property
    def workflow_id(self) -> str:
        """The workflow whose step this is."""
        return self._workflow_id

    @property
    def step(self) -> int:
        """The step whose effects these are."""
        return self._step

    @property
    def sealed(self) -> bool:
        """Whether the store keeps effect records encrypted (so their errors stay private)."""
        return self._manager._codec.sealer is not None

    def name(self, key: str | None) -> str:
        """The effect's key: ``key``, or the next ``#n`` (taken when the call starts)."""
        if key is None:
            derived = f"{_DERIVED}{self._order}"
            self._order += 1
            return derived
        key = check_effect_key(key)
        if key.startswith(_DERIVED):
            raise InvalidArgumentError(f"explicit effect keys may not start with '#': {key!r}")
        return key

    @traced("effect", instance=True, private=lambda effects: effects.sealed)
    async def run(
        self,
        key: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        idempotent: bool,
        reconcile: Reconcile | None,
    ) -> Any:
        """The effect's result: recorded, or from calling ``fn`` between intent and outcome."""
        if key in self._running:
            raise InvalidArgumentError(f"effect {key!r} is already running in this step")
        self._running.add(key)
        try:
            journal = await self._load()
            earlier = journal.get(key)
            name = _qualname(fn)
            if earlier is not None:
                if key.startswith(_DERIVED):  # an explicit key is the effect's identity
                    _check_same(earlier, name)
                if earlier.state is EffectState.DONE:
                    return earlier.result
                if earlier.in_doubt:
                    record_in_doubt(self._workflow_id, self._step, key)
                    found = await self._settle(earlier, idempotent, reconcile)
                    if found is not None:
                        return found.result
            elif len(journal) >= MAX_EFFECTS_PER_STEP:
                raise InvalidArgumentError(f"a step records at most {MAX_EFFECTS_PER_STEP} effects")
            intent = self._intent(key, name, earlier)
            if idempotent:
                kwargs = {**kwargs, "idempotency_key": intent.idempotency_key}
            return await self._call(intent, fn, args, kwargs)
        finally:
            self._running.discard(key)

    async def _load(self) -> dict[str, EffectRecord]:
        async with self._loading:
            if self._journal is None:
                records = await self._manager.get_effects(self._workflow_id, self._step)
                self._journal = {record.key: record for record in records}
        return self._journal

    async def _settle(
        self, earlier: EffectRecord, idempotent: bool, reconcile: Reconcile | None
    ) -> EffectRecord | None:
        """An in-doubt effect's recorded outcome if reconciled; None to call it again."""
        if reconcile is not None:
            found = await reconcile(earlier)
            if not isinstance(found, Reconciled):
                raise InvalidArgumentError(
                    f"reconcile must return a Reconciled, not {type(found).__qualname__}"
                )
            if found.happened:
                done = earlier.finished(EffectState.DONE, result=found.result)
                return await self._record(done)
            return None
        if idempotent:
            return None
        raise EffectInDoubtError(self._workflow_id, self._step, earlier.key, earlier.intent_at)

    def _intent(self, key: str, name: str, earlier: EffectRecord | None) -> EffectRecord:
        return EffectRecord(
            workflow_id=self._workflow_id,
            step=self._step,
            key=key,
            name=name,
            state=EffectState.IN_DOUBT,
            attempt=1 if earlier is None else earlier.attempt + 1,
            intent_at=datetime.now(timezone.utc),
            idempotency_key=idempotency_key(self._workflow_id, self._step, key),
        )

    async def _call(
        self,
        intent: EffectRecord,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        # The intent is durable (and fenced) before the call: a stale runner stops here.
        await self._record(intent)
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            await self._record_failure(intent, exc)
            raise
        # A cancellation (or a crash) inside the call leaves the intent in doubt: the call
        # may have happened.
        done = await self._record(intent.finished(EffectState.DONE, result=result))
        return done.result

    async def _record_failure(self, intent: EffectRecord, exc: Exception) -> None:
        error = {"type": type(exc).__qualname__, "message": str(exc)}
        try:
            await self._record(intent.finished(EffectState.FAILED, error=error))
        except LeaseError:
            pass  # another runner drives the workflow: reported once, when the block exits
        except Exception:
            logger.exception(
                "workflow %r: could not record the failure of effect %r of step %d",
                self._workflow_id,
                intent.key,
                self._step,
            )

    async def _record(self, record: EffectRecord) -> EffectRecord:
        stored = await self._manager.record_effect(record, lease=self._lease())
        assert self._journal is not None
        self._journal[record.key] = stored
        return stored


def _qualname(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


def _check_same(earlier: EffectRecord, name: str) -> None:
    if earlier.name != name:
        raise EffectOrderError(
            f"effect {earlier.key!r} of step {earlier.step} of workflow {earlier.workflow_id!r} "
            f"was recorded for {earlier.name!r}, but this run calls {name!r} under that key "
            "(did the order of the step's effects change?)"
        )
