"""The storage protocol: the one seam every backend implements.

A backend moves opaque, already-encoded records (``bytes``) keyed by ``(workflow_id, step)``.
It never sees states or checkpoints: the :class:`~aiocheckpoint.CheckpointManager` owns
validation, encoding, checksums and the retention policy, so every backend gets them right
in the same way. The manager validates ids and steps before calling a backend, but backends
must still treat ids as arbitrary text (they may contain ``/``, ``..``, quotes, any script).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, runtime_checkable

from typing_extensions import Self

from ..errors import StorageClosedError

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "BaseStorage", "CheckpointStorage", "StoredCheckpoint"]

#: Records larger than this are refused by the bundled backends, on write and on read, so
#: that a damaged or hostile store cannot make a reader allocate without bound.
DEFAULT_MAX_RECORD_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """One stored record: its step and its encoded bytes."""

    step: int
    data: bytes


@runtime_checkable
class CheckpointStorage(Protocol):
    """An async store of encoded checkpoint records.

    Contract (the conformance suite in :mod:`aiocheckpoint.testing` checks every point):

    * ``save`` is atomic and durable: when it returns the record survives a crash of the
      process (and, for durable backends, of the machine); a crash before it returns leaves
      the previous record of that step, if any, intact. Saving an existing step replaces it.
      With ``keep_last=N`` the backend then deletes all but the N highest steps of that
      workflow, in the same transaction where it has transactions.
    * ``load(wf)`` returns the record with the highest step, ``load(wf, step)`` that step;
      both return ``None`` when there is none. Neither may read the whole history.
    * ``scan`` returns records ordered by step (descending if asked), restricted to
      ``after < step < before``, at most ``limit`` of them.
    * ``delete(wf, step)`` / ``delete(wf)`` return whether anything was deleted.
    * ``list_workflows`` returns every workflow id that has at least one record, sorted.
    * After ``close`` every method raises :class:`~aiocheckpoint.StorageClosedError`;
      ``close`` itself may be called again. ``async with`` closes on exit.
    * Driver and OS errors surface as :class:`~aiocheckpoint.CheckpointError` subclasses.
    """

    async def save(
        self, workflow_id: str, step: int, data: bytes, *, keep_last: int | None = None
    ) -> None:
        """Store ``data`` as ``step`` of ``workflow_id``, then apply ``keep_last``."""
        ...

    async def load(self, workflow_id: str, step: int | None = None) -> StoredCheckpoint | None:
        """Return one step's record (the highest step when ``step`` is None), or None."""
        ...

    async def scan(
        self,
        workflow_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        limit: int | None = None,
        descending: bool = False,
    ) -> list[StoredCheckpoint]:
        """Return records with ``after < step < before``, ordered by step, at most ``limit``."""
        ...

    async def exists(self, workflow_id: str, step: int | None = None) -> bool:
        """Whether the step (or any step, when ``step`` is None) is stored."""
        ...

    async def delete(self, workflow_id: str, step: int | None = None) -> bool:
        """Delete one step, or the whole workflow when ``step`` is None."""
        ...

    async def list_workflows(self) -> list[str]:
        """Every workflow id with at least one record, sorted."""
        ...

    async def close(self) -> None:
        """Release resources; later calls raise :class:`~aiocheckpoint.StorageClosedError`."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class BaseStorage:
    """Lifecycle helpers shared by the bundled backends: ``async with`` and the closed check."""

    _closed: bool = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError(f"{type(self).__name__} is closed")

    async def close(self) -> None:
        """Mark the storage closed. Backends extend this to release their resources."""
        self._closed = True

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
