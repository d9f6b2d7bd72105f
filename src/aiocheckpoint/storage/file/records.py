"""The file store's records, one save at a time: save, load, scan, exists, delete, list.

Every function runs in a worker thread. A save here is the *single path* (docs/file-storage.md,
"The write path"): temp file written and fsynced, hint raised and fsynced, rename, directory
fsync. Concurrent saves are grouped by :mod:`.groupcommit`, which falls back to this path.
"""

from __future__ import annotations

import os
import time

from ...errors import CheckpointCorruptedError, StorageBackendError
from ..base import StoredCheckpoint
from .dirs import RETRIES, ForeignEntry, Replaced, WorkflowDirs
from .io import (
    FileOps,
    OddEntry,
    discard,
    fsync_path,
    is_missing,
    open_regular,
    read_bounded,
    write_temp,
)
from .names import WORKFLOWS, encode_name, parse_step_name, step_name, temp_name

__all__ = ["RecordFiles"]


class RecordFiles:
    """Reads and single-path writes of the records under ``workflows/``."""

    def __init__(self, dirs: WorkflowDirs, max_bytes: int) -> None:
        self.dirs = dirs
        self.root = dirs.root
        self.max = max_bytes

    @property
    def ops(self) -> FileOps:
        """The OS calls (the directories' :class:`FileOps`, so one seam serves both)."""
        return self.dirs.ops

    def save(self, workflow_id: str, step: int, data: bytes, keep_last: int | None) -> None:
        """Durably store one record (the single path), creating its directory if needed."""
        name = encode_name(workflow_id)
        self.dirs.write_in(
            name, workflow_id, lambda dfd: self.save_in(dfd, name, step, data, keep_last)
        )

    def save_in(self, dfd: int, name: str, step: int, data: bytes, keep_last: int | None) -> bool:
        """Save into the open directory ``dfd``; False if it was replaced (start again)."""
        ino = os.fstat(dfd).st_ino
        self.dirs.sweep_once(dfd, name, ino)
        tmp: str | None = None
        try:
            try:
                tmp = write_temp(self.ops, dfd, data)
            except FileNotFoundError:
                return False  # the directory was deleted after we opened it
            with self.dirs.lock(dfd, name):
                # The hint is raised, durably, before the rename: it may name a step that
                # never arrives (readers then scan), but it is never lower than a step
                # that is on disk, even after a power cut.
                self.dirs.raise_hint(dfd, ino, step, durable=True)
                self.ops.rename(tmp, step_name(step), src_dir_fd=dfd, dst_dir_fd=dfd)
                tmp = None
                if keep_last is not None:
                    self.dirs.prune(dfd, keep_last)
            self.ops.fsync_dir(dfd)
            return True
        except Replaced:
            return False
        finally:
            if tmp is not None:
                discard(tmp, dfd)

    def read_step(self, dfd: int, workflow_id: str, step: int) -> StoredCheckpoint | None:
        """Read one step file of ``dfd`` (bounded by ``max``); None if it does not exist.

        Anything but a regular file of at most ``max`` bytes at the step's path raises
        :class:`CheckpointCorruptedError` naming the step, without being read.
        """
        try:
            fd = open_regular(step_name(step), dfd)
            if fd is None:
                return None
        except OddEntry as exc:
            raise CheckpointCorruptedError(str(exc), workflow_id=workflow_id, step=step) from None
        try:
            return StoredCheckpoint(step, read_bounded(fd, self.max))
        except OddEntry as exc:
            raise CheckpointCorruptedError(str(exc), workflow_id=workflow_id, step=step) from None
        finally:
            os.close(fd)

    def load(self, workflow_id: str, step: int | None) -> StoredCheckpoint | None:
        """One step's record, or the highest (through the hint); None if there is none."""
        name = encode_name(workflow_id)
        for _ in range(RETRIES):
            dfd = self.dirs.open_dir(name)
            if dfd is None:
                return None
            try:
                if step is not None:
                    return self.read_step(dfd, workflow_id, step)
                ino = os.fstat(dfd).st_ino
                hint = self.dirs.read_hint(dfd)
                if self.dirs.trusted(hint, ino):
                    assert hint is not None
                    if hint.step is None:
                        return None
                    found = self.read_step(dfd, workflow_id, hint.step)
                    if found is not None:
                        return found
                # No trustworthy hint, or it names a step whose write never finished.
                with self.dirs.lock(dfd, name):
                    top = self.dirs.rebuild_hint(dfd, ino, best_effort=True)
                    return None if top is None else self.read_step(dfd, workflow_id, top)
            except Replaced:
                continue
            finally:
                os.close(dfd)
        raise StorageBackendError(f"workflow directory {name!r} kept being replaced")

    def scan(
        self,
        workflow_id: str,
        after: int | None,
        before: int | None,
        limit: int | None,
        descending: bool,
    ) -> list[StoredCheckpoint]:
        """Records with ``after < step < before`` in step order, at most ``limit``."""
        dfd = self.dirs.open_dir(encode_name(workflow_id))
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
                record = self.read_step(dfd, workflow_id, s)
                if record is not None:  # None: deleted since the listing
                    out.append(record)
            return out
        finally:
            os.close(dfd)

    def exists(self, workflow_id: str, step: int | None) -> bool:
        """Whether the step (or any step) of the workflow is stored."""
        name = encode_name(workflow_id)
        dfd = self.dirs.open_dir(name)
        if dfd is None:
            return False
        try:
            if step is not None:
                return self.stat_exists(step_name(step), dfd)
            hint = self.dirs.read_hint(dfd)
            if self.dirs.trusted(hint, os.fstat(dfd).st_ino):
                assert hint is not None
                if hint.step is None:
                    return False
                if self.stat_exists(step_name(hint.step), dfd):
                    return True
            return self.dirs.has_steps(dfd)
        finally:
            os.close(dfd)

    def stat_exists(self, entry: str, dfd: int) -> bool:
        """Whether ``entry`` exists in ``dfd``."""
        try:
            os.stat(entry, dir_fd=dfd, follow_symlinks=False)
        except OSError as exc:
            if is_missing(exc):
                return False
            raise
        return True

    def delete_step(self, workflow_id: str, step: int) -> bool:
        """Unlink one step durably (the hint corrected), then its effects; whether it existed."""
        name = encode_name(workflow_id)
        for _ in range(RETRIES):
            dfd = self.dirs.open_dir(name)
            if dfd is None:
                return False
            try:
                ino = os.fstat(dfd).st_ino
                with self.dirs.lock(dfd, name):
                    existed = self._unlink_step(dfd, ino, step)
                    # After the step file, durably: a crash in between leaves the journal of
                    # a step without a checkpoint (as a run killed in it does), never a
                    # checkpoint whose journal is partly gone.
                    self.dirs.drop_effects(dfd, step)  # even when the step has no file
                return existed
            except Replaced:
                continue
            finally:
                os.close(dfd)
        raise StorageBackendError(f"workflow directory {name!r} kept being replaced")

    def _unlink_step(self, dfd: int, ino: int, step: int) -> bool:
        """Unlink a step file durably and correct the hint (under the lock); whether it was."""
        try:
            self.ops.unlink(step_name(step), dir_fd=dfd)
        except OSError as exc:
            if is_missing(exc):
                return False
            raise
        # The unlink must be durable before the hint is lowered: a power cut that undid the
        # unlink would otherwise leave a step above the hint.
        self.ops.fsync_dir(dfd)
        hint = self.dirs.read_hint(dfd)
        above = hint is not None and hint.step is not None and hint.step > step
        if not (self.dirs.trusted(hint, ino) and above):
            self.dirs.rebuild_hint(dfd, ino)
        return True

    def drop_orphan_effects(self, workflow_id: str, below: int) -> int:
        """Unlink the effects of steps below ``below`` that have no step file; how many."""
        name = encode_name(workflow_id)
        for _ in range(RETRIES):
            dfd = self.dirs.open_dir(name)
            if dfd is None:
                return 0
            try:
                with self.dirs.lock(dfd, name):
                    return self.dirs.drop_orphan_effects(dfd, below)
            except Replaced:
                continue
            finally:
                os.close(dfd)
        raise StorageBackendError(f"workflow directory {name!r} kept being replaced")

    def delete_workflow(self, workflow_id: str) -> bool:
        """Rename the workflow's directory away durably, then remove it; whether it had steps."""
        name = encode_name(workflow_id)
        for _ in range(RETRIES):
            dfd = self.dirs.open_dir(name)
            if dfd is None:
                return False
            doomed = os.path.join(self.root, temp_name("del"))
            try:
                with self.dirs.lock(dfd, name):
                    had_steps = self.dirs.has_steps(dfd)
                    # Rename first so that readers never see half a workflow.
                    self.ops.rename(
                        os.path.join(self.root, name), doomed, src_dir_fd=None, dst_dir_fd=None
                    )
            except Replaced:
                continue
            finally:
                os.close(dfd)
            fsync_path(self.ops, self.root)
            self.dirs.remove_tree(doomed)
            return had_steps
        raise StorageBackendError(f"workflow directory {name!r} kept being replaced")

    def list_workflows(self) -> list[str]:
        """Every workflow id with at least one step, sorted (removes leftover temp dirs)."""
        now = time.time()
        ids: list[str] = []
        for name in self._names():
            if name.startswith("."):
                # A renamed-away workflow is garbage at once; a new one may still be in
                # the making unless its creator is gone.
                if name.startswith(".del-") or (
                    name.startswith(".new-") and self.dirs.is_stale(name, now, None)
                ):
                    self.dirs.remove_tree(os.path.join(self.root, name))
                continue
            dfd = self.dirs.open_dir(name)
            if dfd is None:
                continue
            try:
                workflow_id = self.dirs.id_of(name, dfd)
                if workflow_id is not None and self.dirs.has_steps(dfd):
                    ids.append(workflow_id)
            finally:
                os.close(dfd)
        return sorted(ids)

    def foreign_entries(self) -> list[ForeignEntry]:
        """The entries of ``workflows/`` that are no workflow's directory, by name.

        Names starting with ``.`` are the store's temporaries (``encode_name`` escapes a
        leading dot, so no workflow's directory has one): never listed.
        """
        found = []
        for name in sorted(self._names()):
            reason = None if name.startswith(".") else self.dirs.foreign_reason(name)
            if reason is not None:
                found.append(ForeignEntry(f"{WORKFLOWS}/{name}", reason))
        return found

    def _names(self) -> list[str]:
        """The entries of ``workflows/`` (none before the first write)."""
        try:
            return os.listdir(self.root)
        except OSError as exc:
            if is_missing(exc):
                return []
            raise
