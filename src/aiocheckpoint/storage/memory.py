"""In-memory storage: the default backend, for tests and short-lived runs."""

from __future__ import annotations

import bisect

from ..errors import InvalidArgumentError
from .base import DEFAULT_MAX_RECORD_BYTES, BaseStorage, StoredCheckpoint

__all__ = ["InMemoryCheckpointStorage"]


class _Workflow:
    __slots__ = ("records", "steps")

    def __init__(self) -> None:
        self.steps: list[int] = []  # sorted
        self.records: dict[int, bytes] = {}


class InMemoryCheckpointStorage(BaseStorage):
    """Keeps encoded records in a dict; nothing survives the process.

    Records are still encoded and checksummed, so behaviour matches the durable backends.
    Every operation is a dict lookup or a binary search: O(log n) in the workflow's history.
    Records larger than ``max_record_bytes`` are refused with
    :class:`~aiocheckpoint.InvalidArgumentError`, as the durable backends refuse them.
    """

    def __init__(self, *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        if type(max_record_bytes) is not int or max_record_bytes < 1:
            raise InvalidArgumentError(
                f"max_record_bytes must be an int >= 1, got {max_record_bytes!r}"
            )
        self._workflows: dict[str, _Workflow] = {}
        self._max_record_bytes = max_record_bytes

    async def save(
        self, workflow_id: str, step: int, data: bytes, *, keep_last: int | None = None
    ) -> None:
        """Store ``data`` as ``step``; keep only the ``keep_last`` highest steps if given."""
        self._check_open()
        if len(data) > self._max_record_bytes:
            raise InvalidArgumentError(
                f"record of {len(data)} bytes exceeds max_record_bytes={self._max_record_bytes}"
            )
        wf = self._workflows.setdefault(workflow_id, _Workflow())
        if step not in wf.records:
            bisect.insort(wf.steps, step)
        wf.records[step] = bytes(data)
        if keep_last is not None and len(wf.steps) > keep_last:
            dropped = wf.steps[: len(wf.steps) - keep_last]
            del wf.steps[: len(dropped)]
            for old in dropped:
                del wf.records[old]

    async def load(self, workflow_id: str, step: int | None = None) -> StoredCheckpoint | None:
        """Return one step's record (the highest when ``step`` is None), or None."""
        self._check_open()
        wf = self._workflows.get(workflow_id)
        if wf is None:
            return None
        if step is None:
            step = wf.steps[-1]
        data = wf.records.get(step)
        return None if data is None else StoredCheckpoint(step, data)

    async def scan(
        self,
        workflow_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        limit: int | None = None,
        descending: bool = False,
    ) -> list[StoredCheckpoint]:
        """Return records with ``after < step < before`` in step order, at most ``limit``."""
        self._check_open()
        wf = self._workflows.get(workflow_id)
        if wf is None:
            return []
        lo = 0 if after is None else bisect.bisect_right(wf.steps, after)
        hi = len(wf.steps) if before is None else bisect.bisect_left(wf.steps, before)
        if descending:
            start = lo if limit is None else max(lo, hi - limit)
            steps = wf.steps[start:hi][::-1]
        else:
            steps = wf.steps[lo : hi if limit is None else min(hi, lo + limit)]
        return [StoredCheckpoint(s, wf.records[s]) for s in steps]

    async def exists(self, workflow_id: str, step: int | None = None) -> bool:
        """Whether the step (or any step) is stored."""
        self._check_open()
        wf = self._workflows.get(workflow_id)
        return wf is not None and (step is None or step in wf.records)

    async def delete(self, workflow_id: str, step: int | None = None) -> bool:
        """Delete one step, or the whole workflow."""
        self._check_open()
        wf = self._workflows.get(workflow_id)
        if wf is None:
            return False
        if step is None:
            del self._workflows[workflow_id]
            return True
        if wf.records.pop(step, None) is None:
            return False
        wf.steps.remove(step)
        if not wf.steps:
            del self._workflows[workflow_id]
        return True

    async def list_workflows(self) -> list[str]:
        """Every workflow id with at least one record, sorted."""
        self._check_open()
        return sorted(self._workflows)

    async def close(self) -> None:
        """Drop every record and mark the storage closed."""
        self._workflows.clear()
        await super().close()
