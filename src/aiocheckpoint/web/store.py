"""The store page: which backend, its schema version and size, and ``verify`` a page at a time.

Every figure is bounded: the file store's size sums at most :data:`FILES` entries (more is
shown as "at least"); a verify request decodes at most :data:`VERIFY_RECORDS` checkpoints,
workflow by workflow in id order as the workflow list pages them, and links to the request
that carries on from where it stopped. Like ``aiocheckpoint verify``, it decodes each record
with the store's keys and lists the records it cannot open (locked: which checkpoint, which
key) apart from the damaged ones.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio.to_thread

from ..errors import CheckpointCorruptedError, CheckpointError, EncryptionError
from ..manager import CheckpointManager
from . import data

__all__ = ["FILES", "VERIFY_RECORDS", "StoreFacts", "VerifyPage", "store_facts", "verify_page"]

#: Entries the file store's size counts at most.
FILES: Final = 100_000
#: Checkpoints one verify request decodes at most.
VERIFY_RECORDS: Final = 2000


@dataclass
class StoreFacts:
    """Backend, schema version, where it lives and how big it is."""

    backend: str
    schema_version: int | None = None
    where: str | None = None
    #: bytes on disk (None: not measured here), and whether it is a lower bound
    size: int | None = None
    size_at_least: bool = False
    records: bool = False
    effects: bool = False


@dataclass
class VerifyPage:
    """One verify request's findings and where the next one starts.

    Damaged records (``corrupted``) and records the inspector's keys cannot open
    (``unreadable``: sealed under a key it lacks, or encrypted and it has none; their bytes
    may be sound) are listed apart, each as (workflow, step, why), as ``aiocheckpoint
    verify`` counts them apart. Each list holds at most the request's checkpoints.
    """

    workflows: int = 0
    checkpoints: int = 0
    corrupted: list[tuple[str, int | None, str]] = field(default_factory=list)
    unreadable: list[tuple[str, int | None, str]] = field(default_factory=list)
    #: where the next request starts: inside a workflow from a step, or after a workflow
    #: (step None); None when the store is done
    next: tuple[str, int | None] | None = None


async def store_facts(manager: CheckpointManager) -> StoreFacts:
    """What the store page says of the store."""
    storage = manager.storage
    facts = StoreFacts(type(storage).__name__)
    facts.records = manager.supports_workflow_records()
    facts.effects = manager.supports_effects()
    # A backend's module is looked at only if it is loaded (a store of it is open).
    sqlite = sys.modules.get("aiocheckpoint.storage.sqlite")
    if sqlite is not None and isinstance(storage, sqlite.SQLiteCheckpointStorage):
        from ..storage.sqlite.schema import SCHEMA_VERSION

        path = Path(storage.path)
        facts.schema_version, facts.where = SCHEMA_VERSION, str(path)
        facts.size = await anyio.to_thread.run_sync(_files_size, [path, Path(f"{path}-wal")])
    postgres = sys.modules.get("aiocheckpoint.storage.postgres")
    if postgres is not None and isinstance(storage, postgres.PostgresCheckpointStorage):
        from ..storage.postgres.schema import SCHEMA_VERSION as PG_VERSION

        facts.schema_version, facts.where = PG_VERSION, f"schema {storage.schema}"
    files = sys.modules.get("aiocheckpoint.storage.file")
    if files is not None and isinstance(storage, files.FileCheckpointStorage):
        base = Path(storage.base_dir)
        facts.where = str(base)
        facts.size, facts.size_at_least = await anyio.to_thread.run_sync(_tree_size, base)
    return facts


def _files_size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.exists())


def _tree_size(base: Path) -> tuple[int, bool]:
    """Bytes of the files under ``base``, counting at most FILES entries (and if it stopped)."""
    total, seen, pending = 0, 0, [str(base)]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                seen += 1
                if seen > FILES:
                    return total, True
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total, False


async def verify_page(
    manager: CheckpointManager, after: str | None, from_step: int | None
) -> VerifyPage:
    """One verify request's worth of checkpoints, decoded.

    Those of workflow ``after`` from step ``from_step`` if given, then those of the
    workflows after it, until :data:`VERIFY_RECORDS` are decoded or the store is done.
    """
    page = VerifyPage()
    budget = VERIFY_RECORDS
    if after is not None and from_step is not None:
        stop, budget = await _verify_workflow(manager, after, from_step, budget, page)
        if stop is not None:
            page.next = (after, stop)
            return page
    while True:
        rows, more = await data.list_workflows(manager, status=None, prefix="", after=after)
        for row in rows:
            if budget <= 0:
                page.next = (after, None) if after is not None else None
                return page
            stop, budget = await _verify_workflow(manager, row.workflow_id, None, budget, page)
            if stop is not None:
                page.next = (row.workflow_id, stop)
                return page
            after = row.workflow_id
        if more is None:
            return page


async def _verify_workflow(
    manager: CheckpointManager,
    workflow_id: str,
    from_step: int | None,
    budget: int,
    page: VerifyPage,
) -> tuple[int | None, int]:
    """Check one workflow's records; the step to go on from if the budget ran out."""
    page.workflows += from_step is None
    cursor = None if from_step is None else from_step - 1
    while True:
        try:
            records = await manager.storage.scan(workflow_id, after=cursor, limit=100)
        except CheckpointCorruptedError as exc:
            page.corrupted.append((workflow_id, exc.step, data.problem_of(exc)))
            return None, budget
        if not records:
            return None, budget
        for record in records:
            if budget <= 0:
                return record.step, budget
            budget -= 1
            page.checkpoints += 1
            try:
                await manager.decode_record(workflow_id, record, view="stored")
            except CheckpointError as exc:
                found = page.unreadable if isinstance(exc, EncryptionError) else page.corrupted
                found.append((workflow_id, record.step, data.problem_of(exc)))
        cursor = records[-1].step
