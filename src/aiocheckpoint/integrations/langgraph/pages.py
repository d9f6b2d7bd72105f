"""Long list channels in pages: what makes a step's cost independent of the list's length.

A list of more than :data:`PAGE_ITEMS` items is stored as its full pages, by content hash,
plus the items after the last full page. A page is a record of the thread's pages workflow
(``keys.pages_workflow``), written once; a checkpoint references it by hash. Appending to a
list therefore writes, per step, the new items and a list of page hashes, never the items of
the full pages again, and a checkpoint's encoding handles ~``PAGE_ITEMS`` items plus one
hash per page.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from ...errors import CheckpointCorruptedError

__all__ = [
    "PAGE_ITEMS",
    "PageHash",
    "hashes_of",
    "keyed_page_hash",
    "page_hash",
    "paginate",
    "referenced",
    "unpage",
]

#: Items per page.
PAGE_ITEMS: Final = 64
_PAGES: Final = "pages"
_ITEMS: Final = "items"


#: How a page is named: its content hash, or a keyed one.
PageHash = Callable[[Sequence[Any]], str]


def page_hash(items: Sequence[Any]) -> str:
    """The content hash of a page's encoded items (hex, 128 bits)."""
    return hashlib.sha256(orjson.dumps(items)).hexdigest()[:32]


def keyed_page_hash(key: bytes) -> PageHash:
    """Page names keyed by ``key`` (HMAC-SHA-256), for encrypted stores.

    Such a name lets nobody confirm a guess of the page's content (``docs/encryption.md``).
    """

    def named(items: Sequence[Any]) -> str:
        return hmac.new(key, orjson.dumps(items), hashlib.sha256).hexdigest()[:32]

    return named


def _same(values: Sequence[Any], parent: Sequence[Any], start: int) -> bool:
    end = start + PAGE_ITEMS
    if len(parent) < end:
        return False
    return all(a is b for a, b in zip(values[start:end], parent[start:end], strict=True))


def paginate(
    values: Sequence[Any],
    encoded: list[Any],
    parent: tuple[Sequence[Any], Sequence[str]] | None,
    new_pages: dict[str, list[Any]],
    name: PageHash = page_hash,
) -> dict[str, Any]:
    """A list channel's stored form; pages not in ``parent`` are added to ``new_pages``.

    ``encoded`` holds the encoding of each item of ``values``; ``parent`` is the parent
    checkpoint's list (the objects) and its page hashes. A page whose items are the very
    objects of the parent's page keeps its hash without being hashed again.
    """
    full = len(values) // PAGE_ITEMS
    if full == 0:
        return {_ITEMS: encoded}
    hashes: list[str] = []
    for index in range(full):
        start = index * PAGE_ITEMS
        if parent is not None and index < len(parent[1]) and _same(values, parent[0], start):
            hashes.append(parent[1][index])
            continue
        page = encoded[start : start + PAGE_ITEMS]
        digest = name(page)
        new_pages[digest] = page
        hashes.append(digest)
    return {_PAGES: hashes, _ITEMS: encoded[full * PAGE_ITEMS :]}


def hashes_of(stored: Mapping[str, Any]) -> list[str]:
    """The page hashes of a stored list channel (none for a short list)."""
    found = stored.get(_PAGES, [])
    if not isinstance(found, list) or not all(isinstance(h, str) and len(h) == 32 for h in found):
        raise CheckpointCorruptedError("a stored LangGraph list channel has malformed pages")
    return found


def referenced(values: Mapping[str, Any]) -> set[str]:
    """Every page hash a stored checkpoint's channel values reference."""
    return {h for v in values.values() if isinstance(v, dict) for h in hashes_of(v)}


def unpage(stored: Mapping[str, Any], pages: Mapping[str, list[Any]]) -> list[Any]:
    """A stored list channel's encoded items, its pages' items first."""
    items = stored.get(_ITEMS)
    if set(stored) - {_PAGES, _ITEMS} or not isinstance(items, list):
        raise CheckpointCorruptedError("a stored LangGraph list channel is malformed")
    out: list[Any] = []
    for digest in hashes_of(stored):
        out.extend(pages[digest])
    out.extend(items)
    return out
