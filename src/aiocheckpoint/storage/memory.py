"""In-memory storage: the default backend, for tests and short-lived runs."""

from __future__ import annotations

import asyncio
import bisect
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import anyio.lowlevel

from .._validation import check_save, check_step, check_workflow_id
from ..errors import (
    CheckpointNotFoundError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLostError,
)
from ..format import SplitResult, TreeParams
from ..leases import WORKFLOW_KIND, Lease, WorkflowRecord, WorkflowStatus, check_kind
from ..models import utcnow
from .base import (
    DEFAULT_MAX_RECORD_BYTES,
    MAX_EFFECTS_PER_STEP,
    BaseStorage,
    StoredCheckpoint,
    StoredEffect,
    check_blob_sizes,
    check_effect_key,
    check_max_record_bytes,
    check_record_size,
)
from .eventlog import EventLog
from .events import (
    EventKind,
    EventNote,
    Reseal,
    StoredEvent,
    check_event_page,
    check_events,
    check_reseals,
    check_sleep,
    failure_events,
    reseal_record,
    status_event,
    status_event_data,
    taken_over,
)
from .lifecycle import cancel_error, cancelled_refusal, check_cancel, check_retry
from .memoryblobs import MemoryBlobs
from .queries import StepInfo, WorkflowQuery, failure_update, matches
from .refcounts import (
    checked_tree,
    held_root_refs,
)

__all__ = ["InMemoryCheckpointStorage"]


class _Workflow:
    __slots__ = ("records", "refs", "steps")

    def __init__(self) -> None:
        self.steps: list[int] = []  # sorted
        self.records: dict[int, bytes] = {}
        # The blob references each version-2 record holds (version-1 records: none).
        self.refs: dict[int, tuple[bytes, ...]] = {}


#: One workflow's effect journal: ``step -> key -> (in_doubt, record)``.
_Effects = dict[int, dict[str, tuple[bool, bytes]]]
#: A workflow's latest step, its agent and agent status, and when it was saved.
_Latest = tuple[int | None, str | None, str | None, datetime]


class InMemoryCheckpointStorage(BaseStorage):
    """Keeps encoded records, and the blobs of large states, in dicts; nothing survives the process.

    Records are still encoded and checksummed, so behaviour matches the durable backends.
    It is a :class:`~aiocheckpoint.storage.base.BlobCheckpointStorage`, as they are: a state
    over ``blob_params.root_inline_limit`` is stored as a version-2 record and blobs shared
    between checkpoints, so a checkpoint of a large ``SharedState`` costs what changed. A
    blob goes when the last record referencing it does (reference counts).
    Every operation is a dict lookup or a binary search: O(log n) in the workflow's history.
    Records (and blobs) larger than ``max_record_bytes`` are refused with
    :class:`~aiocheckpoint.InvalidArgumentError`, as the durable backends refuse them.
    """

    db_system = "aiocheckpoint.memory"
    #: Its saves never wait for I/O: a manager paces each step of its large saves.
    never_suspends = True

    def __init__(
        self,
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        blob_params: TreeParams | None = None,
    ) -> None:
        self._max_record_bytes = check_max_record_bytes(max_record_bytes)
        if blob_params is not None and not isinstance(blob_params, TreeParams):
            raise InvalidArgumentError("blob_params must be a TreeParams or None")
        self._params = blob_params or TreeParams()
        self._workflows: dict[str, _Workflow] = {}
        self._blobs = MemoryBlobs()
        self._raw: dict[str, WorkflowRecord] = {}
        # The newest step of saved workflows not yet written into their records (a pydantic
        # copy per save is most of an in-memory save's cost): folded in by any read.
        self._pending: dict[str, _Latest] = {}
        self._effects: dict[str, _Effects] = {}
        self._events = EventLog()

    @property
    def blob_params(self) -> TreeParams:
        """How this store cuts large states into blobs (the ``blob_params`` option)."""
        return self._params

    @property
    def stored_bytes(self) -> int:
        """The bytes held: every checkpoint record and every blob (effects not counted)."""
        records = sum(len(r) for wf in self._workflows.values() for r in wf.records.values())
        return records + self._blobs.size

    async def save(
        self,
        workflow_id: str,
        step: int,
        data: bytes,
        *,
        keep_last: int | None = None,
        fence: Lease | None = None,
        step_info: StepInfo | None = None,
    ) -> None:
        """Store ``data`` as ``step``; keep only the ``keep_last`` highest steps if given.

        A version-2 record given whole holds references on the blobs it names that are
        stored (the others are missing: it reads as corrupted).
        """
        # Yield once, as a real store would, so that a loop of saves cannot starve other tasks.
        await _yield()
        self._check_open()
        workflow_id, step, keep_last = check_save(workflow_id, step, keep_last)
        check_record_size(data, self._max_record_bytes)
        self._check_fence(workflow_id, fence)
        data = bytes(data)
        refs: tuple[bytes, ...] = ()
        if len(data) > 4 and data[4] != 1:  # only a version-2 record can hold references
            refs = self._blobs.add_stored(held_root_refs(data))
        self._write(workflow_id, step, data, refs, keep_last, step_info)

    async def save_tree(
        self,
        workflow_id: str,
        step: int,
        record: bytes,
        split: SplitResult,
        *,
        keep_last: int | None = None,
        fence: Lease | None = None,
        step_info: StepInfo | None = None,
    ) -> None:
        """Store ``split``'s new blobs, count references, then store ``record``, as :meth:`save`.

        Raises :class:`~aiocheckpoint.InvalidArgumentError` if ``record`` does not reference
        exactly ``split.root_refs``, or if a blob is neither stored nor in ``split.blobs`` (a
        split made with a stale ``known``); nothing is stored then.
        """
        await _yield()
        self._check_open()
        workflow_id, step, keep_last = check_save(workflow_id, step, keep_last)
        record = bytes(record)
        refs = checked_tree(record, split)
        check_record_size(record, self._max_record_bytes)
        check_blob_sizes(split, self._max_record_bytes)
        self._check_fence(workflow_id, fence)
        self._blobs.add(split)
        self._write(workflow_id, step, record, refs, keep_last, step_info)

    def _write(
        self,
        workflow_id: str,
        step: int,
        data: bytes,
        refs: tuple[bytes, ...],
        keep_last: int | None,
        step_info: StepInfo | None,
    ) -> None:
        """Store a record whose references are counted; release those of the records it ends."""
        if step_info is not None:
            self._note_step(workflow_id, step, step_info)
            if step_info.note is not None:  # in this write: nothing awaits in between
                kind, text = step_info.note
                self._events.append(self._records[workflow_id], EventKind(kind), text, utcnow())
        elif workflow_id not in self._raw:
            self._ensure_record(workflow_id)
        wf = self._workflows.get(workflow_id)
        if wf is None:  # not setdefault: that would build a _Workflow at every save
            wf = self._workflows[workflow_id] = _Workflow()
        if step not in wf.records:
            bisect.insort(wf.steps, step)
        wf.records[step] = data
        released = wf.refs.pop(step, ())
        if refs:
            wf.refs[step] = refs
        if keep_last is not None and len(wf.steps) > keep_last:
            dropped = wf.steps[: len(wf.steps) - keep_last]
            del wf.steps[: len(dropped)]
            for old in dropped:
                del wf.records[old]
                released += wf.refs.pop(old, ())
            gone = set(dropped)
            self._drop_effects(workflow_id, gone.__contains__)
        if released:
            self._blobs.release(released)

    async def load(self, workflow_id: str, step: int | None = None) -> StoredCheckpoint | None:
        """Return one step's record (the highest when ``step`` is None), or None."""
        self._check_open()
        wf = self._workflows.get(workflow_id)
        if wf is None:
            return None
        if step is None:
            step = wf.steps[-1]
        data = wf.records.get(step)
        return None if data is None else StoredCheckpoint(step, data)

    async def scan(
        self,
        workflow_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        limit: int | None = None,
        descending: bool = False,
    ) -> list[StoredCheckpoint]:
        """Return records with ``after < step < before`` in step order, at most ``limit``."""
        self._check_open()
        wf = self._workflows.get(workflow_id)
        if wf is None:
            return []
        lo = 0 if after is None else bisect.bisect_right(wf.steps, after)
        hi = len(wf.steps) if before is None else bisect.bisect_left(wf.steps, before)
        if descending:
            start = lo if limit is None else max(lo, hi - limit)
            steps = wf.steps[start:hi][::-1]
        else:
            steps = wf.steps[lo : hi if limit is None else min(hi, lo + limit)]
        return [StoredCheckpoint(s, wf.records[s]) for s in steps]

    async def exists(self, workflow_id: str, step: int | None = None) -> bool:
        """Whether the step (or any step) is stored."""
        self._check_open()
        wf = self._workflows.get(workflow_id)
        return wf is not None and (step is None or step in wf.records)

    async def delete(self, workflow_id: str, step: int | None = None) -> bool:
        """Delete one step, or the whole workflow (with its record and lease)."""
        self._check_open()
        self._drop_effects(workflow_id, lambda s: step is None or s == step)
        if step is None:
            had_record = self._records.pop(workflow_id, None) is not None
            self._events.drop(workflow_id)
            wf = self._workflows.pop(workflow_id, None)
            if wf is not None:
                self._blobs.release(h for refs in wf.refs.values() for h in refs)
            return wf is not None or had_record
        wf = self._workflows.get(workflow_id)
        if wf is None:
            return False
        if wf.records.pop(step, None) is None:
            return False
        wf.steps.remove(step)
        self._blobs.release(wf.refs.pop(step, ()))
        if not wf.steps:
            del self._workflows[workflow_id]
        return True

    async def delete_workflow(self, workflow_id: str, *, updated_at: datetime) -> int | None:
        """Delete the workflow whole if its record is untouched since ``updated_at``.

        Returns its checkpoint records' bytes, or None when nothing was deleted.
        """
        self._check_open()
        record = self._records.get(workflow_id)
        if record is None or record.updated_at != updated_at:
            return None
        if record.lease_owner is not None and not _expired(record, utcnow()):
            return None
        wf = self._workflows.get(workflow_id)
        size = 0 if wf is None else sum(map(len, wf.records.values()))
        await self.delete(workflow_id)
        return size

    async def list_workflows(self) -> list[str]:
        """Every workflow id with at least one record, sorted."""
        self._check_open()
        return sorted(self._workflows)

    async def fetch_blobs(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        """Return the stored blobs among ``hashes``."""
        self._check_open()
        if any(not isinstance(h, (bytes, bytearray, memoryview)) for h in hashes):
            raise InvalidArgumentError("fetch_blobs takes a collection of bytes hashes")
        data = self._blobs.data
        found: dict[bytes, bytes] = {}
        for h in hashes:
            blob = data.get(bytes(h))
            if blob is not None:
                found[bytes(h)] = blob
        return found

    async def collect_garbage(self) -> int:
        """Return 0: a blob goes with the last record that references it."""
        self._check_open()
        return 0

    async def close(self) -> None:
        """Drop every record and blob and mark the storage closed."""
        self._workflows.clear()
        self._blobs.clear()
        self._records.clear()
        self._effects.clear()
        self._events.clear()
        await super().close()

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
        """Store an effect record of ``step`` (fenced by ``fence``), replacing the key's."""
        await _yield()
        self._check_open()
        check_workflow_id(workflow_id)
        check_step(step)
        check_effect_key(key)
        check_record_size(data, self._max_record_bytes)
        self._check_fence(workflow_id, fence)
        journal = self._effects.setdefault(workflow_id, {}).setdefault(step, {})
        journal[key] = (bool(in_doubt), bytes(data))

    async def load_effects(self, workflow_id: str, step: int) -> list[StoredEffect]:
        """The effect records of ``step``, ordered by key."""
        self._check_open()
        found = sorted(self._effects.get(workflow_id, {}).get(step, {}).items())
        return [StoredEffect(step, k, doubt, data) for k, (doubt, data) in found][
            :MAX_EFFECTS_PER_STEP
        ]

    async def in_doubt_workflows(self) -> list[str]:
        """Every workflow with an effect in doubt, sorted."""
        self._check_open()
        return sorted(
            wf
            for wf, journal in self._effects.items()
            if any(d for keys in journal.values() for d, _ in keys.values())
        )

    async def in_doubt_effects(self, workflow_id: str) -> list[StoredEffect]:
        """The workflow's effect records in doubt, ordered by step then key."""
        self._check_open()
        journal = self._effects.get(workflow_id, {})
        return [
            StoredEffect(step, key, True, data)
            for step in sorted(journal)
            for key, (doubt, data) in sorted(journal[step].items())
            if doubt
        ][:MAX_EFFECTS_PER_STEP]

    async def effect_workflows(self) -> list[str]:
        """Every workflow with at least one effect record, sorted."""
        self._check_open()
        return sorted(wf for wf, journal in self._effects.items() if journal)

    async def effect_steps(self, workflow_id: str) -> list[int]:
        """The steps of ``workflow_id`` that have effect records, ascending."""
        self._check_open()
        check_workflow_id(workflow_id)
        return sorted(s for s, keys in self._effects.get(workflow_id, {}).items() if keys)

    async def drop_orphan_effects(self, workflow_id: str, below: int) -> int:
        """Delete the effect records of steps below ``below`` without a checkpoint."""
        self._check_open()
        wf = self._workflows.get(workflow_id)
        steps = set() if wf is None else set(wf.records)
        journal = self._effects.get(workflow_id, {})
        doomed = [s for s in journal if s < below and s not in steps]
        count = sum(len(journal[s]) for s in doomed)
        self._drop_effects(workflow_id, set(doomed).__contains__)
        self._events.thin(workflow_id, below)  # thinned with the checkpoints they describe
        return count

    async def has_effects(self, workflow_id: str) -> bool:
        """Whether the workflow has any effect record (an empty journal is not kept)."""
        self._check_open()
        return workflow_id in self._effects

    def _drop_effects(self, workflow_id: str, doomed: Callable[[int], bool]) -> None:
        journal = self._effects.get(workflow_id)
        if journal is None:
            return
        for step in [s for s in journal if doomed(s)]:
            del journal[step]
        if not journal:
            del self._effects[workflow_id]

    # --- workflow records and leases (WorkflowStorage) -------------------------------

    async def set_workflow_status(
        self,
        workflow_id: str,
        status: WorkflowStatus,
        *,
        fence: Lease | None = None,
        note: EventNote | None = None,
    ) -> WorkflowRecord:
        """Create or update the workflow's record with ``status``, appending its event."""
        self._check_open()
        self._check_fence(workflow_id, fence)
        now = utcnow()
        ends = status in (WorkflowStatus.FINISHED, WorkflowStatus.FAILED)
        old = self._records.get(workflow_id)
        record = self._unless_cancelled(self._ensure_record(workflow_id))
        revived = record.status is WorkflowStatus.FAILED and status is WorkflowStatus.UNFINISHED
        kind = status_event(None if old is None else old.status, status)
        if note is not None:
            self._events.append(record, note.kind, note.data, now)
        elif kind is not None:
            self._events.append(record, kind, status_event_data(record.status, kind), now)
        return self._update(
            record,
            status=status,
            updated_at=now,
            finished_at=now if ends else None,
            retry_at=None,
            attempts=0 if revived else record.attempts,
        )

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow's record, or None."""
        self._check_open()
        return self._records.get(workflow_id)

    @staticmethod
    def _unless_cancelled(record: WorkflowRecord) -> WorkflowRecord:
        """``record``; CancelledRecordError if it is CANCELLED (only a retry moves it)."""
        if record.status is WorkflowStatus.CANCELLED:
            raise cancelled_refusal(record)
        return record

    async def register_workflow(
        self, workflow_id: str, *, metadata: str | None = None, kind: str | None = None
    ) -> WorkflowRecord:
        """Create the record if missing; with ``metadata`` (JSON text), replace its metadata.

        A new record takes ``kind`` (``"workflow"`` when None); an existing record of the
        default kind takes a ``kind`` that is not None, one of any other kind keeps it.
        """
        self._check_open()
        kind = None if kind is None else check_kind(kind)
        record = self._ensure_record(workflow_id)
        if kind is not None and record.kind == WORKFLOW_KIND and kind != WORKFLOW_KIND:
            record = self._records[workflow_id] = record.model_copy(update={"kind": kind})
        if metadata is not None:
            record = self._update(record, metadata=json.loads(metadata))
        return record

    async def resume_workflow(self, workflow_id: str, resume_input: str) -> WorkflowRecord:
        """Make a PAUSED workflow UNFINISHED, holding ``resume_input`` for its next run."""
        self._check_open()
        record = self._records.get(workflow_id)
        if record is None:
            raise CheckpointNotFoundError(workflow_id)
        if record.status is not WorkflowStatus.PAUSED:
            raise InvalidArgumentError(
                f"workflow {workflow_id!r} is {record.status}, not paused: nothing to resume"
            )
        data = json.dumps({"input": json.loads(resume_input)})
        self._events.append(record, EventKind.RESUMED, data, utcnow())
        return self._update(
            record,
            status=WorkflowStatus.UNFINISHED,
            finished_at=None,
            retry_at=None,
            resume_input=json.loads(resume_input),
        )

    async def cancel_workflow(self, workflow_id: str, reason: str | None) -> WorkflowRecord:
        """Cancel an UNFINISHED or PAUSED workflow and revoke its lease (``lifecycle``)."""
        self._check_open()
        record = self._records.get(workflow_id)
        check_cancel(record, workflow_id)
        assert record is not None
        data = json.dumps({"reason": reason})
        self._events.append(record, EventKind.CANCELLED, data, utcnow())
        return self._update(
            record,
            status=WorkflowStatus.CANCELLED,
            last_error=json.loads(cancel_error(reason)),
            finished_at=utcnow(),
            retry_at=None,
            lease_owner=None,
            lease_expires_at=None,
            fencing_token=record.fencing_token + 1,
        )

    async def retry_workflow(self, workflow_id: str) -> WorkflowRecord:
        """Make a FAILED or CANCELLED workflow UNFINISHED with a fresh attempt budget."""
        self._check_open()
        record = self._records.get(workflow_id)
        check_retry(record, workflow_id)
        assert record is not None
        data = json.dumps({"previous": record.status.value})
        self._events.append(record, EventKind.RETRIED, data, utcnow())
        return self._update(
            record, status=WorkflowStatus.UNFINISHED, attempts=0, retry_at=None, finished_at=None
        )

    async def record_failure(
        self,
        workflow_id: str,
        error: str,
        *,
        retry_delays: tuple[float, ...] = (),
        fence: Lease | None = None,
    ) -> WorkflowRecord:
        """Count a failed run and store ``error``; retry it after a delay, or mark it FAILED."""
        self._check_open()
        self._check_fence(workflow_id, fence)
        record = self._unless_cancelled(self._ensure_record(workflow_id))
        status, delay = failure_update(record.attempts, retry_delays)
        now = utcnow()
        retry_at = None if delay is None else now + timedelta(seconds=delay)
        record = self._update(
            record,
            status=status,
            attempts=record.attempts + 1,
            last_error=json.loads(error),
            finished_at=now if delay is None else None,
            retry_at=retry_at,
        )
        at = None if retry_at is None else retry_at.isoformat()
        for kind, data in failure_events(error, status, at):
            self._events.append(record, kind, data, now)
        return record

    async def sleep_workflow(
        self, workflow_id: str, seconds: float, *, fence: Lease | None = None
    ) -> WorkflowRecord:
        """UNFINISHED, claimable ``seconds`` from now; appends ``sleeping``."""
        self._check_open()
        seconds = check_sleep(seconds)
        self._check_fence(workflow_id, fence)
        record = self._unless_cancelled(self._ensure_record(workflow_id))
        now = utcnow()
        until = now + timedelta(seconds=seconds)
        self._events.append(record, EventKind.SLEEPING, _until(until), now)
        return self._update(
            record, status=WorkflowStatus.UNFINISHED, retry_at=until, finished_at=None
        )

    async def put_events(
        self, workflow_id: str, events: Sequence[StoredEvent], *, replace: bool
    ) -> None:
        """Append carried events as they are; ``replace``: drop the workflow's others first."""
        self._check_open()
        check_workflow_id(workflow_id)
        self._events.put(workflow_id, check_events(events), replace)

    async def reseal(self, workflow_id: str, changes: Sequence[Reseal]) -> int:
        """Replace each change's text that still holds its ``old``; how many were replaced."""
        self._check_open()
        check_workflow_id(workflow_id)
        done = 0
        for change in check_reseals(changes):
            if change.seq is not None:
                done += self._events.reseal(workflow_id, change.seq, change.old, change.new)
            elif (record := self._records.get(workflow_id)) is not None:
                resealed = reseal_record(record, change)
                if resealed is not None:
                    self._records[workflow_id] = resealed
                    done += 1
        return done

    async def get_events(
        self, workflow_id: str, *, after: int | None = None, limit: int = 1000
    ) -> list[StoredEvent]:
        """The workflow's events after sequence number ``after``, oldest first."""
        self._check_open()
        check_workflow_id(workflow_id)
        after, limit = check_event_page(after, limit)
        return self._events.page(workflow_id, after, limit)

    async def query_workflow_records(self, query: WorkflowQuery) -> list[WorkflowRecord]:
        """The records passing ``query``, ordered by workflow id (a pass over every record)."""
        self._check_open()
        found: list[WorkflowRecord] = []
        doubtful = set(await self.in_doubt_workflows()) if query.in_doubt is not None else ()
        ids = sorted(self._records)
        if query.newest_first:
            ids.sort(key=lambda i: self._records[i].updated_at, reverse=True)  # stable: ties by id
        for workflow_id in ids:
            if query.limit is not None and len(found) >= query.limit:
                break
            record = self._records[workflow_id]
            if matches(record, query, doubtful):
                found.append(record)
        return found

    async def list_workflow_records(
        self, status: WorkflowStatus | None = None
    ) -> list[WorkflowRecord]:
        """Records ordered by workflow id, optionally only those with ``status``."""
        self._check_open()
        return [
            record
            for _, record in sorted(self._records.items())
            if status is None or record.status is status
        ]

    async def acquire_lease(self, workflow_id: str, owner: str, ttl: float) -> Lease:
        """Grant the lease if it is free, expired or already ``owner``'s."""
        self._check_open()
        record = self._ensure_record(workflow_id)
        now = utcnow()
        if record.lease_owner not in (None, owner) and not _expired(record, now):
            raise LeaseHeldError(
                f"workflow {workflow_id!r} is leased by {record.lease_owner!r} "
                f"until {record.lease_expires_at}"
            )
        self._note_takeover(record, owner, now)
        return self._grant(record, owner, ttl, now, record.fencing_token + 1)

    async def renew_lease(self, lease: Lease, ttl: float) -> Lease:
        """Extend a lease whose token is still current."""
        self._check_open()
        record = self._current(lease)
        return self._grant(record, lease.owner, ttl, utcnow(), lease.token)

    async def release_lease(self, lease: Lease) -> None:
        """Free a current lease; a stale one is ignored."""
        self._check_open()
        record = self._records.get(lease.workflow_id)
        if record is not None and record.fencing_token == lease.token:
            self._update(record, lease_owner=None, lease_expires_at=None)

    async def claim_next_workflow(self, owner: str, ttl: float) -> Lease | None:
        """Lease the oldest unfinished workflow whose lease is free or expired."""
        self._check_open()
        now = utcnow()
        free = [
            r
            for r in self._records.values()
            if r.status is WorkflowStatus.UNFINISHED
            and r.kind == WORKFLOW_KIND
            and (r.lease_owner is None or _expired(r, now))
            and (r.retry_at is None or r.retry_at <= now)
        ]
        if not free:
            return None
        record = min(free, key=lambda r: (r.created_at, r.workflow_id))
        self._note_takeover(record, owner, now)
        return self._grant(record, owner, ttl, now, record.fencing_token + 1)

    def _note_takeover(self, record: WorkflowRecord, owner: str, now: datetime) -> None:
        data = taken_over(record.lease_owner, _expired(record, now), owner)
        if data is not None:
            self._events.append(record, EventKind.LEASE_TAKEN_OVER, data, now)

    def _ensure_record(self, workflow_id: str) -> WorkflowRecord:
        record = self._records.get(workflow_id)
        if record is None:
            now = utcnow()
            record = WorkflowRecord(
                workflow_id=workflow_id,
                status=WorkflowStatus.UNFINISHED,
                created_at=now,
                updated_at=now,
            )
            self._records[workflow_id] = record
        return record

    def _update(self, record: WorkflowRecord, **changes: Any) -> WorkflowRecord:
        record = record.model_copy(update={"updated_at": utcnow(), **changes})
        self._records[record.workflow_id] = record
        return record

    @property
    def _records(self) -> dict[str, WorkflowRecord]:
        """The workflow records, with every save's newest step written in."""
        if self._pending:
            self._fold()
        return self._raw

    def _fold(self) -> None:
        raw, pending = self._raw, self._pending
        for workflow_id, (step, agent_id, agent_status, when) in pending.items():
            raw[workflow_id] = raw[workflow_id].model_copy(
                update={
                    "latest_step": step,
                    "latest_agent_id": agent_id,
                    "latest_agent_status": agent_status,
                    "updated_at": when,
                }
            )
        pending.clear()

    def _note_step(self, workflow_id: str, step: int, info: StepInfo) -> None:
        """Note a save of ``step``: the latest step moves only forward; the time always."""
        record = self._raw.get(workflow_id)
        if record is None or record.resume_input is not None:
            record = self._update(self._ensure_record(workflow_id), resume_input=None)
        kind = info.kind
        if kind is not None and kind != record.kind and record.kind == WORKFLOW_KIND:
            record = self._update(self._records[workflow_id], kind=kind)
        noted = self._pending.get(workflow_id)
        latest = (
            (record.latest_step, record.latest_agent_id, record.latest_agent_status)
            if noted is None
            else noted[:3]
        )
        now = utcnow()
        if latest[0] is None or step >= latest[0]:
            self._pending[workflow_id] = (step, info.agent_id, info.agent_status, now)
        else:
            self._pending[workflow_id] = (*latest, now)

    def _current(self, lease: Lease) -> WorkflowRecord:
        record = self._records.get(lease.workflow_id)
        if record is None or record.fencing_token != lease.token:
            raise LeaseLostError(
                f"lease {lease.token} on workflow {lease.workflow_id!r} is no longer current"
            )
        return record

    def _check_fence(self, workflow_id: str, fence: Lease | None) -> None:
        if fence is not None:
            if fence.workflow_id != workflow_id:
                raise LeaseLostError(f"lease is for {fence.workflow_id!r}, not {workflow_id!r}")
            self._current(fence)

    def _grant(
        self, record: WorkflowRecord, owner: str, ttl: float, now: datetime, token: int
    ) -> Lease:
        expires = now + timedelta(seconds=ttl)
        # Every change moves updated_at, as in the databases: a sweep's delete checks it.
        self._records[record.workflow_id] = record.model_copy(
            update={
                "lease_owner": owner,
                "lease_expires_at": expires,
                "fencing_token": token,
                "updated_at": now,
            }
        )
        return Lease(
            workflow_id=record.workflow_id, owner=owner, token=token, expires_at=expires, ttl=ttl
        )


async def _yield() -> None:
    """Let other tasks run: anyio's checkpoint, without its backend lookup under asyncio.

    That lookup (sniffio, ~1.4 us) was a twentieth of a small checkpoint's whole cost here;
    anyio's asyncio checkpoint is this ``sleep(0)``.
    """
    if asyncio._get_running_loop() is None:
        await anyio.lowlevel.checkpoint()
    else:
        await asyncio.sleep(0)


def _until(moment: datetime) -> str:
    return json.dumps({"until": moment.isoformat()})


def _expired(record: WorkflowRecord, now: datetime) -> bool:
    return record.lease_expires_at is None or record.lease_expires_at <= now
