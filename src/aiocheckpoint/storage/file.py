"""FileCheckpointStorage: one directory per workflow, one fsynced file per checkpoint.

Layout (docs/file-storage.md describes it in full)::

    base_dir/                         0700
        aiocheckpoint.json            {"format": 1}, written atomically on first write
        workflows/                    0700
            <encoded id>/             0700, see ``encode_name``
                lock                  flock(2) target for read-modify-write sections
                latest                hint: the highest step (44 bytes, see ``Hint``)
                id                    the exact id, only in hash-named directories
                00000000000000000007.ckpt
                .tmp-<ns>-<pid>-<uuid>  a write in progress (ignored by readers)
        blobs/                        reserved for content-addressed blobs (not used yet)

Every public method makes exactly one hop to a worker thread, so a save's write, fsync,
rename and directory fsync run together and a cancelled caller still waits for them: the
record lands whole or not at all.
"""

from __future__ import annotations

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
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

import anyio.to_thread

from .._validation import check_optional_step, check_step, check_workflow_id
from ..errors import (
    CheckpointCorruptedError,
    CheckpointSerializationError,
    InvalidArgumentError,
    StorageBackendError,
    StorageSchemaError,
)
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
    read_boot_id,
    step_name,
    temp_name,
)
from .base import DEFAULT_MAX_RECORD_BYTES, BaseStorage, StoredCheckpoint

__all__ = ["FORMAT_VERSION", "FileCheckpointStorage"]

logger = logging.getLogger("aiocheckpoint")

#: The on-disk format this version writes; stores marked with a higher one are refused.
FORMAT_VERSION: Final = 1
MARKER: Final = "aiocheckpoint.json"
WORKFLOWS: Final = "workflows"
LOCK: Final = "lock"
HINT: Final = "latest"
ID_FILE: Final = "id"

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
_READ_FLAGS: Final = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_NEW_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
_RETRIES: Final = 16
_T = TypeVar("_T")


class _Replaced(Exception):
    """The workflow directory was deleted or replaced under us; start the operation again."""


@functools.lru_cache(maxsize=1)
def _boot_id() -> bytes | None:
    return read_boot_id()


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
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        stale_temp_seconds: float = 3600.0,
    ) -> None:
        if type(max_record_bytes) is not int or max_record_bytes < 1:
            raise InvalidArgumentError(
                f"max_record_bytes must be an int >= 1, got {max_record_bytes!r}"
            )
        if not isinstance(stale_temp_seconds, (int, float)) or stale_temp_seconds <= 0:
            raise InvalidArgumentError(
                f"stale_temp_seconds must be a positive number, got {stale_temp_seconds!r}"
            )
        self._base = os.path.abspath(os.fspath(base_dir))
        self._root = os.path.join(self._base, WORKFLOWS)
        self._max = max_record_bytes
        self._stale = float(stale_temp_seconds)
        self._os = FileOps()
        self._marker_ok = False
        self._store_ready = False
        # (directory name, inode) pairs whose hint this instance has checked by a full scan.
        self._validated: set[tuple[str, int]] = set()
        self._swept: set[tuple[str, int]] = set()

    @property
    def base_dir(self) -> str:
        """The absolute path of the store's directory."""
        return self._base

    @property
    def max_record_bytes(self) -> int:
        """The largest record this store writes or reads."""
        return self._max

    def workflow_dir(self, workflow_id: str) -> str:
        """The directory that holds ``workflow_id``'s files (it may not exist yet)."""
        return os.path.join(self._root, encode_name(check_workflow_id(workflow_id)))

    # --- the protocol -----------------------------------------------------------------

    async def save(
        self, workflow_id: str, step: int, data: bytes, *, keep_last: int | None = None
    ) -> None:
        """Durably store ``data`` as ``step``; then keep only the ``keep_last`` highest steps.

        Cost: one file write + two fsyncs (file, directory); with ``keep_last``, also one
        listing of the workflow's directory and an unlink per pruned step.
        """
        self._check_open()
        check_workflow_id(workflow_id)
        check_step(step)
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise InvalidArgumentError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        if len(data) > self._max:
            raise CheckpointSerializationError(
                "checkpoint",
                f"the encoded record is {len(data)} bytes; this store's max_record_bytes "
                f"is {self._max}",
            )
        await self._run(
            f"cannot save step {step} of workflow {workflow_id!r}",
            self._save,
            workflow_id,
            step,
            bytes(data),
            keep_last,
        )

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
            return await self._run(what, self._delete_workflow, workflow_id)
        return await self._run(what, self._delete_step, workflow_id, step)

    async def list_workflows(self) -> list[str]:
        """Every workflow id with at least one record, sorted.

        Cost: one listing of ``workflows/`` and a short directory read per workflow.
        """
        self._check_open()
        return await self._run("cannot list workflows", self._list_workflows)

    async def _run(self, what: str, fn: Callable[..., _T], *args: object) -> _T:
        self._check_open()
        try:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args))
        except OSError as exc:
            raise StorageBackendError(f"{what} in {self._base}: {exc}") from exc

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
                f"reads format {FORMAT_VERSION} only (upgrade aiocheckpoint)"
            )
        self._marker_ok = True

    def _ensure_store(self) -> None:
        if self._store_ready:
            return
        self._check_marker()
        parent = os.path.dirname(self._base)
        os.makedirs(parent, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            self._os.mkdir(self._base)
        if not self._marker_ok:
            body = json.dumps({"format": FORMAT_VERSION}).encode() + b"\n"
            self._write_atomic(self._base, MARKER, body)
            self._marker_ok = True
        with contextlib.suppress(FileExistsError):
            self._os.mkdir(self._root)
            self._fsync_path(self._base)
        self._store_ready = True

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
                self._write_hint(dfd, None, ino, name)
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
        fd = self._os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dfd)
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
        try:
            fd = os.open(HINT, _READ_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if is_missing(exc):
                return None
            raise
        try:
            return Hint.unpack(os.read(fd, Hint.SIZE + 1))
        finally:
            os.close(fd)

    def _trusted(self, hint: Hint | None, ino: int, name: str) -> bool:
        # A hint is exact for the boot that wrote it: it is updated in the page cache
        # under the lock by every process, but not fsynced, so after a power cut (a new
        # boot id) it may be older than the durable files and must be rebuilt by a scan.
        if hint is None or hint.dir_ino != ino:
            return False
        boot = _boot_id()
        if boot is not None:
            return hint.boot_id == boot
        return (name, ino) in self._validated  # no boot id: trust what we checked ourselves

    def _write_hint(self, dfd: int, step: int | None, ino: int, name: str) -> None:
        boot = _boot_id()
        data = Hint(step, boot or bytes(16), ino).pack()
        fd = self._os.open(
            HINT, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dfd
        )
        try:
            if self._os.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.EIO, "short write to the latest-step hint")
            if os.fstat(fd).st_size != len(data):
                os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
        if boot is None:
            self._validated.add((name, ino))

    def _rebuild_hint(self, dfd: int, ino: int, name: str) -> int | None:
        """Scan the directory (under the lock) and write an exact hint; return the top."""
        top = max(self._steps(dfd), default=None)
        self._write_hint(dfd, top, ino, name)
        self._validated.add((name, ino))
        return top

    def _top_for_write(self, dfd: int, ino: int, name: str) -> int | None:
        """An upper bound of the stored steps (under the lock), or None if there are none."""
        hint = self._read_hint(dfd)
        if hint is not None and self._trusted(hint, ino, name):
            return hint.step
        return self._rebuild_hint(dfd, ino, name)

    # --- the worker-thread halves of the public methods -------------------------------

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
                top = self._top_for_write(dfd, ino, name)
                # The hint is raised before the rename: it may name a step that is not
                # there yet (readers then scan), but never one lower than a visible step.
                if top is None or step > top:
                    self._write_hint(dfd, step, ino, name)
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

    def _write_temp(self, dfd: int, data: bytes) -> str:
        tmp = temp_name()
        fd = self._fsynced_file(dfd, tmp, data)
        try:
            self._close(fd)
        except BaseException:
            self._discard(tmp, dfd)
            raise
        return tmp

    def _fsynced_file(self, dfd: int, name: str, data: bytes) -> int:
        """Create ``name`` (0600, must not exist), write and fsync ``data``; return the fd."""
        fd = self._os.open(name, _NEW_FLAGS, 0o600, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[self._os.write(fd, view) :]
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
        steps = sorted(self._steps(dfd))
        for old in steps[: max(0, len(steps) - keep_last)]:
            with contextlib.suppress(FileNotFoundError):
                self._os.unlink(step_name(old), dir_fd=dfd)

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
                if self._trusted(hint, ino, name):
                    assert hint is not None
                    if hint.step is None:
                        return None
                    found = self._read_step(dfd, workflow_id, hint.step)
                    if found is not None:
                        return found
                # No trustworthy hint, or it names a step whose write never finished.
                with self._lock(dfd, name):
                    top = self._rebuild_hint(dfd, ino, name)
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
            steps = sorted(
                s
                for s in self._steps(dfd)
                if (after is None or s > after) and (before is None or s < before)
            )
            if descending:
                steps.reverse()
            out: list[StoredCheckpoint] = []
            for s in steps:
                if limit is not None and len(out) >= limit:
                    break
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
            if self._trusted(hint, os.fstat(dfd).st_ino, name):
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
                    hint = self._read_hint(dfd)
                    trusted = self._trusted(hint, ino, name)
                    below = hint is not None and hint.step is not None and hint.step > step
                    if not (trusted and below):
                        self._rebuild_hint(dfd, ino, name)
                self._os.fsync_dir(dfd)
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
        try:
            fd = os.open(ID_FILE, _READ_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if is_missing(exc):
                return None
            raise
        try:
            raw = os.read(fd, 1024)
        finally:
            os.close(fd)
        if hashed_name(raw) != name:
            return None  # not ours, or damaged: never guess an id
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
