"""Workflow records, leases and claims: what the manager asks of a :class:`WorkflowStorage`.

:class:`WorkflowRecords` checks the arguments and makes the storage calls;
:class:`WorkflowRecordMethods` is the part of :class:`~aiocheckpoint.CheckpointManager`'s
API that delegates to it (``docs/leases.md``). The types these calls take and return (a
workflow record, a lease, a retry policy) are defined in :mod:`aiocheckpoint.leases`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from . import control, history
from ._holders import LocalHolders
from ._telemetry import round_trip, traced
from ._validation import (
    check_agent_status,
    check_text,
    check_workflow_id,
    check_workflow_status,
)
from .codec import FieldSealer
from .errors import InvalidArgumentError, LeaseLostError, UnsupportedOperationError
from .history import WorkflowEvent
from .leases import (
    WORKFLOW_KIND,
    Lease,
    Page,
    RetryPolicy,
    WorkflowRecord,
    WorkflowStatus,
    check_ttl,
    fence_token,
)
from .models import AgentStatus
from .storage.base import CheckpointStorage, EffectStorage, WorkflowStorage
from .storage.queries import build_query, encode_cursor, json_text

__all__ = ["WorkflowRecordMethods", "WorkflowRecords", "check_owner"]

#: The leases held in this process, shared by every manager.
_HOLDERS = LocalHolders()


def check_owner(value: Any) -> str:
    """A lease owner: a non-empty ``str`` of at most 255 UTF-8 bytes."""
    owner = check_text(value, "lease owner")
    if not owner or len(owner.encode("utf-8")) > 255:
        raise InvalidArgumentError("a lease owner must be a non-empty str of at most 255 bytes")
    return owner


class WorkflowRecords:
    """The workflow records and leases of one storage, for one manager.

    ``check_open`` raises once the manager is closed; every call makes it first.
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        check_open: Callable[[], None],
        fields: FieldSealer | None = None,
    ) -> None:
        #: The manager's storage (what the spans of the traced calls name).
        self.storage = storage
        #: Seals and opens the record's and the events' sealed fields (encrypted stores).
        self.fields = FieldSealer(None) if fields is None else fields
        self._storage = storage
        self._check_open = check_open
        #: Whether the storage keeps workflow records and leases (checked once).
        self.supported = isinstance(storage, WorkflowStorage)

    def workflow_storage(self) -> WorkflowStorage:
        """The storage, as a :class:`WorkflowStorage`; UnsupportedOperationError if it is not."""
        if not isinstance(self._storage, WorkflowStorage):
            raise UnsupportedOperationError(
                f"{type(self._storage).__name__} keeps no workflow records or leases; "
                "use a backend that does (in-memory, SQLite or PostgreSQL)"
            )
        return self._storage

    async def get(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow's record, or None."""
        self._check_open()
        record = await self.workflow_storage().get_workflow(check_workflow_id(workflow_id))
        return None if record is None else await self.fields.open_record(record)

    async def list_ids(
        self, status: Any, filters: tuple[Any, ...], in_doubt: Any, kind: Any
    ) -> list[str]:
        """``list_workflows``: every id with checkpoints, or a page of records' ids."""
        self._check_open()
        agent_status, metadata, updated_after, updated_before, limit, cursor = filters
        if status is None and all(f is None for f in filters) and kind in (WORKFLOW_KIND, None):
            if in_doubt is None:
                return await self._storage.list_workflows()
            return Page(await self._in_doubt_ids(in_doubt))
        page = await self.query(
            status,
            agent_status,
            metadata,
            (updated_after, updated_before),
            limit,
            cursor,
            in_doubt,
            kind,
        )
        return Page([record.workflow_id for record in page], page.next_cursor)

    async def _in_doubt_ids(self, in_doubt: object) -> list[str]:
        if not isinstance(in_doubt, bool):
            raise InvalidArgumentError(f"in_doubt must be a bool or None: {in_doubt!r}")
        if not isinstance(self._storage, EffectStorage):
            raise UnsupportedOperationError(
                f"{type(self._storage).__name__} keeps no effect journal (docs/effects.md)"
            )
        doubtful = await self._storage.in_doubt_workflows()
        if in_doubt:
            return doubtful
        skip = set(doubtful)
        return [wf for wf in await self._storage.list_workflows() if wf not in skip]

    async def query(
        self,
        status: Any,
        agent_status: Any,
        metadata: Any,
        updated: tuple[Any, Any],
        limit: Any,
        cursor: Any,
        in_doubt: Any,
        kind: Any,
    ) -> Page[WorkflowRecord]:
        """``list_workflow_records``: one page of the records the filters match."""
        self._check_open()
        wanted = None if status is None else check_workflow_status(status)
        agent = None if agent_status is None else check_agent_status(agent_status).value
        query = build_query(wanted, agent, metadata, updated, limit, cursor, in_doubt, kind)
        records = await self.workflow_storage().query_workflow_records(query)
        if self.fields.sealing:
            records = [await self.fields.open_record(record) for record in records]
        full = limit is not None and len(records) == limit
        return Page(records, encode_cursor(records[-1].workflow_id) if full else None)

    async def register(self, workflow_id: str, metadata: Any) -> WorkflowRecord:
        """``register_workflow``: an UNFINISHED record for a workflow that has none."""
        self._check_open()
        storage = self.workflow_storage()
        workflow_id = check_workflow_id(workflow_id)
        meta = None if metadata is None else _metadata_text(metadata)
        record = await storage.register_workflow(workflow_id, metadata=meta)
        return await self.fields.open_record(record)

    async def resume(self, workflow_id: str, input: Any) -> WorkflowRecord:
        """``resume_workflow``: a PAUSED workflow UNFINISHED again, with ``input``."""
        self._check_open()
        storage = self.workflow_storage()
        workflow_id = check_workflow_id(workflow_id)
        json_text(input, "resume input")  # checked as it is, before it is sealed
        sealed = await self.fields.seal_resume(workflow_id, input)
        record = await storage.resume_workflow(workflow_id, json_text(sealed, "resume input"))
        return await self.fields.open_record(record)

    async def events(
        self, workflow_id: str, limit: int | None, cursor: str | None
    ) -> Page[WorkflowEvent]:
        """The workflow's events, oldest first (:func:`aiocheckpoint.history.get_events`)."""
        self._check_open()
        return await history.get_events(
            self._storage, check_workflow_id(workflow_id), limit, cursor, self.fields
        )

    async def cancel(self, workflow_id: str, reason: str | None) -> WorkflowRecord:
        """``cancel_workflow`` (:func:`aiocheckpoint.control.cancel`)."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        checked = control.check_reason(reason)
        if checked is not None:
            checked = await self.fields.seal_reason(workflow_id, checked)
        record = await control.cancel(self._storage, workflow_id, checked)
        return await self.fields.open_record(record)

    async def retry(self, workflow_id: str) -> WorkflowRecord:
        """``retry_workflow`` (:func:`aiocheckpoint.control.retry`)."""
        self._check_open()
        record = await control.retry(self._storage, check_workflow_id(workflow_id))
        return await self.fields.open_record(record)

    @traced("record_failure")
    async def record_failure(
        self, workflow_id: str, error: Any, retry: Any, lease: Lease | None
    ) -> WorkflowRecord:
        """``record_failure``: a failed run counted, its error stored."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        if not isinstance(error, BaseException):
            raise InvalidArgumentError(f"error must be an exception, not {type(error).__name__}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidArgumentError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        if lease is not None:
            fence_token(lease, workflow_id)
        fields = await self.fields.seal_error(workflow_id, _error_fields(error))
        text = json_text(fields, "error")
        delays = tuple(retry.delays()) if retry is not None and retry.retryable(error) else ()
        record = await round_trip(
            self.workflow_storage().record_failure,
            workflow_id,
            text,
            retry_delays=delays,
            fence=lease,
        )
        return await self.fields.open_record(record)

    @traced("mark_workflow")
    async def mark(self, workflow_id: str, status: Any, lease: Lease | None) -> WorkflowRecord:
        """``mark_workflow``: the workflow's status set."""
        self._check_open()
        workflow_id = check_workflow_id(workflow_id)
        if lease is not None:
            fence_token(lease, workflow_id)
        record = await round_trip(
            self.workflow_storage().set_workflow_status,
            workflow_id,
            control.markable(check_workflow_status(status)),
            fence=lease,
        )
        return await self.fields.open_record(record)

    @traced("acquire_lease", acquires=True)
    async def acquire(self, workflow_id: str, owner: str, ttl: float) -> Lease:
        """``acquire_lease``: the workflow's lease for ``owner``."""
        self._check_open()
        workflow_id, owner = check_workflow_id(workflow_id), check_owner(owner)
        ttl, storage = check_ttl(ttl), self.workflow_storage()
        # One owner name never holds a lease twice at once in this process (see _holders).
        _HOLDERS.reserve(storage, workflow_id, owner)
        try:
            lease = await round_trip(storage.acquire_lease, workflow_id, owner, ttl)
        except BaseException:
            _HOLDERS.cancel(storage, workflow_id, owner)
            raise
        _HOLDERS.granted(storage, lease)
        return lease

    @traced("renew_lease")
    async def renew(self, lease: Lease, ttl: float) -> Lease:
        """``renew_lease``: the lease extended, or LeaseLostError."""
        self._check_open()
        storage = self.workflow_storage()
        try:
            renewed = await round_trip(storage.renew_lease, lease, check_ttl(ttl))
        except LeaseLostError:
            _HOLDERS.dropped(storage, lease)
            raise
        _HOLDERS.renewed(storage, renewed)
        return renewed

    @traced("release_lease")
    async def release(self, lease: Lease) -> None:
        """``release_lease``: the lease given up."""
        self._check_open()
        await round_trip(self.workflow_storage().release_lease, lease)
        _HOLDERS.dropped(self._storage, lease)

    @traced("claim_workflow", acquires=True)
    async def claim(self, owner: str, ttl: float, retry: Any) -> Lease | None:
        """``claim_workflow``: the lease of the next claimable workflow, or None."""
        self._check_open()
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidArgumentError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        lease = await round_trip(
            self.workflow_storage().claim_next_workflow, check_owner(owner), check_ttl(ttl)
        )
        if lease is None:
            return None
        _HOLDERS.granted(self._storage, lease)
        return lease if retry is None else lease.model_copy(update={"retry": retry})


class WorkflowRecordMethods:
    """:class:`~aiocheckpoint.CheckpointManager`'s workflow records, leases and claims."""

    _records: WorkflowRecords

    async def list_workflows(
        self,
        status: WorkflowStatus | str | None = None,
        *,
        agent_status: AgentStatus | str | None = None,
        metadata: Mapping[str, Any] | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        in_doubt: bool | None = None,
        kind: str | None = WORKFLOW_KIND,
    ) -> list[str]:
        """Every workflow id that has at least one checkpoint, sorted (of every kind).

        With ``status`` (for example ``"unfinished"``, what a runner resumes after a
        restart, or ``"paused"``, what waits for a human), any other filter of
        :meth:`list_workflow_records` or a ``kind`` other than ``"workflow"``, the ids of
        the matching workflow records instead, of ``kind`` only (``"workflow"`` by default:
        no LangGraph thread; None: every kind), as a :class:`~aiocheckpoint.Page`, whose
        ``next_cursor`` continues it; this needs a backend with workflow records.
        ``in_doubt=True`` alone lists, on any backend with an effect journal, every
        workflow with an effect in doubt (as :meth:`list_in_doubt_workflows`);
        ``in_doubt=False`` alone, the workflows with checkpoints and no effect in doubt.
        """
        filters = (agent_status, metadata, updated_after, updated_before, limit, cursor)
        return await self._records.list_ids(status, filters, in_doubt, kind)

    async def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """The workflow's record (status, timestamps, lease), or None if it has none."""
        return await self._records.get(workflow_id)

    async def list_workflow_records(
        self,
        status: WorkflowStatus | str | None = None,
        *,
        agent_status: AgentStatus | str | None = None,
        metadata: Mapping[str, Any] | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        in_doubt: bool | None = None,
        kind: str | None = WORKFLOW_KIND,
    ) -> Page[WorkflowRecord]:
        """Workflow records ordered by id, filtered, one page at a time.

        Only records of ``kind`` are listed: by default ``"workflow"``, those runners drive
        (a LangGraph thread's record, of kind ``"langgraph"``, is not); None lists every
        kind. Filters (all optional, combined with AND): the workflow ``status``; the
        ``agent_status`` of its latest step (e.g. ``"blocked"``); ``metadata`` equality on
        each given top-level key; ``updated_after`` / ``updated_before`` (exclusive,
        aware datetimes); ``in_doubt`` True, only the workflows with an effect in doubt
        (``docs/effects.md``), False only those without. ``limit`` (1-10,000) caps the
        page; pass the returned page's ``next_cursor`` as ``cursor`` for the next one
        (None: it was the last). On SQLite and PostgreSQL a page filtered by status, agent
        status or a metadata key is an index walk: it costs about the page, however many
        workflows the store holds. Records only: a workflow killed in its first step,
        before any checkpoint and without a lease, has no record, and only
        :meth:`list_in_doubt_workflows` (or ``list_workflows(in_doubt=True)``) lists it.
        """
        updated = (updated_after, updated_before)
        return await self._records.query(
            status, agent_status, metadata, updated, limit, cursor, in_doubt, kind
        )

    async def register_workflow(
        self, workflow_id: str, *, metadata: Mapping[str, Any] | None = None
    ) -> WorkflowRecord:
        """Create an UNFINISHED record for a workflow that has none; return its record.

        Runners can then claim it with :meth:`claim_workflow` before any checkpoint exists.
        ``metadata`` (a JSON object: tenant, user, kind...) replaces the record's metadata,
        which :meth:`list_workflow_records` filters on.
        """
        return await self._records.register(workflow_id, metadata)

    async def resume_workflow(self, workflow_id: str, input: Any = None) -> WorkflowRecord:
        """Make a PAUSED workflow claimable again, delivering ``input`` to its next run.

        ``input`` (any JSON value) is stored with the workflow record in the same
        transaction that makes it UNFINISHED, so it survives a crash before the next run;
        that run reads it as :attr:`ResumableWorkflow.resume_input`, and it is cleared by
        the first checkpoint the run writes. A workflow that is not paused raises
        :class:`~aiocheckpoint.InvalidArgumentError`; an unknown one
        :class:`~aiocheckpoint.CheckpointNotFoundError`.
        """
        return await self._records.resume(workflow_id, input)

    async def get_events(
        self, workflow_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[WorkflowEvent]:
        """The workflow's events, oldest first: :mod:`aiocheckpoint.history`.

        Paged as :meth:`list_workflow_records` is: ``limit`` of them after ``cursor``.
        """
        return await self._records.events(workflow_id, limit, cursor)

    async def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> WorkflowRecord:
        """Cancel an UNFINISHED or PAUSED workflow: CANCELLED, ``reason`` in ``last_error``.

        Its runner stops at its next step boundary or ``wf.effect`` call with
        :class:`~aiocheckpoint.WorkflowCancelledError`; see :mod:`aiocheckpoint.control`.
        """
        return await self._records.cancel(workflow_id, reason)

    async def retry_workflow(self, workflow_id: str) -> WorkflowRecord:
        """Make a FAILED or CANCELLED workflow claimable again, with attempts back to 0.

        Any other status raises :class:`~aiocheckpoint.InvalidArgumentError`; a runner
        holding its lease :class:`~aiocheckpoint.LeaseHeldError` (:mod:`aiocheckpoint.control`).
        """
        return await self._records.retry(workflow_id)

    async def record_failure(
        self,
        workflow_id: str,
        error: BaseException,
        *,
        retry: RetryPolicy | None = None,
        lease: Lease | None = None,
    ) -> WorkflowRecord:
        """Count a failed run of the workflow and store its error (``type`` and ``message``).

        With a ``retry`` policy that finds ``error`` retryable and attempts left, the
        workflow goes back to UNFINISHED and no runner can claim it before the policy's
        backoff has elapsed (by the storage's clock); otherwise it is FAILED, with the final
        error on its record. ``ResumableWorkflow`` calls this when its block raises.
        """
        return await self._records.record_failure(workflow_id, error, retry, lease)

    async def mark_workflow(
        self,
        workflow_id: str,
        status: WorkflowStatus | str,
        *,
        lease: Lease | None = None,
    ) -> WorkflowRecord:
        """Set the workflow's status (fenced by ``lease`` when given)."""
        return await self._records.mark(workflow_id, status, lease)

    async def acquire_lease(self, workflow_id: str, owner: str, ttl: float = 30.0) -> Lease:
        """Take the workflow's lease for ``ttl`` seconds.

        Raises :class:`~aiocheckpoint.LeaseHeldError` while another owner's lease is live.
        """
        return await self._records.acquire(workflow_id, owner, ttl)

    async def renew_lease(self, lease: Lease, ttl: float = 30.0) -> Lease:
        """Extend a lease to ``ttl`` seconds from now; ``LeaseLostError`` if taken over."""
        return await self._records.renew(lease, ttl)

    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up; releasing a lease that was taken over does nothing."""
        await self._records.release(lease)

    async def claim_workflow(
        self, owner: str, ttl: float = 30.0, *, retry: RetryPolicy | None = None
    ) -> Lease | None:
        """Lease the next unfinished workflow whose lease is free or expired, or return None.

        Claims are atomic: concurrent runners never get the same workflow. Paused workflows,
        those whose retry backoff has not elapsed and records of another kind than
        ``"workflow"`` (LangGraph threads) are never handed out. ``retry`` is the
        pool's :class:`~aiocheckpoint.RetryPolicy`: it travels with the lease, and a
        ``ResumableWorkflow`` driving it retries a failed run by it.
        """
        return await self._records.claim(owner, ttl, retry)

    def supports_workflow_records(self) -> bool:
        """Whether the storage keeps workflow records and leases."""
        return self._records.supported


def _metadata_text(metadata: Any) -> str:
    if not isinstance(metadata, Mapping):
        raise InvalidArgumentError(f"metadata must be a mapping, not {type(metadata).__qualname__}")
    if not all(isinstance(key, str) for key in metadata):
        raise InvalidArgumentError("metadata keys must be str")
    return json_text(dict(metadata), "metadata")


def _error_fields(error: BaseException) -> dict[str, str]:
    # Bounded: a huge message must not make every record read large.
    return {"type": type(error).__qualname__, "message": str(error)[:4000]}
