"""The manager's partial reads of a large state: a look at one value, a diff of two steps.

For tools that show a store (the command line's ``diff``, the web inspector): an
incremental record's tree is walked node by node (:func:`~aiocheckpoint.codec.peek_state`,
:func:`~aiocheckpoint.codec.diff_trees`) instead of read whole. An encrypted tree is walked
as well when the manager holds its keys: its record is unsealed as the whole read unseals
it, and each blob fetched is unsealed under its keyed name (authenticated, bound to the
names it references) before the walk reads it; a blob that does not authenticate raises
:class:`~aiocheckpoint.DecryptionError`, one under a key the manager lacks
:class:`~aiocheckpoint.UnknownKeyError`, as the whole read does. Records that cannot be
walked give None: the caller reads them whole.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from ._validation import check_workflow_id
from .codec import RecordCodec, TreeSource, diff_trees, peek_state
from .errors import InvalidArgumentError
from .format.statediff import Change
from .models import Checkpoint
from .storage.base import StoredCheckpoint

__all__ = ["PartialReadMethods"]


class PartialReadMethods:
    """:class:`~aiocheckpoint.CheckpointManager`'s partial reads of stored records."""

    _partial: RecordCodec

    async def peek_record(
        self,
        workflow_id: str,
        stored: StoredCheckpoint,
        path: list[str | int],
        offset: int,
        count: int,
        *,
        expand: int = 4 << 20,
    ) -> tuple[Checkpoint, Any] | None:
        """A stored record's fields (its state left empty) and its state's value at ``path``.

        Reads the nodes on the way to the value and, when it is a large container, the
        chunks of ``count`` entries from ``offset`` (a :class:`~aiocheckpoint.codec.Cut`);
        values stored apart inside it are read until ``expand`` more bytes were fetched
        (those left are :class:`~aiocheckpoint.codec.Apart`). Values are in their stored
        (tagged JSON) form. None: the record cannot be looked into partially (version 1, a
        state kept inline, an encrypted record and no keys): decode it whole
        (:meth:`decode_record`). A ``path`` the state does not hold raises
        :class:`~aiocheckpoint.InvalidArgumentError`; damage
        :class:`~aiocheckpoint.CheckpointCorruptedError`.
        """
        workflow_id = check_workflow_id(workflow_id)
        source = await self._partial.tree_source(workflow_id, stored)
        if source is None:
            return None
        try:
            return await peek_state(
                source.record,
                source.fetch,
                path,
                offset,
                count,
                workflow_id=workflow_id,
                step=stored.step,
                max_bytes=source.max_bytes,
                expand=expand,
                authenticated=source.authenticated,
            )
        except KeyError as exc:
            raise InvalidArgumentError(f"no {exc.args[0]!r} in this state") from None

    async def diff_records(
        self,
        workflow_id: str,
        old: StoredCheckpoint | None,
        new: StoredCheckpoint,
        *,
        atomic: Callable[[Any], bool] | None = None,
        expand: int | None = None,
        count: int = 300,
        offset: int = 0,
    ) -> AsyncIterator[Change] | None:
        """The changes from record ``old`` (None: an empty state) to record ``new``.

        The changes :func:`~aiocheckpoint.format.statediff.iter_changes` yields for the two
        states in their stored form, in its order, read only where the trees differ
        (:func:`~aiocheckpoint.codec.diff_trees`, whose ``atomic``, ``expand``, ``count``
        and ``offset`` these are). None: the records cannot be walked together (either not
        a tree, an encrypted one and no keys, one encrypted tree and one plain): diff
        the states read whole. A part that does not hold what its name says, or does not
        authenticate, raises :class:`~aiocheckpoint.CheckpointCorruptedError` as the walk
        reaches it; parts both trees share are not read, so not checked.
        """
        workflow_id = check_workflow_id(workflow_id)
        codec = self._partial
        new_source = await codec.tree_source(workflow_id, new)
        old_source: TreeSource | None = None
        if old is not None:
            old_source = await codec.tree_source(workflow_id, old)
            if old_source is None:
                return None
        if new_source is None or (
            old_source is not None and old_source.authenticated != new_source.authenticated
        ):
            return None
        return diff_trees(
            None if old_source is None else old_source.record,
            new_source.record,
            new_source.fetch,
            workflow_id=workflow_id,
            old_step=None if old is None else old.step,
            step=new.step,
            max_bytes=new_source.max_bytes,
            atomic=atomic,
            expand=expand,
            count=count,
            offset=offset,
            authenticated=new_source.authenticated,
        )
