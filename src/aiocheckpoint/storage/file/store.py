"""FileCheckpointStorage: the public class of the file store (its API and argument checks).

Each public method checks its arguments on the event loop and makes exactly one hop to a
worker thread, where the parts of this package do the work: :mod:`.layout` (the store's
directory), :mod:`.records` and :mod:`.dirs` (the workflows' records), :mod:`.groupcommit`
(concurrent saves), :mod:`.blobs` and :mod:`.gc` (content-addressed blobs). So a save's
write, fsync, rename and directory fsync run together and a cancelled caller still waits for
them: the record lands whole or not at all.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

import anyio.to_thread

from ..._validation import check_optional_step, check_save, check_step, check_workflow_id
from ...errors import (
    CheckpointCorruptedError,
    InvalidArgumentError,
    UnsupportedOperationError,
)
from ...format import SplitResult, TreeParams
from ...leases import Lease
from ..base import (
    DEFAULT_MAX_RECORD_BYTES,
    BaseStorage,
    BlobFetch,
    StoredCheckpoint,
    StoredEffect,
    check_blob_sizes,
    check_effect_key,
    check_max_record_bytes,
    check_record_size,
)
from ..diskfull import storage_error
from .blobs import BlobStore
from .dirs import ForeignEntry, WorkflowDirs
from .effects import EffectFiles
from .gc import Collector
from .groupcommit import EffectOp, GroupCommit, Op, SaveOp
from .io import FileOps
from .layout import StoreDir
from .names import FORMAT_BLOBS, FORMAT_VERSION, encode_name
from .records import RecordFiles
from .writers import holding

__all__ = ["FileCheckpointStorage"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


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
    group commit: their files, a barrier, the renames, a barrier. A barrier is one
    ``syncfs(2)`` where the store has established that it is durable (Linux 5.8 or later,
    on a local filesystem whose type is on a short list: ext4, XFS, btrfs, tmpfs), and an
    fsync of every file, then of every directory, issued together, everywhere else (FUSE,
    network and layered filesystems; see docs/file-storage.md, "Filesystems").
    ``use_syncfs=False`` never uses ``syncfs``: choose it when other programs write a lot
    to the same filesystem, since ``syncfs`` also waits for their data.

    The store's directory must belong to the current user and be writable by no one else
    (else its first operation raises
    :class:`~aiocheckpoint.errors.StoragePermissionError`): another user could plant
    forged records in it. ``allow_shared=True`` lifts that check for a directory shared
    on purpose. Every file of the store is opened without following symlinks and without
    blocking; anything but a regular file where the store expects one is reported, never
    waited on (docs/file-storage.md, "A store that holds anything").

    It is a :class:`~aiocheckpoint.storage.base.BlobCheckpointStorage`: the manager stores
    large states as content-addressed blobs under ``blobs/`` (``compression="zstd"``
    compresses them; ``blob_params`` sets every cutting parameter). Blobs no record
    references are deleted by :meth:`collect_garbage`, which also runs after retention or
    deletes once ``gc_interval`` seconds have passed since the last collection (``None``:
    only when called). A blob younger than ``blob_grace_seconds`` is never deleted; it must
    exceed the longest save and the longest read (see docs/file-storage.md).
    """

    db_system = "aiocheckpoint.file"

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
        allow_shared: bool = False,
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
        self._max = max_record_bytes
        ops = FileOps()
        for flag, given in (("use_syncfs", use_syncfs), ("allow_shared", allow_shared)):
            if not isinstance(given, bool):
                raise InvalidArgumentError(f"{flag} must be a bool, got {given!r}")
        base = os.path.abspath(os.fspath(base_dir))
        self._layout = StoreDir(base, ops, allow_shared=allow_shared)
        self._base = self._layout.base
        self._root = self._layout.root
        self._dirs = WorkflowDirs(self._root, ops, float(stale_temp_seconds))
        self._records = RecordFiles(self._dirs, max_record_bytes)
        self._effects = EffectFiles(self._dirs, max_record_bytes)
        self._blobs = BlobStore(
            self._base, ops, float(blob_grace_seconds), max_record_bytes, float(stale_temp_seconds)
        )
        self._collector = Collector(self._blobs)
        #: Tree saves waiting for their group: their split and when its blobs were put.
        self._trees: dict[int, tuple[SplitResult, float]] = {}
        self._group = GroupCommit(
            self._base,
            self._dirs,
            self._write_op,
            self._prepare_group,
            self._after_delete,
            use_syncfs=use_syncfs,
        )

    @property
    def _os(self) -> FileOps:
        """The OS-call seam every part uses; tests assign a fault-injecting one."""
        return self._layout.ops

    @_os.setter
    def _os(self, ops: FileOps) -> None:
        self._layout.ops = self._dirs.ops = self._blobs.ops = ops

    def writer_lock(
        self, workflow_id: str, *, wait: float = 60.0
    ) -> AbstractAsyncContextManager[None]:
        """Hold ``workflow_id`` for one writer at a time, across processes (``async with``).

        What the integrations' writers take instead of a lease, which this store does not
        keep: an exclusive ``flock`` on ``base_dir/locks/<workflow>`` (see
        :mod:`aiocheckpoint.storage.file.writers`). Waits at most ``wait`` seconds, then
        raises :class:`~aiocheckpoint.LeaseHeldError`; released on every exit, and by the
        kernel when the process dies. It does not fence the store's own writes.
        """
        check_workflow_id(workflow_id)
        if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not wait > 0:
            raise InvalidArgumentError(f"wait must be a positive number, not {wait!r}")
        return holding(self._layout, workflow_id, float(wait))

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
        two ``syncfs`` calls (where those are durable; else its own fsyncs, issued with the
        group's); with ``keep_last``, also one listing of the workflow's directory and an
        unlink per pruned step.
        """
        self._check_open()
        check_save(workflow_id, step, keep_last)
        check_record_size(data, self._max)
        op = SaveOp(workflow_id, step, bytes(data), keep_last)
        await self._group.commit(op)

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

    async def foreign_entries(self) -> list[ForeignEntry]:
        """Every entry of ``workflows/`` that is no workflow's directory (a full listing).

        A directory whose name is not the canonical name of an id, a hashed directory whose
        ``id`` file is missing or names another workflow, a file or a symlink: listings
        and reads skip them; this reports them, for verification tools.
        """
        self._check_open()
        return await self._run("cannot list the store's entries", self._foreign_entries)

    async def save_tree(
        self,
        workflow_id: str,
        step: int,
        record: bytes,
        split: SplitResult,
        *,
        keep_last: int | None = None,
        fence: Lease | None = None,
        step_info: object = None,
    ) -> None:
        """Durably store ``split``'s blobs, then ``record`` as ``step`` (as in :meth:`save`).

        ``step_info`` is ignored: this store keeps no workflow records.

        The new blobs go into one pack file (one write, fsync, rename and directory
        fsync) in a worker thread; blobs already stored cost a ``stat`` of their pack (none
        while this process has seen it within half the grace period). The record is
        queued only after all of them are durable, in the group commit of :meth:`save`.
        """
        self._check_open()
        if fence is not None:
            raise UnsupportedOperationError("FileCheckpointStorage keeps no leases")
        check_save(workflow_id, step, keep_last)
        check_record_size(record, self._max)
        check_blob_sizes(split, self._max)
        op = SaveOp(workflow_id, step, bytes(record), keep_last)
        await self._run(f"cannot save step {step} of workflow {workflow_id!r}", self._put, split)
        # The blobs are durable: the record joins the saves' group commit, so twenty saves
        # woken together share one group's barriers instead of fsyncing in twenty threads.
        self._trees[id(op)] = split, time.monotonic()
        try:
            await self._group.commit(op)
        finally:
            del self._trees[id(op)]

    # --- the effect journal (EffectStorage) -------------------------------------------

    async def put_effect(
        self,
        workflow_id: str,
        step: int,
        key: str,
        data: bytes,
        *,
        in_doubt: bool,
        fence: Lease | None = None,
    ) -> None:
        """Durably store an effect record: in the group commit, like :meth:`save`.

        Alone, one file write, its fsync, a rename and a directory fsync; queued behind a
        busy writer, a share of the next group's barriers, with the saves queued with it.
        """
        self._check_open()
        if fence is not None:
            raise UnsupportedOperationError("FileCheckpointStorage keeps no leases")
        check_workflow_id(workflow_id)
        check_step(step)
        check_effect_key(key)
        check_record_size(data, self._max)
        await self._group.commit(EffectFiles.op(workflow_id, step, key, bytes(data), in_doubt))

    async def load_effects(self, workflow_id: str, step: int) -> list[StoredEffect]:
        """The effect records of ``step``, ordered by key (a listing and a read each)."""
        self._check_open()
        check_workflow_id(workflow_id)
        check_step(step)
        return await self._run(
            f"cannot read the effects of workflow {workflow_id!r}",
            self._load_effects,
            workflow_id,
            step,
        )

    async def in_doubt_workflows(self) -> list[str]:
        """Every workflow with an effect in doubt (a pass over every effect file), sorted."""
        self._check_open()
        return await self._run("cannot list effects in doubt", self._in_doubt_workflows)

    async def has_effects(self, workflow_id: str) -> bool:
        """Whether the workflow has any effect file (a listing of its ``effects/``)."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._run(
            f"cannot read the effects of workflow {workflow_id!r}", self._has_effects, workflow_id
        )

    async def in_doubt_effects(self, workflow_id: str) -> list[StoredEffect]:
        """The workflow's effect records in doubt, ordered by step then key."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._run(
            f"cannot read the effects of workflow {workflow_id!r}",
            self._in_doubt_effects,
            workflow_id,
        )

    async def effect_workflows(self) -> list[str]:
        """Every workflow with at least one effect file, sorted (a listing per workflow)."""
        self._check_open()
        return await self._run("cannot list the effect journals", self._effect_workflows)

    async def effect_steps(self, workflow_id: str) -> list[int]:
        """The steps of ``workflow_id`` with effect files, ascending (one listing)."""
        self._check_open()
        check_workflow_id(workflow_id)
        return await self._run(
            f"cannot list the effects of workflow {workflow_id!r}",
            self._effect_steps,
            workflow_id,
        )

    async def drop_orphan_effects(self, workflow_id: str, below: int) -> int:
        """Unlink the effect files of steps below ``below`` that have no step file."""
        self._check_open()
        check_workflow_id(workflow_id)
        check_step(below)
        return await self._run(
            f"cannot drop effects of workflow {workflow_id!r}",
            self._drop_orphan_effects,
            workflow_id,
            below,
        )

    async def fetch_blobs(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        """Return the stored blobs among ``hashes`` (one thread hop, a few reads per pack)."""
        self._check_open()
        return await self._run("cannot read blobs", self._fetch, list(hashes))

    async def read_blobs_in_thread(self, fn: Callable[[BlobFetch], _T]) -> _T:
        """``fn(fetch)`` in a worker thread whose ``fetch`` reads blobs there (BlobReads)."""
        return await self._run("cannot read blobs", fn, self._fetch_list)

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
        await self._group.drain()

    async def _run(self, what: str, fn: Callable[..., _T], *args: object) -> _T:
        self._check_open()
        try:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args))
        except OSError as exc:
            raise storage_error(f"{what} in {self._base}", exc, exc) from exc

    # --- the worker-thread halves of the public methods -------------------------------

    def _ensure_store(self) -> None:
        layout = self._layout
        if layout.ready:
            return
        layout.create()
        if layout.format >= FORMAT_BLOBS:
            self._blobs.remove_stale_temps()
        layout.ready = True

    def _save_op(self, op: SaveOp) -> None:
        self._ensure_store()
        self._records.save(*op)
        if self._dirs.pruned:
            self._dirs.pruned = False
            self._after_delete()

    def _put(self, split: SplitResult) -> None:
        """Make ``split``'s blobs durable (before the record that references them)."""
        self._ensure_store()
        if self._layout.format < FORMAT_VERSION:
            self._layout.mark(FORMAT_VERSION)
        self._blobs.put(split)

    def _prepare_group(self, ops: list[Op]) -> None:
        """Before a group's records are written (writer thread): the store, fresh blobs."""
        self._ensure_store()
        self._refresh_blobs(ops)

    def _refresh_blobs(self, ops: list[Op]) -> None:
        """Make the blobs of tree saves that waited for their group recent enough again.

        The collector's safety argument (``gc.py``) needs a record to be durable within
        ``grace / 2`` of its blobs' put; a save waiting behind busy groups may not be, so
        its blobs are put again (touching old packs, storing again what a sweep retired)
        once it has waited ``grace / 8``.
        """
        for op in ops:
            tree = self._trees.get(id(op))
            if tree is not None and time.monotonic() - tree[1] > self._blobs.grace / 8:
                self._blobs.put(tree[0])

    def _write_op(self, op: Op) -> None:
        """One write alone (a group of one, or redone after its directory was replaced)."""
        self._refresh_blobs([op])
        if isinstance(op, EffectOp):
            self._ensure_store()
            self._effects.put(op)
        else:
            self._save_op(op)

    def _load_effects(self, workflow_id: str, step: int) -> list[StoredEffect]:
        self._layout.check_marker()
        return self._effects.load(workflow_id, step)

    def _has_effects(self, workflow_id: str) -> bool:
        self._layout.check_marker()
        return self._effects.has_any(workflow_id)

    def _drop_orphan_effects(self, workflow_id: str, below: int) -> int:
        self._layout.check_marker()
        return self._records.drop_orphan_effects(workflow_id, below)

    def _in_doubt_effects(self, workflow_id: str) -> list[StoredEffect]:
        self._layout.check_marker()
        return self._effects.in_doubt_of(workflow_id)

    def _effect_workflows(self) -> list[str]:
        self._layout.check_marker()
        return self._effects.workflows()

    def _effect_steps(self, workflow_id: str) -> list[int]:
        self._layout.check_marker()
        return self._effects.steps(workflow_id)

    def _in_doubt_workflows(self) -> list[str]:
        self._layout.check_marker()
        return self._effects.in_doubt_workflows()

    def _fetch_list(self, hashes: Collection[bytes]) -> dict[bytes, bytes]:
        return self._fetch(list(hashes))

    def _fetch(self, hashes: list[bytes]) -> dict[bytes, bytes]:
        self._layout.check_marker()
        return self._blobs.fetch(hashes)

    def _collect(self, grace: float, wait: bool) -> int | None:
        self._layout.check_marker()
        return self._collector.collect(self._root, grace, wait=wait)

    def _then_gc(self, fn: Callable[..., bool], *args: object) -> bool:
        deleted = fn(*args)
        if deleted:
            self._after_delete()
        return deleted

    def _after_delete(self) -> None:
        """Sweep if records went and no sweep ran for ``gc_interval`` (housekeeping)."""
        if self._gc_interval is None or self._layout.format < FORMAT_BLOBS:
            return
        try:
            last = self._collector.last_collection()
            if last is None or time.time() - last < self._gc_interval:
                return
            self._collect(self._blobs.grace, False)
        except (OSError, CheckpointCorruptedError) as exc:
            logger.warning("garbage collection of blobs failed: %s", exc)

    def _load(self, workflow_id: str, step: int | None) -> StoredCheckpoint | None:
        self._layout.check_marker()
        return self._records.load(workflow_id, step)

    def _scan(
        self,
        workflow_id: str,
        after: int | None,
        before: int | None,
        limit: int | None,
        descending: bool,
    ) -> list[StoredCheckpoint]:
        self._layout.check_marker()
        return self._records.scan(workflow_id, after, before, limit, descending)

    def _exists(self, workflow_id: str, step: int | None) -> bool:
        self._layout.check_marker()
        return self._records.exists(workflow_id, step)

    def _delete_step(self, workflow_id: str, step: int) -> bool:
        self._layout.check_marker()
        return self._records.delete_step(workflow_id, step)

    def _delete_workflow(self, workflow_id: str) -> bool:
        self._layout.check_marker()
        return self._records.delete_workflow(workflow_id)

    def _list_workflows(self) -> list[str]:
        self._layout.check_marker()
        return self._records.list_workflows()

    def _foreign_entries(self) -> list[ForeignEntry]:
        self._layout.check_marker()
        return self._records.foreign_entries()
