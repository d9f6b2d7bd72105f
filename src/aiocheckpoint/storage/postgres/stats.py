"""The counters a PostgreSQL store keeps of its own work (``storage.stats``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WriteStats"]


@dataclass
class WriteStats:
    """Counters of the group-commit writer: how many rows shared how many transactions."""

    rows: int = 0
    batches: int = 0
    retries: int = 0
    split_batches: int = 0
    largest_batch: int = 0
    #: Statements that added or released blob references (one per tree level and batch).
    blob_statements: int = 0
