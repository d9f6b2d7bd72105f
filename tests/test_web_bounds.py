"""A hostile store gives bounded pages: long hostile ids, many steps, big metadata and errors
never make a page grow with the store (sizes asserted, not times; bench/web.py times them)."""

from __future__ import annotations

import html

import pytest

from aiocheckpoint import CheckpointManager, open_storage
from aiocheckpoint.web import data
from tests.test_cli import NewStore, new_store
from tests.test_web import listed
from tests.web_support import HOSTILE, client

__all__ = ["new_store"]

#: Hostile text (HTML, script, bidi and control characters), 900 characters.
LONG = (HOSTILE * 40)[:900]
#: A hostile id near the longest allowed (255 UTF-8 bytes with its 3-digit prefix).
ID = (HOSTILE * 10).encode()[:240].decode(errors="ignore")


@pytest.mark.slow  # every page of a large store: 6-7 s (tests/conftest.py's five-second rule)
async def test_every_page_of_a_hostile_store_is_bounded(new_store: NewStore) -> None:
    """120 workflows with 240-byte hostile ids, one with 300 steps, big metadata and a
    long error: each page stays under its bound, and the list shows one page of rows."""
    url = new_store("sqlite")
    async with CheckpointManager(open_storage(url)) as manager:
        for n in range(120):
            await manager.create_checkpoint(f"{n:03d}{ID}", 0, HOSTILE, "failed", {LONG: LONG})
        meta = {f"k{n}": HOSTILE * 50 for n in range(200)}
        for step in range(300):
            await manager.create_checkpoint(
                "long", step, HOSTILE, "running", {"n": step, "s": LONG}, metadata=meta
            )
    async with client(url) as http:
        front = (await http.get("/")).text
        assert len(listed(front)) == data.PAGE and len(front) < 1_000_000
        ids = [html.unescape(i) for i in listed(front)]
        assert all(i.endswith(ID) for i in ids)
        sizes = {}
        for target, params in [
            ("/workflow", {"id": "long"}),
            ("/workflow", {"id": ids[0]}),
            ("/step", {"id": "long", "step": "299"}),
            ("/diff", {"id": "long", "step": "299"}),
            ("/store", {"verify": "1"}),
            ("/throughput", {}),
        ]:
            reply = await http.get(target, params=params)
            assert reply.status_code == 200, target
            sizes[target] = len(reply.text)
            assert "<script>window" not in reply.text
    assert sizes["/workflow"] < 1_000_000 and sizes["/step"] < 1_000_000
    assert sizes["/throughput"] < 200_000 and sizes["/diff"] < 200_000
    assert sizes["/store"] < 2_000_000  # 120 hostile ids verified, no problems listed
