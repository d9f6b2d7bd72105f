"""Long list channels in pages, large values in boxes: a step's cost independent of size.

A list of more than :data:`PAGE_ITEMS` items is stored as its full pages, by content hash,
plus the items after the last full page. A page is a record of the thread's pages workflow
(``keys.pages_workflow``), written once; a checkpoint references it by hash. Appending to a
list therefore writes, per step, the new items and a list of page hashes, never the items of
the full pages again, and a checkpoint's encoding handles ~``PAGE_ITEMS`` items plus one
hash per page.

Any other value whose encoding is over :data:`BOX_BYTES` is stored the same way, as a page
of one item (a box): a checkpoint whose large channel did not change holds its hash only.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from ...errors import CheckpointCorruptedError

__all__ = [
    "BOX_BYTES",
    "PAGE_ITEMS",
    "box",
    "PageHash",
    "hashes_of",
    "is_box",
    "is_box_page",
    "keyed_page_hash",
    "page_hash",
    "paginate",
    "referenced",
    "unbox",
    "unpage",
]

#: Items per page.
PAGE_ITEMS: Final = 8
#: A value whose encoding (its ``type:base64`` text) is longer than this is boxed.
BOX_BYTES: Final = 16 * 1024
_PAGES: Final = "pages"
_ITEMS: Final = "items"
_BOX: Final = "box"


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


def paginate(
    encoded: list[Any],
    reused: Sequence[str | None],
    new_pages: dict[str, list[Any]],
    name: PageHash = page_hash,
) -> dict[str, Any]:
    """A list channel's stored form; pages not in the parent are added to ``new_pages``.

    ``encoded`` holds the encoding of each item of the list; ``reused[i]`` is the parent
    checkpoint's hash of page ``i`` when that page's items are the very objects of the
    parent's (None, or past its end, when not): such a page is not hashed again.
    """
    full = len(encoded) // PAGE_ITEMS
    if full == 0:
        return {_ITEMS: encoded}
    hashes: list[str] = []
    for index in range(full):
        known = reused[index] if index < len(reused) else None
        if known is not None:
            hashes.append(known)
            continue
        start = index * PAGE_ITEMS
        page = encoded[start : start + PAGE_ITEMS]
        digest = name(page)
        new_pages[digest] = page
        hashes.append(digest)
    return {_PAGES: hashes, _ITEMS: encoded[full * PAGE_ITEMS :]}


def box(
    encoded: Any, new_pages: dict[str, list[Any]], name: PageHash = page_hash
) -> dict[str, Any]:
    """A large value's stored form: the hash of a page holding its encoding alone.

    The page is added to ``new_pages`` (to be stored before what references it).
    """
    page = [encoded]
    digest = name(page)
    new_pages[digest] = page
    return {_BOX: digest}


def is_box(stored: Mapping[str, Any]) -> bool:
    """Whether a stored channel value is a box (else a list channel)."""
    return _BOX in stored


def is_box_page(items: Sequence[Any]) -> bool:
    """Whether a page's items are a boxed value's (one ``type:base64`` over the bound)."""
    return len(items) == 1 and type(items[0]) is str and len(items[0]) > BOX_BYTES


def hashes_of(stored: Mapping[str, Any]) -> list[str]:
    """The page hashes of a stored list channel or box (none for a short list)."""
    found = [stored[_BOX]] if _BOX in stored else stored.get(_PAGES, [])
    if not isinstance(found, list) or not all(isinstance(h, str) and len(h) == 32 for h in found):
        raise CheckpointCorruptedError("a stored LangGraph list channel has malformed pages")
    return found


def referenced(values: Mapping[str, Any]) -> set[str]:
    """Every page hash a stored checkpoint's channel values reference."""
    return {h for v in values.values() if isinstance(v, dict) for h in hashes_of(v)}


def unbox(stored: Mapping[str, Any], pages: Mapping[str, list[Any]]) -> Any:
    """A boxed value's encoding, from its page."""
    [digest] = hashes_of(stored)
    page = pages[digest]
    if len(stored) != 1 or len(page) != 1:
        raise CheckpointCorruptedError("a stored LangGraph boxed value is malformed")
    return page[0]


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
