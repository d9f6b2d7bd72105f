"""A bounded look into a version-2 tree: one part of a large state, the rest left unread.

:func:`peek_state` reads a record's fields and, of its state, only the nodes on the way to
one value (a path of keys and indexes) and, when that value is a large container, the
chunks that hold the entries asked for: an inspector's page of a 50 MB state reads a few
of its blobs, not the 50 MB. Each node fetched is checked against its hash (the record's
text checksum covers the whole text, which a partial read never rebuilds), or, in an
encrypted tree, authenticated as it is unsealed under its keyed name, so what it shows is
what was written. A value stored in a node of its own that the look did not need is an
:class:`Apart` (its path opens it); a large container is a :class:`Cut`, the entries from
the offset asked for and whether more follow (its length is unknown without reading it).

Finding a key in a large dict reads its chunks in order until the key, one at a time:
time grows with the key's place, memory does not. Records it cannot look into partially
(version 1, a state kept inline, a record still sealed, tagged containers stored apart) return
None: the caller decodes them whole, as before. An encrypted tree is looked into through
its unsealed record and a fetch that unseals each blob
(:meth:`~aiocheckpoint.codec.RecordCodec.tree_source`).
"""

from __future__ import annotations

import hashlib
import secrets
import struct
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ...errors import CheckpointCorruptedError
from ...format.blob import Unwrapper
from ...format.jsonread import loads
from ...format.sealed import is_sealed_tree_record
from ...format.tags import TAG_START, TYPED
from ...format.tree import KIND_LIST, KIND_VALUE, node_refs, record_tree
from ...models import Checkpoint
from ..v1 import build_checkpoint, check_owner

__all__ = [
    "BATCH",
    "Apart",
    "AsyncFetch",
    "Cut",
    "Walker",
    "cut",
    "expanded",
    "open_tree",
    "opened",
    "peek_state",
]

#: Blobs fetched in one round trip while walking an index node's children.
BATCH: Final = 16
_NONCE: Final = secrets.token_hex(16)
AsyncFetch = Callable[[Collection[bytes]], Awaitable[Mapping[bytes, bytes]]]


@dataclass(frozen=True, slots=True)
class Apart:
    """A value stored in a node of its own, not read by this look (its path opens it)."""

    name: str  # the node's hash, in hex


@dataclass(slots=True)
class Cut:
    """Part of a large list or dict: its entries from ``start``, and whether more follow."""

    kind: str  # "list" or "dict"
    start: int
    entries: list[tuple[str | int, Any]] = field(default_factory=list)
    more: bool = False


class _NotHere(Exception):
    """The look cannot go this way: decode the record whole instead."""


def _corrupt(reason: str) -> CheckpointCorruptedError:
    return CheckpointCorruptedError(reason)


class Walker:
    """Fetches and checks one node at a time (or a batch of siblings), within a budget."""

    def __init__(
        self, fetch: AsyncFetch, digest: int, max_bytes: int, authenticated: bool = False
    ) -> None:
        self._fetch = fetch
        #: The size of node names (hash prefixes, or keyed names) in bytes.
        self.digest = digest
        #: Nodes come authenticated under their names (an encrypted tree's, unsealed by
        #: ``fetch``): no hash to check.
        self.authenticated = authenticated
        self.unwrap = Unwrapper(max_bytes)
        #: Bytes fetched so far.
        self.fetched = 0

    async def nodes(self, names: list[bytes]) -> list[bytes]:
        """The nodes ``names`` (one fetch), each unwrapped and checked against its hash."""
        got = await self._fetch(list(dict.fromkeys(names)))
        self.fetched += sum(map(len, got.values()))
        out = []
        for name in names:
            stored = got.get(name)
            if stored is None:
                raise _corrupt(f"missing blob {name.hex()}")
            node = self.unwrap(stored)
            if not self.authenticated and hashlib.sha256(node).digest()[: self.digest] != name:
                raise _corrupt(f"blob {name.hex()} does not match its hash")
            out.append(node)
        return out

    def value(self, node: bytes) -> Any:
        """A value node's JSON, each reference in it an :class:`Apart`."""
        refs = node_refs(node, self.digest)
        base = 5 + len(refs) * (self.digest + 4)
        if len(node) <= base:
            raise _corrupt("empty value node")
        if not refs:
            return loads(node[base:])
        offsets = struct.unpack_from(f">{len(refs)}I", node, base - 4 * len(refs))
        text, pos, apart = bytearray(), base, {}
        for n, (off, ref) in enumerate(zip(offsets, refs, strict=True)):
            at = base + off
            if at < pos or at + 4 > len(node) or node[at : at + 4] != b"null":
                raise _corrupt("reference does not point at a placeholder")
            token = f"\x00aiocheckpoint-peek-{_NONCE}-{n}"
            apart[token] = Apart(ref.hex())
            text += node[pos:at] + b'"\\u0000' + token[1:].encode() + b'"'
            pos = at + 4
        text += node[pos:]
        return _replaced(loads(text), apart)

    async def entries(self, node: bytes) -> AsyncGenerator[tuple[str | int, Any], None]:
        """The entries of an index node's container, in order, a batch of chunks at a time."""
        index = 0
        async for chunk in self.chunks(node):
            if type(chunk) is list:
                for value in chunk:
                    yield index, value
                    index += 1
            else:
                for key, value in chunk.items():
                    yield key, value

    async def chunks(self, node: bytes) -> AsyncGenerator[Any, None]:
        """An index node's chunks (a list's lists, a dict's dicts), in order, a batch at a time."""
        kind = node[0]
        refs = node_refs(node, self.digest)
        if not refs:
            raise _corrupt("empty index node")
        for start in range(0, len(refs), BATCH):
            for child in await self.nodes(refs[start : start + BATCH]):
                if child[0] == kind:
                    async for chunk in self.chunks(child):
                        yield chunk
                    continue
                if child[0] != KIND_VALUE:
                    raise _corrupt("index node of the wrong kind")
                chunk = self.value(child)
                if type(chunk) is not (list if kind == KIND_LIST else dict):
                    raise _corrupt("chunk of the wrong kind")
                yield chunk


def _replaced(value: Any, apart: dict[str, Apart]) -> Any:
    if type(value) is str:
        return apart.get(value, value)
    if type(value) is list:
        return [_replaced(v, apart) for v in value]
    if type(value) is dict:
        return {k: _replaced(v, apart) for k, v in value.items()}
    return value


def open_tree(record: bytes, workflow_id: str, step: int) -> tuple[Checkpoint, int, bytes] | None:
    """A plain tree record's fields (its state left empty), digest size and stored root.

    None for what cannot be walked node by node: version 1, a state kept inline, a sealed
    (encrypted) tree or a record flagged otherwise (the whole read says what it is).
    """
    if is_sealed_tree_record(record) or record[5:6] != b"\x00":
        return None
    tree = record_tree(record)
    if tree is None:
        return None
    meta, digest, root = tree
    meta["state"].pop("text_crc32", None)
    meta["state"]["data"] = {}
    return check_owner(build_checkpoint(meta), workflow_id, step), digest, root


async def peek_state(
    record: bytes,
    fetch: AsyncFetch,
    path: list[str | int],
    offset: int,
    count: int,
    *,
    workflow_id: str,
    step: int,
    max_bytes: int,
    expand: int = 4 << 20,
    authenticated: bool = False,
) -> tuple[Checkpoint, Any] | None:
    """The checkpoint's fields (its state left empty) and the value at ``path``.

    The value is a :class:`Cut` of ``count`` entries from ``offset`` when it is a large
    container, else the value itself. Inside it, values stored apart are read too, in the
    order a page shows them (a large container as a :class:`Cut` of its first ``count``),
    until ``expand`` more bytes were fetched (the last blob may pass it): those left are
    :class:`Apart`. Every blob counts against ``max_bytes`` as the whole read's do, so a
    tree that references one sub-tree many times is refused at the same limit. A ``path``
    that leads nowhere raises ``KeyError``. None: this record cannot be looked into
    partially (module docstring). ``authenticated``: ``record`` is the plain record of an
    encrypted tree and ``fetch`` gives each blob unsealed under its name (or raises), so
    no hash is checked (:meth:`~aiocheckpoint.codec.RecordCodec.tree_source`).
    """
    tree = open_tree(record, workflow_id, step)
    if tree is None:
        return None
    checkpoint, digest, root = tree
    walker = Walker(fetch, digest, max_bytes, authenticated)
    try:
        top = walker.unwrap(root)  # covered by the record's checksum
        value = await _at(walker, walker.value(top) if top[:1] == b"V" else top, path)
        if isinstance(value, bytes):  # an index node: the entries asked for
            value = await cut(walker, value, offset, count)
        elif type(value) is dict and len(value) == 1 and _tagged(value):
            value = await _typed_at(walker, value, offset, count)
        value = await expanded(walker, value, count, walker.fetched + expand)
    except _NotHere:
        return None
    except (ValueError, TypeError, struct.error, RecursionError) as exc:
        raise _corrupt(f"malformed node ({type(exc).__name__})") from exc
    return checkpoint, value


async def _at(walker: Walker, current: Any, path: list[str | int]) -> Any:
    """The value at ``path`` from ``current``; an index node (bytes) where one is reached."""
    current = await opened(walker, current)
    for part in path:
        if isinstance(current, bytes):  # a large container: find the entry
            current = await _find(walker, current, part)
        elif type(current) is dict and len(current) == 1 and _tagged(current):
            raise _NotHere  # a typed container: walked by the whole read
        elif _holds(current, part):
            current = current[part]
        else:
            raise KeyError(part)
        current = await opened(walker, current)
    return current


async def opened(walker: Walker, value: Any) -> Any:
    """``value``, read from its node if it is stored apart (an index node stays bytes)."""
    if not isinstance(value, Apart):
        return value
    [node] = await walker.nodes([bytes.fromhex(value.name)])
    return walker.value(node) if node[0] == KIND_VALUE else node


async def expanded(walker: Walker, value: Any, count: int, until: int) -> Any:
    """``value`` with what is stored apart in it read, while ``walker`` fetched < ``until``."""
    if isinstance(value, Apart):
        if walker.fetched >= until:
            return value
        inside = await opened(walker, value)
        if isinstance(inside, bytes):
            inside = await cut(walker, inside, 0, count)
        return await expanded(walker, inside, count, until)
    if isinstance(value, Cut):
        value.entries = [(k, await expanded(walker, v, count, until)) for k, v in value.entries]
        if value.start == 0 and not value.more:  # read whole after all: the value itself
            entries = value.entries
            return [v for _, v in entries] if value.kind == "list" else dict(entries)
    elif type(value) is list:
        return [await expanded(walker, v, count, until) for v in value]
    elif type(value) is dict:
        return {k: await expanded(walker, v, count, until) for k, v in value.items()}
    return value


async def _typed_at(walker: Walker, value: dict[str, Any], offset: int, count: int) -> Any:
    """A typed container shown: its inside, a :class:`Cut` from ``offset`` when large."""
    [(tag, inner)] = value.items()
    inner = await opened(walker, inner)
    if isinstance(inner, bytes):
        if tag == TYPED:
            raise _NotHere  # a registered value's [name, version, data]: read whole
        inner = await cut(walker, inner, offset, count)
    return {tag: inner}


def _holds(value: Any, part: str | int) -> bool:
    if type(value) is dict:
        return isinstance(part, str) and part in value
    return type(value) is list and type(part) is int and 0 <= part < len(value)


def _tagged(value: dict[str, Any]) -> bool:
    key = next(iter(value))
    return isinstance(key, str) and key.startswith(TAG_START)


async def _find(walker: Walker, node: bytes, part: str | int) -> Any:
    async for key, value in walker.entries(node):
        if key == part:
            return value
    raise KeyError(part)


async def cut(walker: Walker, node: bytes, offset: int, count: int) -> Cut:
    """``count`` entries of an index node's container from ``offset``, and whether more follow."""
    part = Cut("list" if node[0] == KIND_LIST else "dict", offset)
    entries = walker.entries(node)
    async for entry in entries:
        if offset:
            offset -= 1
            continue
        if len(part.entries) == count:
            part.more = True
            break
        part.entries.append(entry)
    await entries.aclose()
    return part
