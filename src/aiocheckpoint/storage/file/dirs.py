"""The workflow directories of the file store: creation, the lock, the latest-step hint.

One directory per workflow under ``base_dir/workflows/`` (its name: ``format.encode_name``)
holds the step files, an empty ``lock`` (the ``flock(2)`` target of read-modify-write
sections), the ``latest`` hint and, in hash-named directories, the ``id`` file. Everything
here runs in a worker thread, on directory file descriptors, so that a directory renamed
away (``delete(wf)``) is noticed rather than written into.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from ..._validation import check_workflow_id
from ...errors import InvalidWorkflowIdError, StorageBackendError
from .io import (
    DIR_FLAGS,
    NEW_FLAGS,
    OPEN_FLAGS,
    READ_FLAGS,
    FileOps,
    discard,
    fsync_path,
    fsynced_file,
    is_missing,
    read_small,
    write_temp,
)
from .names import (
    HASHED_PREFIX,
    HINT,
    ID_FILE,
    LOCK,
    Hint,
    decode_name,
    encode_name,
    parse_step_name,
    pid_is_dead,
    step_name,
    temp_name,
)

__all__ = ["EFFECTS", "RETRIES", "ForeignEntry", "Replaced", "WorkflowDirs", "effect_prefix"]

logger = logging.getLogger(__name__)

#: How often an operation starts again when its directory is replaced under it.
RETRIES: Final = 16
#: The subdirectory of a workflow's directory that holds its effect journal.
EFFECTS: Final = "effects"


def effect_prefix(step: int) -> str:
    """The start of the names of ``step``'s effect files (fixed width: they sort by step)."""
    return f"{step:020d}-"


@dataclass(frozen=True, slots=True)
class ForeignEntry:
    """An entry of ``workflows/`` that is no workflow's directory (planted, copied, damaged).

    ``path`` is where it is under ``base_dir`` (``workflows/NAME``), ``reason`` what is
    wrong with it.
    """

    path: str
    reason: str


class Replaced(Exception):
    """The workflow directory was deleted or replaced under us; start the operation again."""


class WorkflowDirs:
    """The ``workflows/`` directory of one store (one object per storage instance)."""

    def __init__(self, root: str, ops: FileOps, stale: float) -> None:
        self.root = root
        self.ops = ops
        self.stale = stale
        self.swept: set[tuple[str, int]] = set()
        #: Set when retention deleted a step: the store then considers a blob collection.
        self.pruned = False

    # --- opening, creating, locking ---------------------------------------------------

    def open_dir(self, name: str) -> int | None:
        """A descriptor of workflow directory ``name``, or None if there is none."""
        try:
            return os.open(os.path.join(self.root, name), DIR_FLAGS)
        except OSError as exc:
            if is_missing(exc):
                return None
            raise

    def create_dir(self, name: str, workflow_id: str) -> None:
        """Build the directory under a temporary name, then rename it into place.

        Readers therefore never see a workflow directory without its lock, hint and id.
        """
        tmp = temp_name("new")
        path = os.path.join(self.root, tmp)
        self.ops.mkdir(path)
        try:
            dfd = os.open(path, DIR_FLAGS)
            try:
                ino = os.fstat(dfd).st_ino
                self.ops.close(self.ops.open(LOCK, NEW_FLAGS, 0o600, dir_fd=dfd))
                self.write_hint(dfd, None, ino, durable=True)
                if name.startswith(HASHED_PREFIX):
                    data = workflow_id.encode("utf-8")
                    self.ops.close(fsynced_file(self.ops, dfd, ID_FILE, data))
                self.ops.fsync_dir(dfd)
            finally:
                os.close(dfd)
            try:
                self.ops.rename(
                    path, os.path.join(self.root, name), src_dir_fd=None, dst_dir_fd=None
                )
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                return  # another writer created it first; use theirs
            fsync_path(self.ops, self.root)
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def write_in(self, name: str, workflow_id: str, write: Callable[[int], bool]) -> None:
        """Run ``write(dfd)`` on the workflow's directory (made if missing) until it is True.

        ``write`` returns False when the directory was replaced under it: it starts again.
        """
        for _ in range(RETRIES):
            dfd = self.open_dir(name)
            if dfd is None:
                self.create_dir(name, workflow_id)
                continue
            try:
                if write(dfd):
                    return
            finally:
                os.close(dfd)
        raise StorageBackendError(f"workflow directory {name!r} kept being replaced")

    @contextlib.contextmanager
    def lock(self, dfd: int, name: str) -> Iterator[None]:
        """Hold the workflow's flock; raise :class:`Replaced` if the directory moved."""
        try:
            fd = self.ops.open(
                LOCK, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | OPEN_FLAGS, dir_fd=dfd
            )
        except OSError as exc:
            if is_missing(exc):
                # delete(workflow) removed the directory while we held its fd: start over.
                raise Replaced from exc
            if exc.errno not in (errno.EROFS, errno.EACCES):
                raise
            fd = os.open(LOCK, READ_FLAGS, dir_fd=dfd)  # flock needs no write
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # delete(workflow) renames the directory away under this lock; a waiter that
            # then gets the lock must not write into the doomed directory.
            try:
                current = os.stat(os.path.join(self.root, name), follow_symlinks=False)
            except OSError as exc:
                if is_missing(exc):
                    raise Replaced from exc
                raise
            mine = os.fstat(dfd)
            if (current.st_ino, current.st_dev) != (mine.st_ino, mine.st_dev):
                raise Replaced
            yield
        finally:
            os.close(fd)

    # --- what a directory holds -------------------------------------------------------

    def steps(self, dfd: int) -> list[int]:
        """Every step stored in the directory (unsorted)."""
        return [s for n in os.listdir(dfd) if (s := parse_step_name(n)) is not None]

    def has_steps(self, dfd: int) -> bool:
        """Whether the directory holds at least one step file."""
        with os.scandir(dfd) as entries:
            return any(parse_step_name(e.name) is not None for e in entries)

    def id_of(self, name: str, dfd: int) -> str | None:
        """The workflow id directory ``name`` stands for, or None if it is not a workflow's."""
        if not name.startswith(HASHED_PREFIX):
            return decode_name(name)
        raw = read_small(ID_FILE, dfd, 1024)
        if raw is None:
            return None
        try:
            workflow_id = check_workflow_id(raw.decode("utf-8"))
        except (UnicodeDecodeError, InvalidWorkflowIdError):
            return None  # not ours, or damaged: never guess an id
        # Only the canonical spelling counts: the hash of a short id is not where it lives.
        return workflow_id if encode_name(workflow_id) == name else None

    def foreign_reason(self, name: str) -> str | None:
        """Why entry ``name`` of ``workflows/`` is no workflow's directory; None if it is one.

        Listings skip such an entry (:meth:`id_of`); a name gone meanwhile is None too.
        """
        try:
            info = os.lstat(os.path.join(self.root, name))
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(info.st_mode):
            return "not a directory"
        dfd = self.open_dir(name)
        if dfd is None:
            return None
        try:
            if self.id_of(name, dfd) is not None:
                return None
        finally:
            os.close(dfd)
        if name.startswith(HASHED_PREFIX):
            return "a hashed directory whose id file is missing or names no workflow stored here"
        return "not the directory name of any workflow id"

    # --- temporary files and removal --------------------------------------------------

    def sweep_once(self, dfd: int, name: str, ino: int) -> None:
        """Remove temporary files left by crashed writers (first write per directory)."""
        if (name, ino) in self.swept:
            return
        now = time.time()
        for entry in os.listdir(dfd):
            if entry.startswith(".tmp-") and self.is_stale(entry, now, dfd):
                with contextlib.suppress(FileNotFoundError):
                    self.ops.unlink(entry, dir_fd=dfd)
        self.swept.add((name, ino))

    def is_stale(self, entry: str, now: float, dfd: int | None) -> bool:
        """Whether temporary ``entry`` (in ``dfd``, or in ``workflows/``) is abandoned."""
        if pid_is_dead(entry):
            return True
        path = entry if dfd is not None else os.path.join(self.root, entry)
        try:
            mtime = os.stat(path, dir_fd=dfd, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            return False
        return now - mtime > self.stale

    def remove_tree(self, path: str) -> None:
        """Remove a renamed-away workflow directory."""
        # A writer that opened the directory before it was renamed away may still drop a
        # temporary file into it (it then notices and retries elsewhere), so try again.
        for _ in range(3):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                return

    def prune(self, dfd: int, keep_last: int) -> None:
        """Unlink the lowest steps beyond the ``keep_last`` highest (under the lock)."""
        # Retention is housekeeping: the new record is already in place, and the next save
        # prunes again, so a failure here is logged rather than failing the save.
        try:
            steps = sorted(self.steps(dfd))
            for old in steps[: max(0, len(steps) - keep_last)]:
                with contextlib.suppress(FileNotFoundError):
                    self.ops.unlink(step_name(old), dir_fd=dfd)
                    self.pruned = True
                self.drop_effects(dfd, old)
        except OSError as exc:
            logger.warning("retention could not delete old checkpoints: %s", exc)

    def open_effects_dir(self, dfd: int) -> int:
        """A descriptor of ``effects/`` in ``dfd``, made (durably) if it is missing."""
        try:
            self.ops.mkdir(EFFECTS, dir_fd=dfd)
        except FileExistsError:
            pass
        else:
            self.ops.fsync_dir(dfd)
        return os.open(EFFECTS, DIR_FLAGS, dir_fd=dfd)

    def drop_effects(self, dfd: int, step: int) -> None:
        """Unlink the effect files of ``step`` (under the lock), then fsync their directory."""
        efd = self._effects_dir(dfd)
        if efd is None:
            return
        try:
            prefix = effect_prefix(step)
            doomed = [n for n in os.listdir(efd) if n.startswith(prefix)]
            for entry in doomed:
                with contextlib.suppress(FileNotFoundError):
                    self.ops.unlink(entry, dir_fd=efd)
            if doomed:
                self.ops.fsync_dir(efd)
        finally:
            os.close(efd)

    def drop_orphan_effects(self, dfd: int, below: int) -> int:
        """Unlink (under the lock) the effect files of steps below ``below`` with no step file."""
        efd = self._effects_dir(dfd)
        if efd is None:
            return 0
        try:
            doomed = [n for n in os.listdir(efd) if self._orphan(dfd, n, below)]
            for entry in doomed:
                with contextlib.suppress(FileNotFoundError):
                    self.ops.unlink(entry, dir_fd=efd)
            if doomed:
                self.ops.fsync_dir(efd)
            return len(doomed)
        finally:
            os.close(efd)

    @staticmethod
    def _orphan(dfd: int, entry: str, below: int) -> bool:
        digits = entry[:20]
        if not (digits.isdigit() and entry[20:21] == "-" and int(digits) < below):
            return False
        try:
            os.stat(step_name(int(digits)), dir_fd=dfd)
        except FileNotFoundError:
            return True
        return False

    def _effects_dir(self, dfd: int) -> int | None:
        try:
            return os.open(EFFECTS, DIR_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if is_missing(exc):
                return None
            raise

    # --- the latest-step hint ---------------------------------------------------------

    def read_hint(self, dfd: int) -> Hint | None:
        """The directory's hint, or None when it is missing or unreadable."""
        raw = read_small(HINT, dfd, Hint.SIZE + 1)
        return None if raw is None else Hint.unpack(raw)

    def trusted(self, hint: Hint | None, ino: int) -> bool:
        """Whether ``hint`` was written for this directory (inode ``ino``), not a copy."""
        return hint is not None and hint.dir_ino == ino

    def write_hint(self, dfd: int, step: int | None, ino: int, *, durable: bool) -> None:
        """Overwrite the hint in place with ``step`` (fsynced if ``durable``)."""
        data = Hint(step, ino).pack()
        fd = self._open_hint(dfd, os.O_WRONLY)
        if fd is None:
            self._replace_hint(dfd, data, durable=durable)
            return
        try:
            if self.ops.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.EIO, "short write to the latest-step hint")
            if os.fstat(fd).st_size != len(data):
                os.ftruncate(fd, len(data))
            if durable:
                self.ops.fsync(fd)
        finally:
            os.close(fd)

    def rebuild_hint(self, dfd: int, ino: int, *, best_effort: bool = False) -> int | None:
        """Scan the directory (under the lock) and write an exact hint; return the top.

        The rebuilt hint is not fsynced: if it is lost, the one it replaced, which was
        durable and no lower, comes back. Readers pass ``best_effort``: on a read-only
        store the old hint simply stays.
        """
        top = max(self.steps(dfd), default=None)
        try:
            self.write_hint(dfd, top, ino, durable=False)
        except OSError as exc:
            if not best_effort:
                raise
            logger.debug("could not rewrite the latest-step hint: %s", exc)
        return top

    def raise_hint(self, dfd: int, ino: int, step: int, *, durable: bool) -> bool:
        """Make the hint at least ``step`` (under the lock), with one open of the file.

        An untrusted hint is replaced by the exact top (a scan) or ``step`` if higher.
        Returns whether it now names ``step`` as newly written: then it must be durable
        before ``step``'s rename, and ``durable`` fsyncs it here.
        """
        fd = self._open_hint(dfd, os.O_RDWR)
        if fd is None:
            target = _at_least(step, max(self.steps(dfd), default=None))
            self._replace_hint(dfd, Hint(target, ino).pack(), durable=durable and target == step)
            return target == step
        try:
            raw = os.pread(fd, Hint.SIZE + 1, 0)
            hint = Hint.unpack(raw)
            if hint is not None and self.trusted(hint, ino):
                top = hint.step
                if top is not None and step <= top:
                    return False
            else:
                top = max(self.steps(dfd), default=None)
            target = _at_least(step, top)
            data = Hint(target, ino).pack()
            if self.ops.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.EIO, "short write to the latest-step hint")
            if len(raw) != len(data):
                os.ftruncate(fd, len(data))
            if durable and target == step:
                self.ops.fsync(fd)
            return target == step
        finally:
            os.close(fd)

    def _open_hint(self, dfd: int, access: int) -> int | None:
        """Open ``latest`` to write it (creating it); None if it is not a regular file.

        Non-blocking, so a FIFO planted there cannot hang the writer.
        """
        flags = access | os.O_CREAT | os.O_NONBLOCK | OPEN_FLAGS
        try:
            fd = self.ops.open(HINT, flags, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symlink, a FIFO, a socket
                return None
            raise
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except BaseException:
            os.close(fd)
            raise
        if not regular:
            os.close(fd)
            return None
        return fd

    def _replace_hint(self, dfd: int, data: bytes, *, durable: bool) -> None:
        """Put a new hint file in place of a ``latest`` that is not a regular file."""
        logger.warning("replacing %r in %s: it is not a regular file", HINT, self.root)
        tmp = write_temp(self.ops, dfd, data, durable=durable)
        try:
            self.ops.rename(tmp, HINT, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            discard(tmp, dfd)
            raise


def _at_least(step: int, top: int | None) -> int:
    """What a hint raised to ``step`` names when the highest step on disk is ``top``."""
    return step if top is None or step > top else top
