"""The file store's effect journal: one small file per effect, beside the step files.

A workflow directory's ``effects/`` holds ``<step, 20 digits>-<sha-256 of the key, 32 hex
digits>.fx``; a file is ``b"ACKF"``, the in-doubt flag byte, the key's UTF-8 length (2
bytes), the key, then the record. A put joins the store's group commit (:mod:`.batch`), or
alone takes the single write path of a step file: a temporary file written and fsynced,
renamed under the workflow's lock (so a concurrent ``delete(wf)`` never loses it), the
directory fsynced. Deleting a step (``delete``,
retention) unlinks its effects (:meth:`WorkflowDirs.drop_effects`); deleting the workflow
renames its whole directory away. Every function runs in a worker thread.
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct
from collections.abc import Callable
from typing import Final

from ...errors import CheckpointCorruptedError
from ..base import MAX_EFFECTS_PER_STEP, StoredEffect
from .batch import EffectOp
from .dirs import EFFECTS, Replaced, WorkflowDirs, effect_prefix
from .io import DIR_FLAGS, OddEntry, discard, is_missing, open_regular, read_bounded, write_temp
from .names import encode_name

__all__ = ["EffectFiles"]

_MAGIC: Final = b"ACKF"
_HEAD: Final = struct.Struct(">4sBH")


def _file_name(step: int, key: str) -> str:
    return f"{effect_prefix(step)}{hashlib.sha256(key.encode()).hexdigest()[:32]}.fx"


class EffectFiles:
    """Puts and reads of the effect files under ``workflows/``."""

    def __init__(self, dirs: WorkflowDirs, max_bytes: int) -> None:
        self.dirs = dirs
        self.max = max_bytes

    @staticmethod
    def op(workflow_id: str, step: int, key: str, data: bytes, in_doubt: bool) -> EffectOp:
        """The write of one effect record: its file's name and content."""
        raw = key.encode("utf-8")
        content = _HEAD.pack(_MAGIC, int(in_doubt), len(raw)) + raw + data
        return EffectOp(workflow_id, step, _file_name(step, key), content)

    def put(self, op: EffectOp) -> None:
        """Durably store one effect record alone, creating the directories it needs."""
        name = encode_name(op.workflow_id)
        self.dirs.write_in(name, op.workflow_id, lambda dfd: self._put_in(dfd, name, op))

    def _put_in(self, dfd: int, name: str, op: EffectOp) -> bool:
        """Write into workflow directory ``dfd``; False if it was replaced (start again)."""
        file, content = op.file, op.data
        efd = self.dirs.open_effects_dir(dfd)
        tmp: str | None = None
        try:
            tmp = write_temp(self.dirs.ops, efd, content)
            with self.dirs.lock(dfd, name):
                self.dirs.ops.rename(tmp, file, src_dir_fd=efd, dst_dir_fd=efd)
                tmp = None
            self.dirs.ops.fsync_dir(efd)
            return True
        except (Replaced, FileNotFoundError):
            return False
        finally:
            if tmp is not None:
                discard(tmp, efd)
            os.close(efd)

    def load(self, workflow_id: str, step: int) -> list[StoredEffect]:
        """One step's records, ordered by key; at most MAX_EFFECTS_PER_STEP."""
        efd = self._open_effects(encode_name(workflow_id))
        if efd is None:
            return []
        try:
            prefix = effect_prefix(step)
            names = sorted(n for n in os.listdir(efd) if n.startswith(prefix) and n.endswith(".fx"))
            found = [self._read(efd, n, workflow_id, step) for n in names]
        finally:
            os.close(efd)
        effects = sorted((e for e in found if e is not None), key=lambda e: e.key)
        return effects[:MAX_EFFECTS_PER_STEP]

    def in_doubt_of(self, workflow_id: str) -> list[StoredEffect]:
        """One workflow's records in doubt, ordered by step then key (at most the bound)."""
        efd = self._open_effects(encode_name(workflow_id))
        if efd is None:
            return []
        found: list[StoredEffect] = []
        try:
            for step, names in _by_step(os.listdir(efd)):
                if len(found) >= MAX_EFFECTS_PER_STEP:
                    break
                doubtful = [n for n in names if self._flag(efd, n)]
                read = [self._read(efd, n, workflow_id, step) for n in doubtful]
                found += sorted((e for e in read if e is not None and e.in_doubt), key=_key)
        finally:
            os.close(efd)
        return found[:MAX_EFFECTS_PER_STEP]

    def has_any(self, workflow_id: str) -> bool:
        """Whether the workflow has any effect file (stops at the first)."""
        efd = self._open_effects(encode_name(workflow_id))
        if efd is None:
            return False
        try:
            with os.scandir(efd) as entries:
                return any(e.name.endswith(".fx") for e in entries)
        finally:
            os.close(efd)

    def in_doubt_workflows(self) -> list[str]:
        """Every workflow with an effect in doubt, sorted (reads each effect's flag byte)."""
        return self._workflows_where(self._has_doubt)

    def workflows(self) -> list[str]:
        """Every workflow with at least one effect file, sorted (a listing per workflow)."""
        return self._workflows_where(lambda name: bool(self._steps_of(name)))

    def _workflows_where(self, keep: Callable[[str], bool]) -> list[str]:
        """The ids of the workflow directories ``keep`` accepts, sorted."""
        try:
            names = os.listdir(self.dirs.root)
        except OSError as exc:
            if is_missing(exc):
                return []
            raise
        ids = []
        for name in names:
            if not name.startswith(".") and keep(name):
                workflow_id = self._id_of(name)
                if workflow_id is not None:
                    ids.append(workflow_id)
        return sorted(ids)

    def steps(self, workflow_id: str) -> list[int]:
        """The steps of ``workflow_id`` with at least one effect file, ascending."""
        return self._steps_of(encode_name(workflow_id))

    def _steps_of(self, name: str) -> list[int]:
        efd = self._open_effects(name)
        if efd is None:
            return []
        try:
            entries = os.listdir(efd)
        finally:
            os.close(efd)
        return sorted({step for e in entries if (step := _step_of(e)) is not None})

    def _id_of(self, name: str) -> str | None:
        dfd = self.dirs.open_dir(name)
        if dfd is None:
            return None
        try:
            return self.dirs.id_of(name, dfd)
        finally:
            os.close(dfd)

    def _has_doubt(self, name: str) -> bool:
        efd = self._open_effects(name)
        if efd is None:
            return False
        try:
            for entry in os.listdir(efd):
                if entry.endswith(".fx") and self._flag(efd, entry):
                    return True
            return False
        finally:
            os.close(efd)

    def _flag(self, efd: int, entry: str) -> bool:
        try:
            fd = open_regular(entry, efd)
        except OddEntry:
            return False
        if fd is None:
            return False
        try:
            head = os.read(fd, _HEAD.size)
        finally:
            os.close(fd)
        return len(head) == _HEAD.size and head[:4] == _MAGIC and head[4] == 1

    def _open_effects(self, name: str) -> int | None:
        try:
            return os.open(os.path.join(self.dirs.root, name, EFFECTS), DIR_FLAGS)
        except OSError as exc:
            if is_missing(exc) or exc.errno == errno.ELOOP:
                return None
            raise

    def _read(self, efd: int, entry: str, workflow_id: str, step: int) -> StoredEffect | None:
        try:
            fd = open_regular(entry, efd)
            if fd is None:
                return None  # deleted since the listing
            try:
                content = read_bounded(fd, self.max + _HEAD.size + 1024)
            finally:
                os.close(fd)
        except OddEntry as exc:
            raise CheckpointCorruptedError(str(exc), workflow_id=workflow_id, step=step) from None
        return _parse(content, workflow_id, step)


def _key(effect: StoredEffect) -> str:
    return effect.key


def _by_step(names: list[str]) -> list[tuple[int, list[str]]]:
    """The effect files among ``names``, grouped by their step, in step order."""
    steps: dict[int, list[str]] = {}
    for name in names:
        head = name[: len(effect_prefix(0))]
        if name.endswith(".fx") and head[:-1].isdigit() and head.endswith("-"):
            steps.setdefault(int(head[:-1]), []).append(name)
    return sorted(steps.items())


def _step_of(entry: str) -> int | None:
    """The step an effect file's name holds (None for any other name)."""
    digits, dash, _rest = entry.partition("-")
    if dash and entry.endswith(".fx") and len(digits) == 20 and digits.isascii():
        return int(digits) if digits.isdigit() else None
    return None


def _parse(content: bytes, workflow_id: str, step: int) -> StoredEffect:
    try:
        magic, flag, size = _HEAD.unpack_from(content)
        key = content[_HEAD.size : _HEAD.size + size].decode("utf-8")
    except (struct.error, UnicodeDecodeError):
        magic = b""
    if magic != _MAGIC or flag not in (0, 1):
        raise CheckpointCorruptedError(
            "an effect file is not an effect record", workflow_id=workflow_id, step=step
        )
    return StoredEffect(step, key, bool(flag), content[_HEAD.size + size :])
