"""The read side of the record pipeline: a stored record back to a checkpoint.

:class:`RecordReader` unseals a record when its codec seals, decodes either format version
(a version-1 record on the event loop or, when large, in a worker thread; a version-2 tree
joined in a worker thread, its blobs fetched level by level or, in a store's own thread, all
at once) and restores typed values through the value stage.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Final

import anyio.from_thread
import anyio.to_thread

from ..errors import CheckpointCorruptedError, DecryptionError, EncryptionError, UnknownKeyError
from ..format.header import HEADER_SIZE
from ..format.sealed import is_sealed_tree_record
from ..models import Checkpoint
from ..storage.base import (
    BlobCheckpointStorage,
    BlobFetch,
    BlobReads,
    CheckpointStorage,
    StoredCheckpoint,
)
from .sealing import Sealer, is_sealed_record
from .stages import ValueStage, View
from .tree.v2 import decode_tagged
from .v1 import decode_checkpoint

__all__ = ["RecordReader", "TreeSource", "needs_keys"]

#: Version-1 records up to this size are decoded on the event loop (~0.5 ms), larger ones
#: in a worker thread.
_DECODE_ON_LOOP: Final = 256 * 1024
#: The text hint for values read from texts that hold no tag (see ValueStage.restore).
_UNTAGGED: Final = b""


@dataclass(frozen=True)
class TreeSource:
    """What a partial read of one record's tree needs (:func:`~.tree.peek.peek_state`).

    ``record`` is the plain version-2 record (unsealed, if it was sealed); ``fetch`` gives
    the blobs it names, each unsealed under its name when ``authenticated`` (an encrypted
    tree: no hash to check), as stored otherwise; ``max_bytes`` bounds one read.
    """

    record: bytes
    fetch: Callable[[Collection[bytes]], Awaitable[Mapping[bytes, bytes]]]
    authenticated: bool
    max_bytes: int


class RecordReader:
    """Decodes the records of one storage (the read half of :class:`RecordCodec`).

    ``max_bytes`` bounds a tree's nodes and its rebuilt text; ``sealer``, when given,
    unseals every record (and a sealed record without it is refused, not misread).
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        values: ValueStage,
        sealer: Sealer | None,
        max_bytes: int,
    ) -> None:
        self._storage = storage
        self._values = values
        self.sealer = sealer
        self.max_bytes = max_bytes

    def opener(self) -> Callable[[str, StoredCheckpoint], Awaitable[bytes]] | None:
        """What gives a stored record's plain bytes when this codec seals (None: as stored)."""
        return None if self.sealer is None else self._unsealed

    async def _unsealed(self, workflow_id: str, stored: StoredCheckpoint) -> bytes:
        """The plain record of a stored one: unsealed, or refused when it cannot be."""
        sealer = self.sealer
        if sealer is not None:
            return await sealer.unseal_record(workflow_id, stored.step, stored.data)
        if is_sealed_record(stored.data):
            raise needs_keys(workflow_id, stored.step, "checkpoint")
        return stored.data

    async def decode(
        self, workflow_id: str, stored: StoredCheckpoint, view: View = "typed"
    ) -> Checkpoint:
        """Verify and decode a stored record of either version; ``view`` as in :data:`View`.

        Raises :class:`~aiocheckpoint.CheckpointCorruptedError` for any damage, and
        :class:`~aiocheckpoint.CheckpointTypeError` for a typed value ``view`` cannot give.
        """
        data = stored.data
        sealed_tree = is_sealed_tree_record(data)
        if self.sealer is not None or is_sealed_record(data):
            data = await self._unsealed(workflow_id, stored)
        restore = self._values.restore
        if len(data) > 4 and data[4] == 2:
            # Joining a tree is CPU work (its parse alone ~2 ms per MB): off the loop.
            def decode_tree(fetch: BlobFetch) -> Checkpoint:
                checkpoint, tagged = decode_tagged(
                    data,
                    fetch,
                    workflow_id=workflow_id,
                    step=stored.step,
                    max_bytes=self.max_bytes,
                    authenticated=sealed_tree,
                )
                # The joiner looked at every text the values came from: without a tag in
                # them, no walk (and no re-encoding of the state to look for one).
                return restore(checkpoint, None if tagged else _UNTAGGED, view)

            storage = self._storage
            if not sealed_tree and isinstance(storage, BlobReads):
                # The whole tree read in the store's thread: no hop to the loop per level.
                return await storage.read_blobs_in_thread(decode_tree)
            fetch = self._hopping_fetch(data, sealed_tree, (workflow_id, stored.step))
            return await anyio.to_thread.run_sync(decode_tree, fetch)
        # A version-1 record holds all the values' text: without a tag in it, no walk.
        text = data if len(data) > 4 and data[4] == 1 else None
        decode: Callable[[], Checkpoint]
        if len(data) > _DECODE_ON_LOOP:
            # A large version-1 record: ~2 ms of parsing per MB.
            decode = functools.partial(
                decode_checkpoint, data, workflow_id=workflow_id, step=stored.step
            )
        else:
            checkpoint = decode_checkpoint(data, workflow_id=workflow_id, step=stored.step)
            return self._values.restore(checkpoint, text, view)
        # In a worker thread: the loop gets the GIL back every switch interval instead of
        # waiting for the whole decode.
        return await anyio.to_thread.run_sync(lambda: restore(decode(), text, view))

    async def decode_live(
        self, workflow_id: str, stored: StoredCheckpoint, view: View = "typed"
    ) -> Checkpoint | None:
        """:meth:`decode`; None if a blob is missing because the record was deleted.

        A record deleted after it was read may lose its blobs to garbage collection before
        they are fetched: that is "not found", not corruption.
        """
        try:
            return await self.decode(workflow_id, stored, view)
        except CheckpointCorruptedError:
            data = stored.data
            storage = self._storage
            if len(data) > 4 and data[4] == 2 and isinstance(storage, BlobCheckpointStorage):
                current = await storage.load(workflow_id, stored.step)
                if current is None:
                    return None
                if current.data != data:  # replaced meanwhile: read the new record
                    return await self.decode(workflow_id, current, view)
            raise

    async def tree_source(self, workflow_id: str, stored: StoredCheckpoint) -> TreeSource | None:
        """The plain record and blob fetch a partial read of ``stored`` walks, or None.

        None: the store keeps no blobs, or the record is sealed and this codec has no keys
        (the whole read names it). A sealed record is unsealed first (its errors raised, as
        the whole read raises them: a plaintext one refused unless ``allow_plaintext``);
        its blobs are then fetched and unsealed as the whole read does
        (:meth:`_fetch_sealed`), each authenticated under its keyed name and bound to the
        names it references, so the walk reads nothing the whole read would not accept.
        """
        storage = self._storage
        if not isinstance(storage, BlobCheckpointStorage):
            return None
        data = stored.data
        sealed_tree = is_sealed_tree_record(data)
        if self.sealer is None and is_sealed_record(data):
            return None
        if self.sealer is not None:
            data = await self._unsealed(workflow_id, stored)
        if not sealed_tree:
            return TreeSource(data, storage.fetch_blobs, False, self.max_bytes)
        digest = data[HEADER_SIZE + 4] if len(data) > HEADER_SIZE + 4 else 16
        where = (workflow_id, stored.step)

        async def fetch(hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
            return await self._fetch_sealed(hashes, digest, where)

        return TreeSource(data, fetch, True, self.max_bytes)

    def _hopping_fetch(self, data: bytes, sealed: bool, where: tuple[str, int]) -> BlobFetch:
        """A fetch for a worker thread that asks the event loop for each tree level."""
        # The body's digest size byte (checked when the record is opened).
        digest = data[HEADER_SIZE + 4] if len(data) > HEADER_SIZE + 4 else 16

        def fetch(hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
            if sealed:
                return anyio.from_thread.run(self._fetch_sealed, hashes, digest, where)
            return anyio.from_thread.run(self._fetch_blobs, hashes)

        return fetch

    async def _fetch_blobs(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        if isinstance(self._storage, BlobCheckpointStorage):
            return await self._storage.fetch_blobs(hashes)
        return {}  # a version-2 record in a store without blobs: reported as missing blobs

    async def _fetch_sealed(
        self, hashes: Collection[bytes], digest: int, where: tuple[str, int]
    ) -> Mapping[bytes, bytes]:
        """The blobs of an encrypted tree, each authenticated under its name (or refused).

        A blob that fails raises DecryptionError naming the checkpoint (``where``).
        """
        sealer = self.sealer
        if sealer is None:  # only reached for a record this codec unsealed
            raise EncryptionError("an encrypted tree's blobs need the keys (encryption=)")
        try:
            return await sealer.unseal_blobs(await self._fetch_blobs(hashes), digest)
        except DecryptionError as exc:
            raise type(exc)(exc.reason, workflow_id=where[0], step=where[1]) from exc
        except UnknownKeyError as exc:
            raise exc.located(where[0], where[1]) from None


def needs_keys(workflow_id: str, step: int, what: str) -> EncryptionError:
    """The error for a sealed ``what`` read by a codec without keys."""
    return EncryptionError(
        f"workflow {workflow_id!r} step {step}: the {what} is encrypted; "
        "read it with a manager given its keys (encryption=)"
    )
