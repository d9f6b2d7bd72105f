"""Writing one group commit of the file store, in its worker thread.

Order (docs/file-storage.md, "The group commit"): every save's temp file, written at once
on several threads; every workflow's lock, in name order, and its hint raised; **barrier
1** (the temp files' data and the raised hints durable); the renames, in submission order,
with retention; the locks released; **barrier 2** (the renames and unlinks durable). A
barrier is one ``syncfs(2)`` where that is known to be durable (:mod:`.durability`); else
each temp file is fsynced as it is written, barrier 1 fsyncs the raised hints and barrier 2
every directory, issued together.

A group also carries effect records (:class:`EffectOp`, docs/effects.md): each is a temp
file in its workflow's ``effects/`` directory, renamed under the same lock and made durable
by the same barriers (its directory is among those barrier 2 fsyncs); it raises no hint and
prunes nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterable
from typing import NamedTuple

from .dirs import Replaced, WorkflowDirs
from .durability import fsync_in, run_all, syncfs_is_durable
from .io import DIR_FLAGS, discard, write_temp
from .names import HINT, encode_name, step_name

__all__ = ["Batch", "EffectOp", "Op", "SaveOp"]


class SaveOp(NamedTuple):
    """One save: what :meth:`~aiocheckpoint.storage.file.FileCheckpointStorage.save` was given."""

    workflow_id: str
    step: int
    data: bytes
    keep_last: int | None


class EffectOp(NamedTuple):
    """One effect record: its file's name in ``effects/`` and its content (``.effects``)."""

    workflow_id: str
    step: int
    file: str
    data: bytes


#: What a group commit writes.
Op = SaveOp | EffectOp


class _Abandon(Exception):
    """The group's first syncfs failed: nothing is renamed, every temp file is removed."""


class _Dir(NamedTuple):
    fd: int
    ino: int
    dev: int


class Batch:
    """One group's writes and outcomes, from its temp files to its barriers.

    ``syncfs`` says whether the store allows ``syncfs`` barriers (``use_syncfs`` and a
    kernel whose ``syncfs`` reports errors). The group uses them only if ``workflows/`` is
    on a filesystem where ``syncfs`` is known to be durable and every workflow directory
    of the group is on that same filesystem (no mount point inside the store); else it
    fsyncs file by file.
    """

    def __init__(self, dirs: WorkflowDirs, saves: list[Op], *, syncfs: bool) -> None:
        self.dirs = dirs
        self.saves = saves
        self.names = [encode_name(s.workflow_id) for s in saves]
        self.outcomes: list[BaseException | None] = [None] * len(saves)
        self.retry: list[int] = []
        self._syncfs = syncfs
        self._opened: dict[str, _Dir] = {}
        self._effect_dirs: dict[str, int] = {}  # workflow directory -> its effects/
        self._temps: dict[int, str] = {}  # save index -> its temp file, until renamed
        self._hinted: list[str] = []  # directories whose hint now names a step of the group
        self._renamed: list[int] = []

    def run(self) -> tuple[list[BaseException | None], list[int]]:
        """Write the group; each save's error (or None), and the saves to redo one by one.

        A save is redone alone when its directory was replaced under the group.
        """
        # Opened before any write: syncfs reports write-back errors since this open.
        sync_fd = os.open(self.dirs.root, DIR_FLAGS & ~os.O_NOFOLLOW)
        try:
            ready = self._open_dirs()
            self._syncfs = self._syncfs and self._syncfs_durable(sync_fd)
            self._write_temps(ready)
            with contextlib.ExitStack() as locks:
                self._raise_hints(locks)
                self._data_barrier(sync_fd)
                self._rename_all()
            self._entries_barrier(sync_fd)
        except _Abandon:
            pass
        finally:
            for i, tmp in self._temps.items():
                discard(tmp, self._dfd(i))
            for efd in self._effect_dirs.values():
                os.close(efd)
            for entry in self._opened.values():
                os.close(entry.fd)
            os.close(sync_fd)
        return self.outcomes, self.retry

    # --- the steps --------------------------------------------------------------------

    def _syncfs_durable(self, sync_fd: int) -> bool:
        if not syncfs_is_durable(sync_fd):
            return False
        root_dev = os.fstat(sync_fd).st_dev
        return all(d.dev == root_dev for d in self._opened.values())

    def _open_dirs(self) -> list[int]:
        """Open (or create) every save's workflow directory; the saves ready to be written."""
        ready = []
        for i in range(len(self.saves)):
            try:
                entry = self._opened.get(self.names[i]) or self._open(i)
                if entry is None:
                    self.retry.append(i)
                    continue
                self.dirs.sweep_once(entry.fd, self.names[i], entry.ino)
            except FileNotFoundError:
                self.retry.append(i)  # the directory was deleted after we opened it
                continue
            except OSError as exc:
                self.outcomes[i] = exc
                continue
            ready.append(i)
        return ready

    def _write_temps(self, ready: list[int]) -> None:
        """Write the temp files of ``ready`` saves, all at once; fsynced unless by ``syncfs``."""
        durable = not self._syncfs

        def write(i: int) -> None:
            data = self.saves[i].data
            self._temps[i] = write_temp(self.dirs.ops, self._dfd(i), data, durable=durable)

        ready = self._open_effect_dirs(ready)
        results = run_all([functools.partial(write, i) for i in ready])
        for i, error in zip(ready, results, strict=True):
            if isinstance(error, FileNotFoundError):
                self.retry.append(i)  # the directory was deleted after we opened it
            elif error is not None:
                self.outcomes[i] = error

    def _open(self, i: int) -> _Dir | None:
        """Open (creating it if needed) save ``i``'s workflow directory; None: retry."""
        name = self.names[i]
        for _ in range(2):
            dfd = self.dirs.open_dir(name)
            if dfd is None:
                self.dirs.create_dir(name, self.saves[i].workflow_id)
                continue
            try:
                info = os.fstat(dfd)
            except BaseException:
                os.close(dfd)
                raise
            self._opened[name] = _Dir(dfd, info.st_ino, info.st_dev)
            return self._opened[name]
        return None

    def _by_dir(self, indexes: Iterable[int]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for i in indexes:
            out.setdefault(self.names[i], []).append(i)
        return out

    def _raise_hints(self, locks: contextlib.ExitStack) -> None:
        # Sorted, so that two processes' groups never wait for each other's locks.
        for name, members in sorted(self._by_dir(self._temps).items()):
            entry = self._opened[name]
            steps = [self.saves[i].step for i in members if isinstance(self.saves[i], SaveOp)]
            try:
                locks.enter_context(self.dirs.lock(entry.fd, name))
                # Raised before the renames and made durable by the first barrier, as in
                # the single path: never lower than a step on disk.
                if steps and self.dirs.raise_hint(entry.fd, entry.ino, max(steps), durable=False):
                    self._hinted.append(name)
            except (Replaced, OSError) as exc:
                for i in members:
                    discard(self._temps.pop(i), self._dfd(i))
                    if isinstance(exc, OSError):
                        self.outcomes[i] = exc
                    else:
                        self.retry.append(i)

    def _rename_all(self) -> None:
        dirs = self.dirs
        for i in sorted(self._temps):
            dfd, op = self._dfd(i), self.saves[i]
            final = op.file if isinstance(op, EffectOp) else step_name(op.step)
            try:
                dirs.ops.rename(self._temps[i], final, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as exc:
                self.outcomes[i] = exc
                continue
            del self._temps[i]
            self._renamed.append(i)
            if isinstance(op, SaveOp) and op.keep_last is not None:
                dirs.prune(dfd, op.keep_last)

    # --- the barriers -----------------------------------------------------------------

    def _data_barrier(self, sync_fd: int) -> None:
        """Make the temp files' data and the raised hints durable; failures fail saves."""
        if not self._temps:
            return
        if self._syncfs:
            try:
                self.dirs.ops.syncfs(sync_fd)
            except OSError as exc:
                for i in self._temps:
                    self.outcomes[i] = exc
                raise _Abandon from exc
            return
        # The temp files were fsynced as they were written: the raised hints remain.
        fsync = self.dirs.ops.fsync
        hints = [self._opened[name].fd for name in self._hinted]
        results = run_all([functools.partial(fsync_in, fsync, dfd, HINT) for dfd in hints])
        by_dir = self._by_dir(self._temps)
        for name, error in zip(self._hinted, results, strict=True):
            for i in by_dir.get(name, ()) if error is not None else ():
                self.outcomes[i] = error  # the hint may not be durable: nor is any of its saves
                discard(self._temps.pop(i), self._dfd(i))

    def _entries_barrier(self, sync_fd: int) -> None:
        """Make the renames (and retention's unlinks) durable; failures fail their saves."""
        if not self._renamed:
            return
        if self._syncfs:
            try:
                self.dirs.ops.syncfs(sync_fd)
            except OSError as exc:
                for i in self._renamed:
                    self.outcomes[i] = exc
            return
        by_fd: dict[int, list[int]] = {}
        for i in self._renamed:
            by_fd.setdefault(self._dfd(i), []).append(i)
        fsync_dir = self.dirs.ops.fsync_dir
        results = run_all([functools.partial(fsync_dir, fd) for fd in by_fd])
        for members, error in zip(by_fd.values(), results, strict=True):
            for i in members if error is not None else ():
                self.outcomes[i] = error

    def _dfd(self, i: int) -> int:
        """The directory op ``i``'s files go in: its workflow's, or that one's ``effects/``."""
        if isinstance(self.saves[i], EffectOp):
            return self._effect_dirs[self.names[i]]
        return self._opened[self.names[i]].fd

    def _open_effect_dirs(self, ready: list[int]) -> list[int]:
        """Open (making it if needed) ``effects/`` where ``ready`` effects go; still ready."""
        failed: dict[str, OSError | None] = {}
        for name in sorted({self.names[i] for i in ready if isinstance(self.saves[i], EffectOp)}):
            try:
                self._effect_dirs[name] = self.dirs.open_effects_dir(self._opened[name].fd)
            except FileNotFoundError:
                failed[name] = None  # the workflow directory was deleted: redone alone
            except OSError as exc:
                failed[name] = exc
        still = []
        for i in ready:
            if isinstance(self.saves[i], EffectOp) and self.names[i] in failed:
                error = failed[self.names[i]]
                if error is None:
                    self.retry.append(i)
                else:
                    self.outcomes[i] = error
            else:
                still.append(i)
        return still
