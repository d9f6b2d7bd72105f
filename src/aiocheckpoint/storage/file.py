"""FileCheckpointStorage: one directory per workflow, one fsynced file per checkpoint.

Layout (docs/file-storage.md describes it in full)::

    base_dir/                         0700
        aiocheckpoint.json            {"format": 1}, written atomically on first write;
                                      {"format": 3} once the store holds blobs
        workflows/                    0700
            <encoded id>/             0700, see ``encode_name``
                lock                  flock(2) target for read-modify-write sections
                latest                hint: the highest step (44 bytes, see ``Hint``)
                id                    the exact id, only in hash-named directories
                00000000000000000007.ckpt
                .tmp-<ns>-<pid>-<uuid>  a write in progress (ignored by readers)
        blobs/                        content-addressed blobs of version-2 records
            gc.lock                   flock(2) target of the sweeper; mtime: last sweep
            tmp/.tmp-<ns>-<pid>-<uuid>  a pack being written
            packs/<24 hex>.pack       the new blobs of one save, then their index
            <hh>/<hash hex>           one blob per file (format 2; read, never written)

Every public method makes exactly one hop to a worker thread, so a save's write, fsync,
rename and directory fsync run together and a cancelled caller still waits for them: the
record lands whole or not at all. Saves queued while the store's previous save hop runs are
written together by its next one (a group commit, two ``syncfs`` calls for the lot).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import shutil
import stat
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple, TypeVar

import anyio.to_thread

from .._validation import check_optional_step, check_step, check_workflow_id
from ..errors import (
    CheckpointCorruptedError,
    InvalidArgumentError,
    StorageBackendError,
    StorageClosedError,
    StorageSchemaError,
    UnsupportedOperationError,
)
from ..format import SplitResult, TreeParams
from ..leases import Lease
from ._fileblobs import BlobStore
from ._filefmt import (
    HASHED_PREFIX,
    FileOps,
    Hint,
    decode_name,
    encode_name,
    hashed_name,
    is_missing,
    parse_step_name,
    pid_is_dead,
    step_name,
    temp_name,
)
from .base import (
    DEFAULT_MAX_RECORD_BYTES,
    BaseStorage,
    StoredCheckpoint,
    check_max_record_bytes,
    check_record_size,
)

__all__ = ["FORMAT_VERSION", "FileCheckpointStorage"]

logger = logging.getLogger("aiocheckpoint")

#: The newest on-disk format this version reads and writes; higher ones are refused.
#: A store is marked format 1 until its first blob is written, then format 3 (version-2
#: records, blobs in pack files), so that versions without pack support refuse it cleanly.
#: Format 2 (blobs as one file each) is still read and collected; its next blob write
#: marks it format 3.
FORMAT_VERSION: Final = 3
_FORMAT_PLAIN: Final = 1
_FORMAT_BLOBS: Final = 2
MARKER: Final = "aiocheckpoint.json"
WORKFLOWS: Final = "workflows"
LOCK: Final = "lock"
HINT: Final = "latest"
ID_FILE: Final = "id"

_OPEN_FLAGS: Final = os.O_CLOEXEC | os.O_NOFOLLOW
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | _OPEN_FLAGS
_READ_FLAGS: Final = os.O_RDONLY | _OPEN_FLAGS
_NEW_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS
_RETRIES: Final = 16
#: A group commit takes at most this many saves, and stops growing at this many bytes.
_MAX_GROUP: Final = 256
_MAX_GROUP_BYTES: Final = 64 * 1024 * 1024
#: A finished group wakes its callers this many per event-loop iteration.
_WAKE_SLICE: Final = 8
#: Fewer queued saves than this take the single path (per-file fsyncs) instead of syncfs.
_GROUP_MIN: Final = 2
_T = TypeVar("_T")


class _SaveOp(NamedTuple):
    workflow_id: str
    step: int
    data: bytes
    keep_last: int | None


@dataclass(eq=False)
class _Pending:
    """A queued save and the future its caller waits on."""

    op: _SaveOp
    future: asyncio.Future[None] = field(repr=False)
    taken: bool = False  # in a group commit now: it lands whole or not at all


class _Replaced(Exception):
    """The workflow directory was deleted or replaced under us; start the operation again."""


class FileCheckpointStorage(BaseStorage):
    """Checkpoints as files under ``base_dir``: durable, atomic, safe for many processes.

    A save writes a uniquely named temporary file, fsyncs it, renames it over
    ``<step>.ckpt`` and fsyncs the directory before it returns, so a returned save
    survives ``kill -9`` and power loss. Workflow ids of any text map to directory names
    reversibly and collision-free. Files are created 0600 and directories 0700.

    ``max_record_bytes`` bounds records on write (larger ones raise
    :class:`~aiocheckpoint.CheckpointSerializationError`) and on read (larger files raise
    :class:`~aiocheckpoint.CheckpointCorruptedError`). Temporary files of crashed writers
    are removed when their process is gone or they are older than ``stale_temp_seconds``.
    Nothing touches the disk until the first operation.

    Saves made while an earlier one is still being written are written together as one
    group commit: their files, then one ``syncfs(2)``, the renames, one more ``syncfs``
    (Linux 5.8 or later; see docs/file-storage.md). ``use_syncfs=False`` fsyncs every file
    and directory one save at a time instead: choose it when other programs write a lot to
    the same filesystem, since ``syncfs`` also waits for their data.

    It is a :class:`~aiocheckpoint.storage.base.BlobCheckpointStorage`: the manager stores
    large states as content-addressed blobs under ``blobs/`` (``compression="zstd"``
    compresses them; ``blob_params`` sets every cutting parameter). Blobs no record
    references are deleted by :meth:`collect_garbage`, which also runs after retention or
    deletes once ``gc_interval`` seconds have passed since the last collection (``None``:
    only when called). A blob younger than ``blob_grace_seconds`` is never deleted; it must
    exceed the longest save and the longest read (see docs/file-storage.md).
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        stale_temp_seconds: float = 3600.0,
        compression: str | None = None,
        blob_params: TreeParams | None = None,
        blob_grace_seconds: float = 3600.0,
        gc_interval: float | None = 3600.0,
        use_syncfs: bool = True,
    ) -> None:
        check_max_record_bytes(max_record_bytes)
        for name, value in (
            ("stale_temp_seconds", stale_temp_seconds),
            ("blob_grace_seconds", blob_grace_seconds),
            ("gc_interval", 1.0 if gc_interval is None else gc_interval),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidArgumentError(f"{name} must be a positive number, got {value!r}")
        if blob_params is not None and not isinstance(blob_params, TreeParams):
            raise InvalidArgumentError("blob_params must be a TreeParams or None")
        if blob_params is not None and compression is not None:
            raise InvalidArgumentError("pass compression inside blob_params, not both")
        self._params = blob_params or TreeParams(compression=compression)
        self._gc_interval = None if gc_interval is None else float(gc_interval)
        self._base = os.path.abspath(os.fspath(base_dir))
        self._root = os.path.join(self._base, WORKFLOWS)
        self._max = max_record_bytes
        self._stale = float(stale_temp_seconds)
        self._os = FileOps()
        self._marker_ok = False
        self._store_ready = False
        self._swept: set[tuple[str, int]] = set()
        self._format = 0
        self._pruned = False
        self._blobs = BlobStore(
            self._base, self._os, float(blob_grace_seconds), max_record_bytes, self._stale
        )
        if not isinstance(use_syncfs, bool):
            raise InvalidArgumentError(f"use_syncfs must be a bool, got {use_syncfs!r}")
        self._use_syncfs = use_syncfs
        self._queue: deque[_Pending] = deque()
        self._kick_due = False
        self._busy: asyncio.AbstractEventLoop | None = None  # the loop of the running group
        self._idle: list[asyncio.Future[None]] = []

    @property
    def base_dir(self) -> str:
        """The absolute path of the store's directory."""
        return self._base

    @property
    def max_record_bytes(self) -> int:
        """The largest record this store writes or reads."""
        return self._max

    @property
    def blob_params(self) -> TreeParams:
        """How this store cuts states into blobs (``compression`` chooses zstd)."""
        return self._params

    @property
    def blob_dir(self) -> str:
        """The directory of the content-addressed blobs (it may not exist yet)."""
        return self._blobs.dir

    def workflow_dir(self, workflow_id: str) -> str:
        """The directory that holds ``workflow_id``'s files (it may not exist yet)."""
        return os.path.join(self._root, encode_name(check_workflow_id(workflow_id)))

    # --- the protocol -----------------------------------------------------------------

    async def save(
        self, workflow_id: str, step: int, data: bytes, *, keep_last: int | None = None
    ) -> None:
        """Durably store ``data`` as ``step``; then keep only the ``keep_last`` highest steps.

        Cost: one file write + two fsyncs (file, directory), or a share of a group commit's
        two ``syncfs`` calls; with ``keep_last``, also one listing of the workflow's
        directory and an unlink per pruned step.
        """
        self._check_open()
        check_workflow_id(workflow_id)
        check_step(step)
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise InvalidArgumentError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        check_record_size(data, self._max)
        op = _SaveOp(workflow_id, step, bytes(data), keep_last)
        if not (self._use_syncfs and self._os.has_syncfs):
            await self._run(_what(op), self._save, *op)
            return
        await self._commit(op)

    async def load(self, workflow_id: str, step: int | None = None) -> StoredCheckpoint | None:
        """Return one step's record (the highest when ``step`` is None), or None.

        Cost: one file read; the latest is found through the ``latest`` hint, not a listing
        (one listing per workflow after a reboot or when the hint is stale).
        """
        self._check_open()
        check_workflow_id(workflow_id)
        check_optional_step(step)
        return await self._run(
            f"cannot load workflow {workflow_id!r}", self._load, workflow_id, step
        )

    async def scan(
        self,
        workflow_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        limit: int | None = None,
        descending: bool = False,
    ) -> list[StoredCheckpoint]:
        """Return records with ``after < step < before`` in step order, at most ``limit``.

        Cost: one listing of the workflow's directory (names only) plus one read per
        returned record.
        """
        self._check_open()
        check_workflow_id(workflow_id)
        check_optional_step(after, "after")
        check_optional_step(before, "before")
        if limit is not None and (type(limit) is not int or limit < 1):
            raise InvalidArgumentError(f"limit must be an int >= 1 or None, got {limit!r}")
        return await self._run(
            f"cannot scan workflow {workflow_id!r}",
            self._scan,
            workflow_id,
            after,
            before,
            limit,
            descending,
        )

    async def exists(self, workflow_id: str, step: int | None = None) -> bool:
        """Whether the step (or any step) is stored. Cost: a stat or two."""
        self._check_open()
        check_workflow_id(workflow_id)
        check_optional_step(step)
        return await self._run(
            f"cannot check workflow {workflow_id!r}", self._exists, workflow_id, step
        )

    async def delete(self, workflow_id: str, step: int | None = None) -> bool:
        """Delete one step (unlink + directory fsync) or the whole workflow directory."""
        self._check_open()
        check_workflow_id(workflow_id)
        check_optional_step(step)
        what = f"cannot delete workflow {workflow_id!r}"
        if step is None:
            return await self._run(what, self._then_gc, self._delete_workflow, workflow_id)
        return await self._run(what, self._then_gc, self._delete_step, workflow_id, step)

    async def list_workflows(self) -> list[str]:
        """Every workflow id with at least one record, sorted.

        Cost: one listing of ``workflows/`` and a short directory read per workflow.
        """
        self._check_open()
        return await self._run("cannot list workflows", self._list_workflows)

    async def save_tree(
        self,
        workflow_id: str,
        step: int,
        record: bytes,
        split: SplitResult,
        *,
        keep_last: int | None = None,
        fence: Lease | None = None,
    ) -> None:
        """Durably store ``split``'s blobs, then ``record`` as ``step`` (as in :meth:`save`).

        The new blobs go into one pack file (one write, fsync, rename and directory
        fsync); blobs already stored cost a ``stat`` of their pack (none while this
        process has seen it within half the grace period). The record is written only
        after all of them are durable.
        """
        self._check_open()
        if fence is not None:
            raise UnsupportedOperationError("FileCheckpointStorage keeps no leases")
        check_workflow_id(workflow_id)
        check_step(step)
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise InvalidArgumentError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        check_record_size(record, self._max)
        for blob in split.blobs.values():
            check_record_size(blob, self._max)
        await self._run(
            f"cannot save step {step} of workflow {workflow_id!r}",
            self._save_tree,
            workflow_id,
            step,
            bytes(record),
            split,
            keep_last,
        )

    async def fetch_blobs(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        """Return the stored blobs among ``hashes`` (one thread hop, a few reads per pack)."""
        self._check_open()
        return await self._run("cannot read blobs", self._fetch, list(hashes))

    async def collect_garbage(self, *, grace: float | None = None) -> int:
        """Delete blobs no record references; return how many were deleted.

        Mark-and-sweep: reads every version-2 record and the blobs they reach, then
        deletes unreferenced blobs older than ``grace`` seconds (default: the store's
        ``blob_grace_seconds``). Waits for a sweep running in another process to finish
        first. Safe while other processes save: see docs/file-storage.md.
        """
        self._check_open()
        if grace is not None and (
            isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0
        ):
            raise InvalidArgumentError(f"grace must be a number >= 0, got {grace!r}")
        chosen = self._blobs.grace if grace is None else float(grace)
        freed = await self._run("cannot collect garbage", self._collect, chosen, True)
        return freed or 0

    async def close(self) -> None:
        """Finish the queued saves; later calls raise."""
        self._closed = True
        while self._busy is not None or self._queue:
            waiter = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            self._schedule_kick()
            await waiter

    # --- group commit (the event-loop half) -------------------------------------------

    async def _commit(self, op: _SaveOp) -> None:
        """Queue ``op`` for the next group commit and wait until it is durable."""
        item = _Pending(op, asyncio.get_running_loop().create_future())
        self._queue.append(item)
        self._schedule_kick()
        try:
            await asyncio.shield(item.future)
        except asyncio.CancelledError:
            if not item.taken:
                item.future.cancel()  # still queued: the next group skips it
                raise
            await _outlast(item.future)  # being written: it lands whole or not at all
            raise

    def _schedule_kick(self) -> None:
        # One loop iteration later, so that every caller woken together joins one group.
        if not self._kick_due:
            self._kick_due = True
            asyncio.get_running_loop().call_soon(self._kick)

    def _kick(self) -> None:
        self._kick_due = False
        if self._busy is not None and not self._busy.is_closed():
            return
        self._busy = None
        group: list[_Pending] = []
        size = 0
        while self._queue and len(group) < _MAX_GROUP:
            item = self._queue[0]
            if item.future.done():  # cancelled while queued
                self._queue.popleft()
                continue
            if group and size + len(item.op.data) > _MAX_GROUP_BYTES:
                break
            self._queue.popleft()
            item.taken = True
            group.append(item)
            size += len(item.op.data)
        if not group:
            idle, self._idle = self._idle, []
            for waiter in idle:
                if not waiter.done():
                    waiter.set_result(None)
            return
        loop = asyncio.get_running_loop()
        self._busy = loop
        # The loop's default executor: a store that is never closed holds no thread.
        done = loop.run_in_executor(None, self._write_group, [i.op for i in group])
        done.add_done_callback(functools.partial(self._group_done, group))

    def _group_done(
        self, group: list[_Pending], done: asyncio.Future[list[BaseException | None]]
    ) -> None:
        outcomes: list[BaseException | None]
        if done.cancelled():
            outcomes = [StorageClosedError("the write was abandoned")] * len(group)
        elif (failure := done.exception()) is not None:
            outcomes = [failure] * len(group)
        else:
            outcomes = done.result()
        self._wake(done.get_loop(), list(zip(group, outcomes, strict=True)))

    def _wake(
        self,
        loop: asyncio.AbstractEventLoop,
        results: list[tuple[_Pending, BaseException | None]],
    ) -> None:
        # A few callers per loop iteration: each goes on to encode its next checkpoint on
        # the loop, and a hundred of them at once would hold it for milliseconds.
        for item, outcome in results[:_WAKE_SLICE]:
            if item.future.done():
                continue
            if outcome is None:
                item.future.set_result(None)
            elif isinstance(outcome, OSError):
                error = StorageBackendError(f"{_what(item.op)} in {self._base}: {outcome}")
                error.__cause__ = outcome
                item.future.set_exception(error)
            else:
                item.future.set_exception(outcome)
        if len(results) > _WAKE_SLICE:
            loop.call_soon(self._wake, loop, results[_WAKE_SLICE:])
        else:
            loop.call_soon(self._writer_free)

    def _writer_free(self) -> None:
        self._busy = None
        self._kick()

    async def _run(self, what: str, fn: Callable[..., _T], *args: object) -> _T:
        self._check_open()
        try:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args))
        except OSError as exc:
            raise StorageBackendError(f"{what} in {self._base}: {exc}") from exc

    # --- blobs ------------------------------------------------------------------------

    def _save_tree(
        self, workflow_id: str, step: int, record: bytes, split: SplitResult, keep_last: int | None
    ) -> None:
        self._ensure_store()
        if self._format < FORMAT_VERSION:
            self._write_atomic(self._base, MARKER, _marker(FORMAT_VERSION))
            self._format = FORMAT_VERSION
        self._blobs._os = self._os
        self._blobs.put(split)  # durable before the record that references them
        self._save(workflow_id, step, record, keep_last)

    def _fetch(self, hashes: list[bytes]) -> dict[bytes, bytes]:
        self._check_marker()
        return self._blobs.fetch(hashes)

    def _collect(self, grace: float, wait: bool) -> int | None:
        self._check_marker()
        self._blobs._os = self._os
        return self._blobs.collect(self._root, grace, wait=wait)

    def _then_gc(self, fn: Callable[..., bool], *args: object) -> bool:
        deleted = fn(*args)
        if deleted:
            self._after_delete()
        return deleted

    def _after_delete(self) -> None:
        """Sweep if records went and no sweep ran for ``gc_interval`` (housekeeping)."""
        if self._gc_interval is None or self._format < _FORMAT_BLOBS:
            return
        try:
            last = self._blobs.last_collection()
            if last is None or time.time() - last < self._gc_interval:
                return
            self._collect(self._blobs.grace, False)
        except (OSError, CheckpointCorruptedError) as exc:
            logger.warning("garbage collection of blobs failed: %s", exc)

    # --- store level ------------------------------------------------------------------

    def _check_marker(self) -> None:
        if self._marker_ok:
            return
        path = os.path.join(self._base, MARKER)
        try:
            with open(path, "rb") as f:
                raw = f.read(4096)
        except FileNotFoundError:
            return
        try:
            fmt = json.loads(raw)["format"]
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageSchemaError(f"{path} is not an aiocheckpoint format marker") from exc
        if type(fmt) is not int or fmt < 1:
            raise StorageSchemaError(f"{path} names an unknown format {fmt!r}")
        if fmt > FORMAT_VERSION:
            raise StorageSchemaError(
                f"{self._base} uses file store format {fmt}; this version of aiocheckpoint "
                f"reads formats up to {FORMAT_VERSION} only (upgrade aiocheckpoint)"
            )
        self._format = fmt
        self._marker_ok = True

    def _ensure_store(self) -> None:
        if self._store_ready:
            return
        self._check_marker()
        self._make_dirs(self._base)
        if not self._marker_ok:
            self._write_atomic(self._base, MARKER, _marker(_FORMAT_PLAIN))
            self._format = _FORMAT_PLAIN
            self._marker_ok = True
        with contextlib.suppress(FileExistsError):
            self._os.mkdir(self._root)
            self._fsync_path(self._base)
        if self._format >= _FORMAT_BLOBS:
            self._blobs.remove_stale_temps()
        self._store_ready = True

    def _make_dirs(self, path: str) -> None:
        """Create ``path`` (0700) and missing ancestors, fsyncing each new entry's parent."""
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        for new in reversed(missing):
            try:
                if new is missing[0]:
                    self._os.mkdir(new)
                else:
                    os.mkdir(new)  # an ancestor: the umask decides, as for any directory
            except FileExistsError:
                continue
            self._fsync_path(os.path.dirname(new))

    def _write_atomic(self, directory: str, name: str, body: bytes) -> None:
        dfd = os.open(directory, _DIR_FLAGS & ~os.O_NOFOLLOW)
        try:
            tmp = self._write_temp(dfd, body)
            try:
                self._os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                self._discard(tmp, dfd)
                raise
            self._os.fsync_dir(dfd)
        finally:
            os.close(dfd)

    def _fsync_path(self, directory: str) -> None:
        dfd = os.open(directory, _DIR_FLAGS & ~os.O_NOFOLLOW)
        try:
            self._os.fsync_dir(dfd)
        finally:
            os.close(dfd)

    # --- workflow directories ---------------------------------------------------------

    def _open_dir(self, name: str) -> int | None:
        try:
            return os.open(os.path.join(self._root, name), _DIR_FLAGS)
        except OSError as exc:
            if is_missing(exc):
                return None
            raise

    def _create_dir(self, name: str, workflow_id: str) -> None:
        """Build the directory under a temporary name, then rename it into place.

        Readers therefore never see a workflow directory without its lock, hint and id.
        """
        tmp = temp_name("new")
        path = os.path.join(self._root, tmp)
        self._os.mkdir(path)
        try:
            dfd = os.open(path, _DIR_FLAGS)
            try:
                ino = os.fstat(dfd).st_ino
                self._close(self._os.open(LOCK, _NEW_FLAGS, 0o600, dir_fd=dfd))
                self._write_hint(dfd, None, ino, durable=True)
                if name.startswith(HASHED_PREFIX):
                    self._close(self._fsynced_file(dfd, ID_FILE, workflow_id.encode("utf-8")))
                self._os.fsync_dir(dfd)
            finally:
                os.close(dfd)
            try:
                self._os.rename(
                    path, os.path.join(self._root, name), src_dir_fd=None, dst_dir_fd=None
                )
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                return  # another writer created it first; use theirs
            self._fsync_path(self._root)
        finally:
            shutil.rmtree(path, ignore_errors=True)

    @contextlib.contextmanager
    def _lock(self, dfd: int, name: str) -> Iterator[None]:
        """Hold the workflow's flock; raise :class:`_Replaced` if the directory moved."""
        try:
            fd = self._os.open(LOCK, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if is_missing(exc):
                # delete(workflow) removed the directory while we held its fd: start over.
                raise _Replaced from exc
            if exc.errno not in (errno.EROFS, errno.EACCES):
                raise
            fd = os.open(LOCK, os.O_RDONLY | _OPEN_FLAGS, dir_fd=dfd)  # flock needs no write
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # delete(workflow) renames the directory away under this lock; a waiter that
            # then gets the lock must not write into the doomed directory.
            try:
                current = os.stat(os.path.join(self._root, name), follow_symlinks=False)
            except OSError as exc:
                if is_missing(exc):
                    raise _Replaced from exc
                raise
            mine = os.fstat(dfd)
            if (current.st_ino, current.st_dev) != (mine.st_ino, mine.st_dev):
                raise _Replaced
            yield
        finally:
            os.close(fd)

    def _steps(self, dfd: int) -> list[int]:
        return [s for n in os.listdir(dfd) if (s := parse_step_name(n)) is not None]

    def _has_steps(self, dfd: int) -> bool:
        with os.scandir(dfd) as entries:
            return any(parse_step_name(e.name) is not None for e in entries)

    def _sweep_once(self, dfd: int, name: str, ino: int) -> None:
        """Remove temporary files left by crashed writers (first write per directory)."""
        if (name, ino) in self._swept:
            return
        now = time.time()
        for entry in os.listdir(dfd):
            if entry.startswith(".tmp-") and self._is_stale(entry, now, dfd):
                with contextlib.suppress(FileNotFoundError):
                    self._os.unlink(entry, dir_fd=dfd)
        self._swept.add((name, ino))

    def _is_stale(self, entry: str, now: float, dfd: int | None) -> bool:
        """Whether temporary ``entry`` (in ``dfd``, or in ``workflows/``) is abandoned."""
        if pid_is_dead(entry):
            return True
        path = entry if dfd is not None else os.path.join(self._root, entry)
        try:
            mtime = os.stat(path, dir_fd=dfd, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            return False
        return now - mtime > self._stale

    # --- the latest-step hint ---------------------------------------------------------

    def _read_hint(self, dfd: int) -> Hint | None:
        raw = _read_small(HINT, dfd, Hint.SIZE + 1)
        return None if raw is None else Hint.unpack(raw)

    def _trusted(self, hint: Hint | None, ino: int) -> bool:
        return hint is not None and hint.dir_ino == ino

    def _write_hint(self, dfd: int, step: int | None, ino: int, *, durable: bool) -> None:
        data = Hint(step, ino).pack()
        fd = self._os.open(HINT, os.O_WRONLY | os.O_CREAT | _OPEN_FLAGS, dir_fd=dfd)
        try:
            if self._os.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.EIO, "short write to the latest-step hint")
            if os.fstat(fd).st_size != len(data):
                os.ftruncate(fd, len(data))
            if durable:
                self._os.fsync(fd)
        finally:
            os.close(fd)

    def _rebuild_hint(self, dfd: int, ino: int, *, best_effort: bool = False) -> int | None:
        """Scan the directory (under the lock) and write an exact hint; return the top.

        The rebuilt hint is not fsynced: if it is lost, the one it replaced, which was
        durable and no lower, comes back. Readers pass ``best_effort``: on a read-only
        store the old hint simply stays.
        """
        top = max(self._steps(dfd), default=None)
        try:
            self._write_hint(dfd, top, ino, durable=False)
        except OSError as exc:
            if not best_effort:
                raise
            logger.debug("could not rewrite the latest-step hint: %s", exc)
        return top

    def _raise_hint(self, dfd: int, ino: int, step: int, *, durable: bool) -> None:
        """Make the hint at least ``step`` (under the lock), with one open of the file.

        An untrusted hint is replaced by the exact top (a scan) or ``step`` if higher;
        ``durable`` fsyncs it when it now names ``step``.
        """
        fd = self._os.open(HINT, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, dir_fd=dfd)
        try:
            raw = os.pread(fd, Hint.SIZE + 1, 0)
            hint = Hint.unpack(raw)
            if hint is not None and self._trusted(hint, ino):
                top = hint.step
                if top is not None and step <= top:
                    return
            else:
                top = max(self._steps(dfd), default=None)
            target = step if top is None or step > top else top
            data = Hint(target, ino).pack()
            if self._os.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.EIO, "short write to the latest-step hint")
            if len(raw) != len(data):
                os.ftruncate(fd, len(data))
            if durable and target == step:
                self._os.fsync(fd)
        finally:
            os.close(fd)

    # --- the worker-thread halves of the public methods -------------------------------

    def _write_group(self, ops: list[_SaveOp]) -> list[BaseException | None]:
        """Write a group of saves; return each one's exception or None (durable)."""
        if len(ops) < _GROUP_MIN:
            try:
                self._save(*ops[0])
            except Exception as exc:
                return [exc]
            return [None]
        try:
            self._ensure_store()
            outcomes, retry = self._save_group(ops)
        except Exception as exc:
            return [exc] * len(ops)
        for i in retry:  # the workflow's directory was replaced under us: one by one
            try:
                self._save(*ops[i])
            except Exception as exc:
                outcomes[i] = exc
        if self._pruned:
            self._pruned = False
            self._after_delete()
        return outcomes

    def _save_group(self, ops: list[_SaveOp]) -> tuple[list[BaseException | None], list[int]]:
        """Temp files, locks and hints, ``syncfs``, renames, ``syncfs``; see the docs.

        Returns each op's outcome and the ops to retry one by one.
        """
        outcomes: list[BaseException | None] = [None] * len(ops)
        retry: list[int] = []
        dirs: dict[str, tuple[int, int]] = {}  # name -> (dfd, inode)
        names = [encode_name(op.workflow_id) for op in ops]
        temps: dict[int, str] = {}  # op index -> its temp file, until renamed or discarded
        renamed: list[int] = []
        # Opened before any write: syncfs reports write-back errors since this open.
        sync_fd = os.open(self._root, _DIR_FLAGS & ~os.O_NOFOLLOW)
        try:
            for i, op in enumerate(ops):
                try:
                    entry = dirs.get(names[i]) or self._group_dir(names[i], op.workflow_id, dirs)
                    if entry is None:
                        retry.append(i)
                        continue
                    self._sweep_once(entry[0], names[i], entry[1])
                    temps[i] = self._write_temp(entry[0], op.data, durable=False)
                except FileNotFoundError:
                    retry.append(i)  # the directory was deleted after we opened it
                except OSError as exc:
                    outcomes[i] = exc
            by_dir: dict[str, list[int]] = {}
            for i in temps:
                by_dir.setdefault(names[i], []).append(i)
            with contextlib.ExitStack() as locks:
                # Sorted, so that two processes' groups never wait for each other's locks.
                for name in sorted(by_dir):
                    dfd, ino = dirs[name]
                    try:
                        locks.enter_context(self._lock(dfd, name))
                        # Raised before the renames and made durable by the first syncfs,
                        # as in _save_in: never lower than a step on disk.
                        high = max(ops[i].step for i in by_dir[name])
                        self._raise_hint(dfd, ino, high, durable=False)
                    except (_Replaced, OSError) as exc:
                        for i in by_dir[name]:
                            self._discard(temps.pop(i), dfd)
                            if isinstance(exc, OSError):
                                outcomes[i] = exc
                            else:
                                retry.append(i)
                if temps:
                    try:
                        self._os.syncfs(sync_fd)  # the temp files' data and the hints
                    except OSError as exc:
                        for i in temps:
                            outcomes[i] = exc
                        raise _Abandon from exc
                for i in sorted(temps):
                    dfd = dirs[names[i]][0]
                    try:
                        self._os.rename(
                            temps[i], step_name(ops[i].step), src_dir_fd=dfd, dst_dir_fd=dfd
                        )
                    except OSError as exc:
                        outcomes[i] = exc
                        continue
                    del temps[i]
                    renamed.append(i)
                    keep_last = ops[i].keep_last
                    if keep_last is not None:
                        self._prune(dfd, keep_last)
            if renamed:
                try:
                    self._os.syncfs(sync_fd)  # the renames and the prunes
                except OSError as exc:
                    for i in renamed:
                        outcomes[i] = exc
        except _Abandon:
            pass
        finally:
            for i, tmp in temps.items():
                self._discard(tmp, dirs[names[i]][0])
            for dfd, _ in dirs.values():
                os.close(dfd)
            os.close(sync_fd)
        return outcomes, retry

    def _group_dir(
        self, name: str, workflow_id: str, dirs: dict[str, tuple[int, int]]
    ) -> tuple[int, int] | None:
        """Open (creating it if needed) a workflow's directory for a group; None: retry."""
        for _ in range(2):
            dfd = self._open_dir(name)
            if dfd is None:
                self._create_dir(name, workflow_id)
                continue
            try:
                dirs[name] = (dfd, os.fstat(dfd).st_ino)
            except BaseException:
                os.close(dfd)
                raise
            return dirs[name]
        return None

    def _save(self, workflow_id: str, step: int, data: bytes, keep_last: int | None) -> None:
        self._ensure_store()
        name = encode_name(workflow_id)
        for _ in range(_RETRIES):
            dfd = self._open_dir(name)
            if dfd is None:
                self._create_dir(name, workflow_id)
                continue
            try:
                if self._save_in(dfd, name, step, data, keep_last):
                    if self._pruned:
                        self._pruned = False
                        self._after_delete()
                    return
            finally:
                os.close(dfd)
        raise StorageBackendError(f"workflow directory {name!r} kept being replaced")

    def _save_in(self, dfd: int, name: str, step: int, data: bytes, keep_last: int | None) -> bool:
        ino = os.fstat(dfd).st_ino
        self._sweep_once(dfd, name, ino)
        tmp: str | None = None
        try:
            try:
                tmp = self._write_temp(dfd, data)
            except FileNotFoundError:
                return False  # the directory was deleted after we opened it
            with self._lock(dfd, name):
                # The hint is raised, durably, before the rename: it may name a step that
                # never arrives (readers then scan), but it is never lower than a step
                # that is on disk, even after a power cut.
                self._raise_hint(dfd, ino, step, durable=True)
                self._os.rename(tmp, step_name(step), src_dir_fd=dfd, dst_dir_fd=dfd)
                tmp = None
                if keep_last is not None:
                    self._prune(dfd, keep_last)
            self._os.fsync_dir(dfd)
            return True
        except _Replaced:
            return False
        finally:
            if tmp is not None:
                self._discard(tmp, dfd)

    def _write_temp(self, dfd: int, data: bytes, *, durable: bool = True) -> str:
        tmp = temp_name()
        fd = self._fsynced_file(dfd, tmp, data, durable=durable)
        try:
            self._close(fd)
        except BaseException:
            self._discard(tmp, dfd)
            raise
        return tmp

    def _fsynced_file(self, dfd: int, name: str, data: bytes, *, durable: bool = True) -> int:
        """Create ``name`` (0600, must not exist), write and fsync ``data``; return the fd.

        ``durable=False`` skips the fsync: the caller makes the data durable some other way.
        """
        fd = self._os.open(name, _NEW_FLAGS, 0o600, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[self._os.write(fd, view) :]
            if durable:
                self._os.fsync(fd)
        except BaseException:
            os.close(fd)
            self._discard(name, dfd)
            raise
        return fd

    def _close(self, fd: int) -> None:
        self._os.close(fd)

    def _discard(self, name: str, dfd: int) -> None:
        try:
            os.unlink(name, dir_fd=dfd)
        except OSError as exc:
            if not is_missing(exc):
                logger.warning("could not remove temporary file %r: %s", name, exc)

    def _prune(self, dfd: int, keep_last: int) -> None:
        # Retention is housekeeping: the new record is already in place, and the next save
        # prunes again, so a failure here is logged rather than failing the save.
        try:
            steps = sorted(self._steps(dfd))
            for old in steps[: max(0, len(steps) - keep_last)]:
                with contextlib.suppress(FileNotFoundError):
                    self._os.unlink(step_name(old), dir_fd=dfd)
                    self._pruned = True
        except OSError as exc:
            logger.warning("retention could not delete old checkpoints: %s", exc)

    def _read_step(self, dfd: int, workflow_id: str, step: int) -> StoredCheckpoint | None:
        try:
            fd = os.open(step_name(step), _READ_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if is_missing(exc):
                return None
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise CheckpointCorruptedError(
                    "not a regular file", workflow_id=workflow_id, step=step
                )
            if info.st_size > self._max:
                raise CheckpointCorruptedError(
                    f"file is {info.st_size} bytes, over max_record_bytes={self._max}",
                    workflow_id=workflow_id,
                    step=step,
                )
            chunks: list[bytes] = []
            total = 0
            while chunk := os.read(fd, max(info.st_size - total, 0) + 1):
                total += len(chunk)
                if total > self._max:
                    raise CheckpointCorruptedError(
                        f"file grew over max_record_bytes={self._max}",
                        workflow_id=workflow_id,
                        step=step,
                    )
                chunks.append(chunk)
            return StoredCheckpoint(step, b"".join(chunks))
        finally:
            os.close(fd)

    def _load(self, workflow_id: str, step: int | None) -> StoredCheckpoint | None:
        self._check_marker()
        name = encode_name(workflow_id)
        for _ in range(_RETRIES):
            dfd = self._open_dir(name)
            if dfd is None:
                return None
            try:
                if step is not None:
                    return self._read_step(dfd, workflow_id, step)
                ino = os.fstat(dfd).st_ino
                hint = self._read_hint(dfd)
                if self._trusted(hint, ino):
                    assert hint is not None
                    if hint.step is None:
                        return None
                    found = self._read_step(dfd, workflow_id, hint.step)
                    if found is not None:
                        return found
                # No trustworthy hint, or it names a step whose write never finished.
                with self._lock(dfd, name):
                    top = self._rebuild_hint(dfd, ino, best_effort=True)
                    return None if top is None else self._read_step(dfd, workflow_id, top)
            except _Replaced:
                continue
            finally:
                os.close(dfd)
        raise StorageBackendError(f"workflow directory {name!r} kept being replaced")

    def _scan(
        self,
        workflow_id: str,
        after: int | None,
        before: int | None,
        limit: int | None,
        descending: bool,
    ) -> list[StoredCheckpoint]:
        self._check_marker()
        dfd = self._open_dir(encode_name(workflow_id))
        if dfd is None:
            return []
        try:
            # Step names are fixed width, so bounds and order work on the names themselves
            # and only the names actually returned are parsed.
            low = "" if after is None else step_name(after)
            high = "~" if before is None else step_name(before)
            names = sorted(
                n
                for n in os.listdir(dfd)
                if len(n) == 25 and n.endswith(".ckpt") and low < n < high
            )
            if descending:
                names.reverse()
            out: list[StoredCheckpoint] = []
            for n in names:
                if limit is not None and len(out) >= limit:
                    break
                s = parse_step_name(n)
                if s is None:
                    continue
                record = self._read_step(dfd, workflow_id, s)
                if record is not None:  # None: deleted since the listing
                    out.append(record)
            return out
        finally:
            os.close(dfd)

    def _exists(self, workflow_id: str, step: int | None) -> bool:
        self._check_marker()
        name = encode_name(workflow_id)
        dfd = self._open_dir(name)
        if dfd is None:
            return False
        try:
            if step is not None:
                return self._stat_exists(step_name(step), dfd)
            hint = self._read_hint(dfd)
            if self._trusted(hint, os.fstat(dfd).st_ino):
                assert hint is not None
                if hint.step is None:
                    return False
                if self._stat_exists(step_name(hint.step), dfd):
                    return True
            return self._has_steps(dfd)
        finally:
            os.close(dfd)

    def _stat_exists(self, entry: str, dfd: int) -> bool:
        try:
            os.stat(entry, dir_fd=dfd, follow_symlinks=False)
        except OSError as exc:
            if is_missing(exc):
                return False
            raise
        return True

    def _delete_step(self, workflow_id: str, step: int) -> bool:
        self._check_marker()
        name = encode_name(workflow_id)
        for _ in range(_RETRIES):
            dfd = self._open_dir(name)
            if dfd is None:
                return False
            try:
                ino = os.fstat(dfd).st_ino
                with self._lock(dfd, name):
                    try:
                        self._os.unlink(step_name(step), dir_fd=dfd)
                    except OSError as exc:
                        if is_missing(exc):
                            return False
                        raise
                    # The unlink must be durable before the hint is lowered: a power cut
                    # that undid the unlink would otherwise leave a step above the hint.
                    self._os.fsync_dir(dfd)
                    hint = self._read_hint(dfd)
                    above = hint is not None and hint.step is not None and hint.step > step
                    if not (self._trusted(hint, ino) and above):
                        self._rebuild_hint(dfd, ino)
                return True
            except _Replaced:
                continue
            finally:
                os.close(dfd)
        raise StorageBackendError(f"workflow directory {name!r} kept being replaced")

    def _delete_workflow(self, workflow_id: str) -> bool:
        self._check_marker()
        name = encode_name(workflow_id)
        for _ in range(_RETRIES):
            dfd = self._open_dir(name)
            if dfd is None:
                return False
            doomed = os.path.join(self._root, temp_name("del"))
            try:
                with self._lock(dfd, name):
                    had_steps = self._has_steps(dfd)
                    # Rename first so that readers never see half a workflow.
                    self._os.rename(
                        os.path.join(self._root, name), doomed, src_dir_fd=None, dst_dir_fd=None
                    )
            except _Replaced:
                continue
            finally:
                os.close(dfd)
            self._fsync_path(self._root)
            self._remove_tree(doomed)
            return had_steps
        raise StorageBackendError(f"workflow directory {name!r} kept being replaced")

    def _list_workflows(self) -> list[str]:
        self._check_marker()
        try:
            names = os.listdir(self._root)
        except OSError as exc:
            if is_missing(exc):
                return []
            raise
        now = time.time()
        ids: list[str] = []
        for name in names:
            if name.startswith("."):
                # A renamed-away workflow is garbage at once; a new one may still be in
                # the making unless its creator is gone.
                if name.startswith(".del-") or (
                    name.startswith(".new-") and self._is_stale(name, now, None)
                ):
                    self._remove_tree(os.path.join(self._root, name))
                continue
            dfd = self._open_dir(name)
            if dfd is None:
                continue
            try:
                workflow_id = self._id_of(name, dfd)
                if workflow_id is not None and self._has_steps(dfd):
                    ids.append(workflow_id)
            finally:
                os.close(dfd)
        return sorted(ids)

    def _remove_tree(self, path: str) -> None:
        # A writer that opened the directory before it was renamed away may still drop a
        # temporary file into it (it then notices and retries elsewhere), so try again.
        for _ in range(3):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                return

    def _id_of(self, name: str, dfd: int) -> str | None:
        if not name.startswith(HASHED_PREFIX):
            return decode_name(name)
        raw = _read_small(ID_FILE, dfd, 1024)
        if raw is None:
            return None
        if hashed_name(raw) != name:
            return None  # not ours, or damaged: never guess an id
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None


class _Abandon(Exception):
    """The group's first syncfs failed: nothing is renamed, every temp file is removed."""


def _what(op: _SaveOp) -> str:
    return f"cannot save step {op.step} of workflow {op.workflow_id!r}"


async def _outlast(future: asyncio.Future[None]) -> None:
    """Wait for ``future`` however often the caller is cancelled; ignore its outcome."""
    # Shielded: an anyio cancel scope delivers its cancellation again at every await, so
    # without the shield this loop would spin on the event loop until the group is written,
    # and the spinning loop would starve the group's thread of the GIL (measured: a storm
    # of 100 cancelled workflows took 228 s instead of 0.2 s).
    with anyio.CancelScope(shield=True):
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait((future,))
    if not future.cancelled():
        future.exception()  # retrieved: the caller is being cancelled anyway


def _marker(fmt: int) -> bytes:
    return json.dumps({"format": fmt}).encode() + b"\n"


def _read_small(name: str, dfd: int, limit: int) -> bytes | None:
    """Read at most ``limit`` bytes of a small file in ``dfd``; None if it does not exist."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
    except OSError as exc:
        if is_missing(exc):
            return None
        raise
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)
