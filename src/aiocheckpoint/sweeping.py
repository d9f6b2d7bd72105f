"""The manager's retention calls: a sweep now, one workflow thinned, sweeps in the background.

:class:`Sweeper` runs them for one manager with its policy; :class:`RetentionMethods` is the
part of :class:`~aiocheckpoint.CheckpointManager`'s API that delegates to it. What a policy
keeps and how a sweep walks the store is :mod:`aiocheckpoint.retention`
(``docs/retention.md``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime, timedelta

import anyio

from ._telemetry import traced
from ._validation import check_workflow_id
from .codec import RecordCodec
from .errors import CheckpointError, InvalidArgumentError, StorageClosedError
from .retention import RetentionPolicy, SweepReport, run_sweep, run_thinning
from .storage.base import CheckpointStorage

__all__ = ["RetentionMethods", "Sweeper"]

logger = logging.getLogger(__name__)


class Sweeper:
    """Applies a manager's retention policy (or one given per call) to its storage.

    ``check_open`` raises once the manager is closed; :meth:`stop` ends the background
    sweeps when it closes.
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        codec: RecordCodec,
        policy: RetentionPolicy | None,
        check_open: Callable[[], None],
    ) -> None:
        #: The manager's storage (what the spans of the traced calls name).
        self.storage = storage
        self._codec = codec
        #: The manager's policy, or None.
        self.policy = policy
        self._check_open = check_open
        self._scopes: set[anyio.CancelScope] = set()
        self._stopped = False

    @traced("sweep")
    async def sweep(
        self,
        *,
        dry_run: bool = False,
        now: datetime | None = None,
        policy: RetentionPolicy | None = None,
        collect_garbage: bool = True,
    ) -> SweepReport:
        """``sweep``: the policy applied to the whole store once."""
        self._check_open()
        chosen = policy if policy is not None else self.policy
        if chosen is None:
            raise InvalidArgumentError("sweep needs a retention policy: this manager has none")
        codec = self._codec
        return await run_sweep(
            self.storage,
            chosen,
            now=now,
            dry_run=dry_run,
            collect_garbage=collect_garbage,
            forget=codec.forget,
            opened=codec.opener(),
        )

    @traced("thin_workflow")
    async def thin_workflow(
        self, workflow_id: str, *, policy: RetentionPolicy | None = None, dry_run: bool = False
    ) -> SweepReport:
        """``thin_workflow``: the history rules applied to one workflow now."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        chosen = policy if policy is not None else self.policy
        if not isinstance(chosen, RetentionPolicy):
            raise InvalidArgumentError(f"thin_workflow needs a RetentionPolicy, got {chosen!r}")
        return await run_thinning(
            self.storage, chosen, workflow_id, dry_run=dry_run, opened=self._codec.opener()
        )

    @asynccontextmanager
    async def sweeping(self, every: timedelta) -> AsyncIterator[None]:
        """``sweeping``: sweeps every ``every`` while the block runs."""
        self._check_open()
        if self.policy is None:
            raise InvalidArgumentError("sweeping needs a retention policy: this manager has none")
        if not isinstance(every, timedelta) or every <= timedelta(0):
            raise InvalidArgumentError(f"every must be a positive timedelta, got {every!r}")
        # The sweeper's own scope: closing the manager stops it, not the caller's block.
        scope = anyio.CancelScope()
        async with anyio.create_task_group() as group:
            self._scopes.add(scope)
            group.start_soon(self._sweep_forever, every.total_seconds(), scope)
            try:
                yield
            finally:
                self._scopes.discard(scope)
                scope.cancel()

    def stop(self) -> None:
        """End every background sweep (the manager is closing)."""
        self._stopped = True
        for scope in self._scopes:
            scope.cancel()

    async def _sweep_forever(self, seconds: float, scope: anyio.CancelScope) -> None:
        with scope:
            while not self._stopped:
                await anyio.sleep(seconds)
                try:
                    await self.sweep()
                except StorageClosedError:
                    return
                except CheckpointError as exc:
                    logger.warning("background sweep failed, retrying in %.0f s: %s", seconds, exc)


class RetentionMethods:
    """:class:`~aiocheckpoint.CheckpointManager`'s retention calls (``docs/retention.md``)."""

    _sweeper: Sweeper

    @property
    def retention(self) -> RetentionPolicy | None:
        """The retention policy (``max_checkpoints=N`` shows as its policy), or None."""
        return self._sweeper.policy

    async def sweep(
        self,
        *,
        dry_run: bool = False,
        now: datetime | None = None,
        policy: RetentionPolicy | None = None,
        collect_garbage: bool = True,
    ) -> SweepReport:
        """Apply the retention policy (or ``policy``) to the whole store once.

        Deletes, in short batches, the workflows past their TTL (never a leased one) and
        the checkpoints the history rules do not keep, then collects garbage blobs; returns
        a :class:`~aiocheckpoint.SweepReport`. ``dry_run=True`` deletes nothing and reports
        what would go. ``now`` is the moment TTLs count back from (default: now).
        """
        return await self._sweeper.sweep(
            dry_run=dry_run, now=now, policy=policy, collect_garbage=collect_garbage
        )

    async def thin_workflow(
        self, workflow_id: str, *, policy: RetentionPolicy | None = None, dry_run: bool = False
    ) -> SweepReport:
        """Apply the history rules of the policy (or of ``policy``) to one workflow now.

        For a workflow that needs other rules than the rest (a long chat kept denser, a
        finished run thinned at once); a paused one is left whole under ``keep_paused``.
        """
        return await self._sweeper.thin_workflow(workflow_id, policy=policy, dry_run=dry_run)

    def sweeping(
        self, every: timedelta = timedelta(minutes=5)
    ) -> AbstractAsyncContextManager[None]:
        """Sweep in the background every ``every`` while the block runs (and the manager is open).

        The sweeper is a task of the block's own task group: it stops when the block ends or
        the manager closes. A failed sweep is logged and tried again at the next interval.
        """
        return self._sweeper.sweeping(every)
