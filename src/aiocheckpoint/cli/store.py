"""Opening stores for the command line and reading their raw records page by page."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final, TypeAlias

from .._validation import check_workflow_id
from ..codec import Keyring, encode_checkpoint, sealed_key_id
from ..errors import (
    CheckpointCorruptedError,
    EncryptionError,
    InvalidArgumentError,
    UnknownKeyError,
)
from ..format.sealed import is_sealed_tree_record
from ..manager import CheckpointManager
from ..models import Checkpoint
from ..storage.base import CheckpointStorage, StoredCheckpoint
from ..urls import open_storage
from .keys import KEYS_VARIABLE
from .redact import redact

#: Why an encrypted incremental record is not exported or copied as it is.
_SEALED_TREE: Final = (
    "an encrypted incremental record: `aiocheckpoint rekey` makes it a whole encrypted "
    "record (export --plaintext writes it decrypted)"
)

__all__ = [
    "EXIT_NOT_FOUND",
    "EXIT_PIPE",
    "EXIT_PROBLEMS",
    "EXIT_STORE",
    "EXIT_UNREADABLE",
    "EXIT_USAGE",
    "PAGE",
    "CommandError",
    "Foreign",
    "Locked",
    "Record",
    "Unreadable",
    "decode",
    "foreign_json",
    "iter_records",
    "location",
    "locked",
    "open_store",
    "problem",
    "read_page",
    "workflow_ids",
]

#: Exit statuses (docs/cli.md lists them).
EXIT_PROBLEMS: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_FOUND: Final = 3
EXIT_STORE: Final = 4
#: Records that may be sound but that the keys given cannot read (nothing corrupted).
EXIT_UNREADABLE: Final = 5
#: stdout was closed before the output was written (``| head``): what a shell reports for a
#: tool stopped by SIGPIPE (128 + 13).
EXIT_PIPE: Final = 141

#: Records read per storage call when paging through a history.
PAGE: Final = 100


class CommandError(Exception):
    """A failure to report as one line on stderr, with the exit status to end with."""

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Unreadable:
    """A record the storage refused to hand over (for example one over its size limit)."""

    step: int
    reason: str


class Locked(str):
    """Why a record cannot be read with the keys given, its bytes perhaps sound.

    Not corruption (which a plain ``str`` reason reports): sealed under a key id the keys
    lack (``unreadable: key k2 not in the keyring``), or encrypted and no keys given.
    """


def locked(exc: EncryptionError, data: bytes, *, effect: bool = False) -> Locked:
    """What to print for a record ``data`` that ``exc`` says this process cannot read."""
    if isinstance(exc, UnknownKeyError):
        return Locked(f"unreadable: key {_shown(exc.key_id)} not in the keyring")
    # The command's keys are a Keyring, which needs cryptography: no keys were given.
    key_id = sealed_key_id(data, effect=effect)
    under = "" if key_id is None else f" under key {_shown(key_id)}"
    return Locked(f"unreadable: encrypted{under}: pass --keys FILE (or {KEYS_VARIABLE}) to read it")


def problem(reason: str) -> str:
    """The status printed for a record that does not read: ``unreadable`` or ``corrupted``."""
    return "unreadable" if isinstance(reason, Locked) else "corrupted"


def _shown(key_id: str) -> str:
    """A key id as read from a record (not yet authenticated): escaped unless printable."""
    return key_id if key_id.isprintable() and " " not in key_id else repr(key_id)


#: What paging yields: a stored record, or the step of one that cannot be read.
Record: TypeAlias = "StoredCheckpoint | Unreadable"


@dataclass(frozen=True)
class Foreign:
    """A workflow id a store lists that no workflow can have: a damaged or foreign row."""

    #: repr() of the id the store listed, cut to a readable length; or where the store
    #: found it (``checkpoints rowid 7`` in a SQLite store, ``workflows/NAME`` in a file store)
    shown: str
    reason: str

    def to_json(self) -> dict[str, str]:
        """The row as a JSON object (``id`` is the repr: the value may not be text at all)."""
        return {"id": self.shown, "reason": self.reason}


def foreign_json(foreign: list[Foreign]) -> dict[str, list[dict[str, str]]]:
    """``{"foreign": [...]}`` when there are foreign rows; nothing when there are none."""
    return {"foreign": [f.to_json() for f in foreign]} if foreign else {}


async def workflow_ids(
    manager: CheckpointManager, records: Iterable[str] = ()
) -> tuple[list[str], list[Foreign]]:
    """The store's workflow ids (listed, plus ``records``), sorted, and the foreign ones.

    A store damaged by hand (a bytes id in a SQLite table, a bad id file in a file store)
    may list ids that are not valid: those are reported, never used. A SQLite store lists
    only valid ids and names its damaged rows itself (``foreign_rows``): those are reported
    by table and rowid; a file store's entries that are no workflow's directory
    (``foreign_entries``) by their path under the store.
    """
    good: set[str] = set()
    foreign = {f.shown: f for f in await _stored_foreign(manager)}
    for value in [*await manager.list_workflows(), *records]:
        try:
            good.add(check_workflow_id(value))
        except InvalidArgumentError as exc:
            shown = repr(value)
            shown = shown if len(shown) <= 200 else shown[:199] + "…"
            foreign.setdefault(shown, Foreign(shown, str(exc)))
    return sorted(good), list(foreign.values())


async def _stored_foreign(manager: CheckpointManager) -> list[Foreign]:
    """The damaged rows or entries a store reports itself (SQLite, file), as Foreign rows."""
    storage = manager.storage
    # A backend's module is imported here only if already loaded: otherwise no store of it
    # exists, and the command need not pay for importing it.
    if "aiocheckpoint.storage.sqlite" in sys.modules:
        from ..storage.sqlite import SQLiteCheckpointStorage

        if isinstance(storage, SQLiteCheckpointStorage):
            rows = await storage.foreign_rows()
            return [Foreign(f"{row.table} rowid {row.rowid}", row.reason) for row in rows]
    if "aiocheckpoint.storage.file" in sys.modules:
        from ..storage.file import FileCheckpointStorage

        if isinstance(storage, FileCheckpointStorage):
            entries = await storage.foreign_entries()
            return [Foreign(entry.path, entry.reason) for entry in entries]
    return []


def _scheme(url: str) -> str:
    return url.split(":", 1)[0].lower() if ":" in url else ""


def location(url: str, storage: CheckpointStorage) -> str | None:
    """The local path a ``file:`` or ``sqlite:`` store lives at (None for the others)."""
    scheme = _scheme(url)
    if scheme == "file":
        return str(getattr(storage, "base_dir"))  # noqa: B009 - only FileCheckpointStorage
    if scheme == "sqlite":
        return str(getattr(storage, "path"))  # noqa: B009 - only SQLiteCheckpointStorage
    return None


def _check_exists(url: str, storage: CheckpointStorage) -> None:
    path = location(url, storage)
    if path is None:
        return
    if _scheme(url) == "file":
        if not os.path.exists(path):
            raise CommandError(f"no file store at {path} (from {url!r})", EXIT_NOT_FOUND)
        if not os.path.isdir(path):
            raise CommandError(f"{path} is not a directory, so not a file store", EXIT_USAGE)
    else:
        if not os.path.exists(path):
            raise CommandError(f"no SQLite database at {path} (from {url!r})", EXIT_NOT_FOUND)
        if os.path.isdir(path):
            raise CommandError(f"{path} is a directory, not a SQLite database", EXIT_USAGE)


@asynccontextmanager
async def open_store(
    url: str, *, must_exist: bool, keys: Keyring | None = None, allow_shared: bool = False
) -> AsyncIterator[CheckpointManager]:
    """A manager over the store ``url`` names, closed on exit.

    With ``must_exist`` a ``file:`` or ``sqlite:`` store that is not there is an error,
    rather than an empty store silently created by a command that only reads. With
    ``keys`` the manager reads (and writes) encrypted records (``docs/encryption.md``).
    ``allow_shared`` (``--allow-shared``) opens a ``file:`` or ``sqlite:`` store that
    another user owns or may write; the other backends have no such check.
    """
    local = _scheme(url) in ("file", "sqlite")
    storage = open_storage(url, **({"allow_shared": True} if allow_shared and local else {}))
    if must_exist:
        _check_exists(url, storage)
    manager = CheckpointManager(storage, encryption=keys)
    try:
        yield manager
    finally:
        await manager.close()


def _inside(step: int, after: int | None, before: int | None) -> bool:
    return (after is None or step > after) and (before is None or step < before)


async def read_page(
    storage: CheckpointStorage,
    workflow_id: str,
    *,
    after: int | None = None,
    before: int | None = None,
    limit: int | None = PAGE,
    descending: bool = False,
) -> list[Record]:
    """One ``scan`` page, with records the storage refuses to read reported as Unreadable.

    A backend refuses a whole page when one record in it is unreadable; the records on the
    near side of that step are fetched again, so no readable record is ever skipped.
    """
    try:
        return list(
            await storage.scan(
                workflow_id, after=after, before=before, limit=limit, descending=descending
            )
        )
    except CheckpointCorruptedError as exc:
        bad = exc.step
        if bad is None or not _inside(bad, after, before):
            raise
        if descending:
            head = await read_page(
                storage, workflow_id, after=bad, before=before, limit=limit, descending=True
            )
        else:
            head = await read_page(storage, workflow_id, after=after, before=bad, limit=limit)
        if limit is not None and len(head) >= limit:
            return head
        return [*head, Unreadable(bad, redact(exc.reason))]


async def iter_records(
    storage: CheckpointStorage, workflow_id: str, *, before: int | None = None
) -> AsyncIterator[Record]:
    """Every record of a workflow in step order (below ``before``), one page per call."""
    cursor: int | None = None
    while True:
        page = await read_page(storage, workflow_id, after=cursor, before=before)
        if not page:
            return
        for record in page:
            yield record
        cursor = page[-1].step


async def decode(manager: CheckpointManager, workflow_id: str, record: Record) -> Checkpoint | str:
    """The record's checkpoint, or why not: corrupted, or :class:`Locked` (no key for it).

    Values stay in the tagged JSON form records hold (``{"$dt": "..."}``): the command line
    never needs the application's classes, and what it prints, copies or exports is exact.
    """
    if isinstance(record, Unreadable):
        return record.reason
    try:
        return await manager.decode_record(workflow_id, record, view="stored")
    except CheckpointCorruptedError as exc:
        return redact(exc.reason)
    except EncryptionError as exc:
        return locked(exc, record.data)


async def portable(
    manager: CheckpointManager, workflow_id: str, record: Record, *, plaintext: bool = False
) -> bytes | str:
    """The record's bytes in a form any store can take, or the reason it is corrupted.

    Version-1 records are returned as they are (an encrypted one still encrypted, unless
    ``plaintext``). An incremental (version-2) record needs its blobs, which another store
    does not have: it is re-encoded as the equivalent version-1 record of the same
    checkpoint. An encrypted one is refused unless ``plaintext`` (never written out in the
    clear unasked): ``rekey`` makes it a whole encrypted record first.
    A sealed record's checksum is its authentication tag: it verifies with its key only,
    and without that key the reason returned is :class:`Locked`.
    """
    if isinstance(record, Unreadable):
        return record.reason
    result = await decode(manager, workflow_id, record)
    if isinstance(result, str):
        return result
    if is_sealed_tree_record(record.data) and not plaintext:
        return _SEALED_TREE
    if len(record.data) > 4 and record.data[4] == 1 and not (plaintext and record.data[5]):
        return record.data
    return encode_checkpoint(result)
