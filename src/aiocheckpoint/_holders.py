"""The leases this process holds, so that one owner name is never granted a lease twice.

A store grants a lease again to the owner that already holds it (so that a runner restarted
under its old name takes its own lease back). Inside one process that is a trap: two tasks
using one owner name would both believe they drive the workflow. :class:`LocalHolders`
remembers, per storage object, which owner holds which workflow's lease here and until when,
and refuses a second acquirer with :class:`~aiocheckpoint.LeaseHeldError` while the first
holder's lease is live (granted or renewed less than its TTL ago).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

from .errors import LeaseHeldError
from .leases import Lease

__all__ = ["LocalHolders"]


@dataclass(slots=True)
class _Held:
    owner: str
    token: int | None  # None: being acquired
    deadline: float  # time.monotonic() after which the holder is presumed gone


class LocalHolders:
    """Live leases held in this process, by storage object and workflow id."""

    def __init__(self) -> None:
        self._stores: weakref.WeakKeyDictionary[object, dict[str, _Held]] = (
            weakref.WeakKeyDictionary()
        )

    def _held(self, store: object) -> dict[str, _Held]:
        held = self._stores.get(store)
        if held is None:
            held = self._stores[store] = {}
        return held

    def reserve(self, store: object, workflow_id: str, owner: str) -> None:
        """Claim the right to acquire; LeaseHeldError while ``owner`` holds it live here."""
        held = self._held(store)
        current = held.get(workflow_id)
        if current is not None and time.monotonic() < current.deadline:
            if current.owner == owner:
                raise LeaseHeldError(
                    f"workflow {workflow_id!r}: its lease is held by {owner!r} in this process "
                    "already; give each concurrent holder its own owner name"
                )
            return  # another owner's: the store decides (and refuses while it is live)
        held[workflow_id] = _Held(owner, None, float("inf"))

    def cancel(self, store: object, workflow_id: str, owner: str) -> None:
        """Forget a reservation whose acquisition failed."""
        held = self._held(store)
        current = held.get(workflow_id)
        if current is not None and current.owner == owner and current.token is None:
            del held[workflow_id]

    def granted(self, store: object, lease: Lease) -> None:
        """Remember a lease granted (or renewed) to this process."""
        deadline = time.monotonic() + lease.ttl
        self._held(store)[lease.workflow_id] = _Held(lease.owner, lease.token, deadline)

    def renewed(self, store: object, lease: Lease) -> None:
        """Extend the holder's deadline, if ``lease`` is still the one held here."""
        current = self._held(store).get(lease.workflow_id)
        if current is not None and current.token == lease.token:
            self.granted(store, lease)

    def dropped(self, store: object, lease: Lease) -> None:
        """Forget ``lease`` (released or lost), if it is still the one held here."""
        held = self._held(store)
        current = held.get(lease.workflow_id)
        if current is not None and current.token == lease.token:
            del held[lease.workflow_id]
