"""SQLiteCheckpointStorage: every workflow's checkpoints in one SQLite database file.

The embedded default backend. Writes go through one writer thread that commits queued
writes together (group commit: one transaction and one fsync for many callers); reads run
on separate connections in their own threads, so they never wait behind the write queue.
See ``docs/sqlite-storage.md`` for the schema, the durability setting and the design.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from .._validation import check_optional_step, check_step, check_workflow_id
from ..errors import InvalidArgumentError, StorageClosedError
from ._sqlite_db import (
    BusyRetry,
    Op,
    Outcome,
    ReaderPool,
    Writer,
    read_exists,
    read_one,
    read_scan,
    read_workflows,
)
from .base import DEFAULT_MAX_RECORD_BYTES, BaseStorage, StoredCheckpoint

__all__ = ["SQLiteCheckpointStorage"]

T = TypeVar("T")

#: A batch stops growing at this many queued bytes (it always takes at least one write).
_MAX_BATCH_BYTES: Final = 64 * 1024 * 1024


@dataclass(eq=False)
class _Pending:
    op: Op
    size: int
    future: asyncio.Future[Any] = field(repr=False)


class SQLiteCheckpointStorage(BaseStorage):
    """Checkpoints in a SQLite database (WAL, ``synchronous=FULL``), with group commit.

    ``path`` is the database file; it and its parent directories are created on first use
    (a new file is owner-only, 0600, and so are its -wal and -shm files). Nothing touches
    the disk before the first operation (or :meth:`open`).

    * ``max_record_bytes``: larger records are refused on save
      (:class:`~aiocheckpoint.InvalidArgumentError`) and on read
      (:class:`~aiocheckpoint.CheckpointCorruptedError`, without fetching the blob).
    * ``busy_timeout``: seconds SQLite waits for another process's lock before each retry;
      ``busy_retries`` more attempts follow with backoff before the call fails with
      :class:`~aiocheckpoint.StorageBackendError`.
    * ``readers``: threads (each with its own connection) serving reads.
    * ``max_batch``: the most writes committed in one transaction.

    ``save`` returns once its transaction is committed and fsynced. A caller cancelled while
    its write is still queued removes it (nothing is written); once its batch is committing
    the write lands whole and the caller sees the cancellation. :meth:`close` commits
    queued writes before closing.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        busy_timeout: float = 5.0,
        busy_retries: int = 10,
        readers: int = 2,
        max_batch: int = 512,
    ) -> None:
        for name, value, low in (
            ("max_record_bytes", max_record_bytes, 1),
            ("busy_retries", busy_retries, 0),
            ("readers", readers, 1),
            ("max_batch", max_batch, 1),
        ):
            if type(value) is not int or value < low:
                raise InvalidArgumentError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(busy_timeout, (int, float)) or busy_timeout < 0:
            raise InvalidArgumentError(f"busy_timeout must be seconds >= 0, got {busy_timeout!r}")
        self._path = Path(os.fspath(path))
        self._max_record_bytes = max_record_bytes
        self._max_batch = max_batch
        retry = BusyRetry(busy_retries)
        self._writer = Writer(self._path, float(busy_timeout), retry)
        self._readers = ReaderPool(self._path, float(busy_timeout), retry)
        self._write_thread = ThreadPoolExecutor(1, thread_name_prefix="aiocheckpoint-sqlite-w")
        self._read_threads = ThreadPoolExecutor(
            readers, thread_name_prefix="aiocheckpoint-sqlite-r"
        )
        self._pending: deque[_Pending] = deque()
        self._drainer: asyncio.Task[None] | None = None
        self._opening: asyncio.Future[None] | None = None
        self._opened = False
        self._closing: asyncio.Task[None] | None = None

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    async def open(self) -> None:
        """Open the database now (create, configure, migrate); first use does it anyway."""
        self._check_open()
        await self._ensure_open()

    # --- writes: queued, committed in batches by one writer ------------------------------

    async def save(
        self, workflow_id: str, step: int, data: bytes, *, keep_last: int | None = None
    ) -> None:
        """Store ``data`` as ``step``, then keep the ``keep_last`` highest steps, atomically."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_step(step)
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise InvalidArgumentError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        data = bytes(data)
        if len(data) > self._max_record_bytes:
            raise InvalidArgumentError(
                f"record of {len(data)} bytes exceeds max_record_bytes={self._max_record_bytes}"
            )
        await self._submit(("save", workflow_id, step, data, keep_last), len(data))

    async def delete(self, workflow_id: str, step: int | None = None) -> bool:
        """Delete one step, or the whole workflow; return whether anything was deleted."""
        self._check_open()
        op = ("delete", check_workflow_id(workflow_id), check_optional_step(step))
        return bool(await self._submit(op, 0))

    async def _submit(self, op: Op, size: int) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(op, size, future))
        self._kick()
        # Cancelling the caller cancels the future: a queued write is then skipped when the
        # batch is taken; a write already taken is committed regardless.
        return await future

    def _kick(self) -> None:
        if self._drainer is None:
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            try:
                await self._ensure_open()
            except Exception as exc:
                for item in self._pending:
                    _settle(item.future, exc)
                self._pending.clear()
                return
            while batch := self._take_batch():
                await self._commit(batch)
        finally:
            # No await between the last (empty) take and here: no write can be stranded.
            self._drainer = None

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        while self._pending and len(batch) < self._max_batch:
            item = self._pending[0]
            if item.future.done():  # its caller was cancelled while it was queued
                self._pending.popleft()
                continue
            if batch and size + item.size > _MAX_BATCH_BYTES:
                break
            self._pending.popleft()
            batch.append(item)
            size += item.size
        return batch

    async def _commit(self, batch: list[_Pending]) -> None:
        ops = [item.op for item in batch]
        done = asyncio.get_running_loop().run_in_executor(
            self._write_thread, self._writer.run_batch, ops
        )

        def settle_all(finished: asyncio.Future[list[Outcome]]) -> None:
            if finished.cancelled():
                return
            failure = finished.exception()
            outcomes = finished.result() if failure is None else [failure] * len(batch)
            for item, outcome in zip(batch, outcomes, strict=True):
                _settle(item.future, outcome)

        # The batch runs to completion in its thread even if this task is cancelled (loop
        # shutdown); its callers are then told the outcome when it arrives.
        done.add_done_callback(settle_all)
        await asyncio.shield(done)

    # --- reads: separate connections, never behind the write queue -----------------------

    async def load(self, workflow_id: str, step: int | None = None) -> StoredCheckpoint | None:
        """Return one step's record (the highest step when ``step`` is None), or None."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_optional_step(step)
        limit = self._max_record_bytes
        return await self._read(lambda conn: read_one(conn, workflow_id, step, limit))

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
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        after = check_optional_step(after, "after")
        before = check_optional_step(before, "before")
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidArgumentError(f"limit must be an int >= 0 or None, got {limit!r}")
        max_bytes = self._max_record_bytes
        return await self._read(
            lambda conn: read_scan(conn, workflow_id, after, before, limit, descending, max_bytes)
        )

    async def exists(self, workflow_id: str, step: int | None = None) -> bool:
        """Whether the step (or any step, when ``step`` is None) is stored."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        step = check_optional_step(step)
        return await self._read(lambda conn: read_exists(conn, workflow_id, step))

    async def list_workflows(self) -> list[str]:
        """Every workflow id with at least one record, sorted."""
        self._check_open()
        return await self._read(read_workflows)

    async def _read(self, fn: Callable[[Any], T]) -> T:
        await self._ensure_open()
        return await self._in_thread(self._read_threads, self._readers.run, fn)

    async def _in_thread(self, executor: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        except RuntimeError as exc:  # the executor was shut down by a concurrent close()
            raise StorageClosedError("SQLiteCheckpointStorage is closed") from exc
        return await future

    # --- lifecycle ------------------------------------------------------------------------

    async def _ensure_open(self) -> None:
        if self._opened:
            return
        if self._opening is None:
            self._opening = asyncio.ensure_future(
                self._in_thread(self._write_thread, self._writer.open)
            )
        opening = self._opening
        try:
            # Shielded: a cancelled caller must not abandon an open other callers share.
            await asyncio.shield(opening)
        except BaseException:
            if opening.done() and not opening.cancelled() and opening.exception() is not None:
                self._opening = None  # let the next call try again
            raise
        self._opened = True

    async def close(self) -> None:
        """Commit queued writes, then close the connections; later calls raise.

        Calling it again waits for the first close to finish.
        """
        self._closed = True
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._shutdown())
        await asyncio.shield(self._closing)

    async def _shutdown(self) -> None:
        while self._drainer is not None or self._pending:
            if self._drainer is None:
                self._kick()
            assert self._drainer is not None
            await asyncio.shield(self._drainer)
        try:
            if self._opening is not None:
                try:
                    await asyncio.shield(self._opening)
                except Exception:
                    return  # the open failed: nothing was opened, nothing to close
                await self._in_thread(self._write_thread, self._close_connections)
        finally:
            self._write_thread.shutdown(wait=False)
            self._read_threads.shutdown(wait=False)

    def _close_connections(self) -> None:
        # Readers first, so the writer is the last connection and checkpoints the WAL.
        self._readers.close()
        self._writer.close()


def _settle(future: asyncio.Future[Any], outcome: object) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
