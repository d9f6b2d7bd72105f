"""Version-2 records: the checkpoint's fields in the record, its state in a tree of blobs.

The record layout is :mod:`aiocheckpoint.format.tree`'s; the state is cut by
:mod:`aiocheckpoint.codec.tree.split` and rebuilt by :mod:`aiocheckpoint.codec.tree.join`. The
decoders here read records of both format versions.
"""

from __future__ import annotations

from collections.abc import Collection, Generator
from typing import Any

from ...errors import CheckpointCorruptedError, CheckpointSerializationError
from ...format.checksum import crc32
from ...format.header import FORMAT_VERSION_2, HEADER, MAGIC, record_format_version
from ...format.limits import DEFAULT_MAX_RECORD_BYTES
from ...format.tree import (
    DEFAULT_PARAMS,
    V2_PREFIX,
    SplitMemory,
    SplitResult,
    TreeParams,
    open_record_v2,
)
from ...models import Checkpoint
from ..jsonwrite import dumps
from ..sizes import exceeds
from ..sliced import Job, finish
from ..typed import has_tags
from ..v1 import build_checkpoint, check_owner, decode_checkpoint
from .join import AsyncFetch, Fetch, Joiner, Steps, adrive, drive, guard
from .split import split_work

__all__ = [
    "adecode_checkpoint_v2",
    "decode_checkpoint_v2",
    "decode_tagged",
    "encode_checkpoint_v2",
    "encode_v2_work",
    "record_v2",
    "rehomed_record",
]


def _corrupt(reason: str) -> CheckpointCorruptedError:
    return CheckpointCorruptedError(reason)


def _meta(checkpoint: Checkpoint) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "workflow_id": checkpoint.workflow_id,
        "step": checkpoint.step,
        "agent_id": checkpoint.agent_id,
        "status": checkpoint.status.value,
        "timestamp": checkpoint.timestamp.isoformat(),
        "metrics": checkpoint.metrics.model_dump(mode="json"),
        "metadata": checkpoint.metadata,
        "state": {
            "version": checkpoint.state_snapshot.version.model_dump(mode="json"),
            "metadata": checkpoint.state_snapshot.metadata,
        },
    }
    if checkpoint.app_version is not None:
        meta["app_version"] = checkpoint.app_version
    return meta


def _record(meta_bytes: bytes, digest: int, root: bytes) -> bytes:
    body = b"".join((V2_PREFIX.pack(len(meta_bytes), digest), meta_bytes, root))
    return HEADER.pack(MAGIC, FORMAT_VERSION_2, 0, 0, len(body), crc32(body)) + body


def rehomed_record(meta: dict[str, Any], digest: int, root: bytes, workflow_id: str) -> bytes:
    """A version-2 record of ``meta`` (from :func:`open_record_v2`) for ``workflow_id``."""
    return _record(_meta_bytes({**meta, "workflow_id": workflow_id}), digest, root)


def _meta_bytes(meta: dict[str, Any]) -> bytes:
    try:
        return dumps(meta, False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise CheckpointSerializationError("checkpoint", str(exc)) from exc


def encode_checkpoint_v2(
    checkpoint: Checkpoint,
    params: TreeParams = DEFAULT_PARAMS,
    *,
    known: Collection[bytes] = (),
    finite: bool = False,
    previous: SplitMemory | None = None,
    max_bytes: int | None = None,
) -> tuple[bytes, SplitResult]:
    """Encode a checkpoint as a version-2 record plus the blobs its state needs.

    A checkpoint whose JSON (state included) fits in ``params.root_inline_limit`` bytes is
    stored whole in the record, with no blobs and no root (``result.root == b""``).
    Otherwise the caller must make every blob in ``result.blobs`` durable before the
    record (see docs/incremental.md). The state must already be storable; ``finite``,
    ``previous`` and ``max_bytes`` are as in :func:`~aiocheckpoint.codec.tree.split.split_state`.
    """
    return finish(
        encode_v2_work(
            checkpoint, params, known=known, finite=finite, previous=previous, max_bytes=max_bytes
        )
    )


def encode_v2_work(
    checkpoint: Checkpoint,
    params: TreeParams = DEFAULT_PARAMS,
    *,
    known: Collection[bytes] = (),
    finite: bool = False,
    previous: SplitMemory | None = None,
    max_bytes: int | None = None,
) -> Generator[Job | None, Any, tuple[bytes, SplitResult]]:
    """:func:`encode_checkpoint_v2` as a generator that yields between slices of work.

    With ``finite=True`` each slice is ~0.1-0.2 ms of CPU, so an event loop can run the
    encoding itself, resuming the generator between its other callbacks, instead of
    handing it to a thread that would hold the GIL against the loop. Without ``finite`` the
    exact encoder runs in one slice.
    """
    meta = _meta(checkpoint)
    data = checkpoint.state_snapshot.data
    limit = params.root_inline_limit
    if limit and not exceeds(data, limit):
        meta["state"]["data"] = data
        meta_bytes = _meta_bytes(meta)
        if len(meta_bytes) <= limit:
            return _record(meta_bytes, params.digest_size, b""), SplitResult(b"", {}, {}, ())
        del meta["state"]["data"]
    split = yield from split_work(
        data, params, known, previous, inline=False, finite=finite, max_bytes=max_bytes
    )
    return record_v2(checkpoint, params, split, meta), split


def record_v2(
    checkpoint: Checkpoint,
    params: TreeParams,
    split: SplitResult,
    meta: dict[str, Any] | None = None,
) -> bytes:
    """The version-2 record of ``checkpoint`` whose state was cut into ``split``."""
    if meta is None:
        meta = _meta(checkpoint)
    if split.text_crc is not None:
        meta["state"]["text_crc32"] = split.text_crc
    return _record(_meta_bytes(meta), params.digest_size, split.root)


def _decode_steps(
    record: bytes, max_bytes: int, tagged: list[bool], authenticated: bool = False
) -> Steps[Checkpoint]:
    """The read of ``record``; appends to ``tagged`` whether its texts may hold a tag."""
    if record_format_version(record) == 1:
        tagged.append(has_tags(record))
        return decode_checkpoint(record)
    meta, digest, root = open_record_v2(record)
    text_crc = meta["state"].pop("text_crc32", None)
    if text_crc is not None and (type(text_crc) is not int or not 0 <= text_crc <= 0xFFFFFFFF):
        raise _corrupt("malformed text checksum")
    found = has_tags(record)  # the fields, and a state kept inline
    if root:
        joiner = Joiner(digest, max_bytes, authenticated)
        meta["state"]["data"] = yield from joiner.steps(root, text_crc)
        found = found or joiner.tagged
    tagged.append(found)
    return build_checkpoint(meta)


def _checked(
    steps: Steps[Checkpoint], workflow_id: str | None, step: int | None
) -> Steps[Checkpoint]:
    try:
        checkpoint = yield from guard(steps)
    except CheckpointCorruptedError as exc:  # DecryptionError (a blob's) keeps its type
        raise type(exc)(exc.reason, workflow_id=workflow_id, step=step) from exc
    return check_owner(checkpoint, workflow_id, step)


def decode_checkpoint_v2(
    record: bytes,
    fetch: Fetch,
    *,
    workflow_id: str | None = None,
    step: int | None = None,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    authenticated: bool = False,
) -> Checkpoint:
    """Decode a record of format version 1 or 2, fetching blobs one tree level at a time.

    Any damage -- to the record, a missing blob, a blob that fails its hash or a state text
    that fails the record's checksum (``state.text_crc32``, which then replaces the leaves'
    hashes) -- raises :class:`CheckpointCorruptedError`, naming the damaged blob when one
    is, as does a record of another workflow or step, and a tree whose nodes or whose
    rebuilt text would be longer than ``max_bytes`` (the store's ``max_record_bytes``).
    ``fetch`` is not called for version-1 records or states stored inline.
    ``authenticated=True`` says ``fetch`` returns only blobs it authenticated (unsealed
    under their keyed names): their names are then not checked against hashes.
    """
    return decode_tagged(
        record,
        fetch,
        workflow_id=workflow_id,
        step=step,
        max_bytes=max_bytes,
        authenticated=authenticated,
    )[0]


def decode_tagged(
    record: bytes,
    fetch: Fetch,
    *,
    workflow_id: str | None = None,
    step: int | None = None,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    authenticated: bool = False,
) -> tuple[Checkpoint, bool]:
    """:func:`decode_checkpoint_v2`, and whether the texts read may hold a typed value's tag.

    When they hold none (False), the values need no walk to be restored
    (:meth:`~aiocheckpoint.codec.stages.ValueStage.restore` with an empty text).
    """
    tagged: list[bool] = []
    steps = _checked(_decode_steps(record, max_bytes, tagged, authenticated), workflow_id, step)
    return drive(steps, fetch), tagged[0]


async def adecode_checkpoint_v2(
    record: bytes,
    fetch: AsyncFetch,
    *,
    workflow_id: str | None = None,
    step: int | None = None,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Checkpoint:
    """:func:`decode_checkpoint_v2` with an async ``fetch`` (one await per tree level)."""
    steps = _checked(_decode_steps(record, max_bytes, []), workflow_id, step)
    return await adrive(steps, fetch)
