"""JSON (orjson) against msgpack (ormsgpack) for a state's leaves: is a binary encoding worth it?

    python bench/leaf_codecs.py [--repeats N] [--mb 10]

For each shape -- ``docs`` (10,000 documents of ~1 KB: the resume row's state), ``short``
(a dict of 100,000 keys holding ~100-byte strings), ``chat`` (a 1,000-message chat of ~1 KB
messages: a 1 MB chat step) and ``small`` (the ~1 KB hot-path state) -- the same Python
object is encoded and decoded whole by both libraries (median thread CPU time of
``--repeats`` calls). For the three large shapes the state is also cut as the tree
encoder cuts it (``split_state(finite=True)``) and its leaf chunks decoded the way a
resume does now (orjson over ~128 KB runs of chunks, merged into one list or dict) against
each chunk re-encoded with msgpack and decoded one by one (what a msgpack leaf kind would
do), next to the CRC-32 a resume takes of the chunks' text.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]


def _median_ms(call: Callable[[], Any], repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        result = call()
        times.append(time.thread_time() - start)
        del result
    return statistics.median(times) * 1e3


def shapes(mb: float) -> dict[str, Any]:
    """The four states, by name."""
    from bench.data import ChatStates, DocStates, small_state, text

    chat = ChatStates()
    for step in range(int(mb * 100)):
        chat_state = chat.next(step)
    return {
        "docs": DocStates.of(int(mb * 1_000_000)).at(1),
        "short": {f"key-{i:06d}": text(100, seed=i % 997) for i in range(int(mb * 10_000))},
        "chat": chat_state,
        "small": small_state(3),
    }


def whole(name: str, value: Any, repeats: int) -> None:
    """Encode and decode of the whole value by both libraries."""
    import orjson
    import ormsgpack

    as_json, as_msgpack = orjson.dumps(value), ormsgpack.packb(value)
    assert orjson.loads(as_json) == value == ormsgpack.unpackb(as_msgpack)
    unit, scale = ("us", 1e3) if len(as_json) < 100_000 else ("ms", 1.0)
    times = {
        "json_encode": _median_ms(lambda: orjson.dumps(value), repeats),
        "msgpack_encode": _median_ms(lambda: ormsgpack.packb(value), repeats),
        "json_decode": _median_ms(lambda: orjson.loads(as_json), repeats),
        "msgpack_decode": _median_ms(lambda: ormsgpack.unpackb(as_msgpack), repeats),
    }
    shown = "  ".join(f"{key} {ms * scale:.3f} {unit}" for key, ms in times.items())
    print(
        f"{name:6} whole ({len(as_json):,} B JSON, {len(as_msgpack):,} B msgpack): {shown}"
        f"  decode msgpack/json {times['msgpack_decode'] / times['json_decode']:.2f}x"
        f"  encode msgpack/json {times['msgpack_encode'] / times['json_encode']:.2f}x"
    )


def chunks(name: str, value: Any, repeats: int) -> None:
    """The tree's leaf chunks of the value's largest container, decoded as a resume does."""
    import orjson
    import ormsgpack

    from aiocheckpoint.codec.tree.join import _runs
    from aiocheckpoint.codec.tree.split import split_state
    from aiocheckpoint.format.tree import PLAIN_LEAF

    skip = len(PLAIN_LEAF)
    split = split_state(value, finite=True)
    leaves = [b for b in split.blobs.values() if b.startswith(PLAIN_LEAF)]
    opening = b"[" if name != "short" else b"{"
    found = [b for b in leaves if b[skip : skip + 1] == opening]
    kind: type = list if opening == b"[" else dict
    packed = [ormsgpack.packb(orjson.loads(memoryview(b)[skip:])) for b in found]

    def merged(parts: Any, parse: Callable[[Any], Any]) -> Any:
        out = kind()
        add = out.extend if kind is list else out.update
        for part in parts:
            add(parse(part))
        return out

    def crc() -> int:
        value = 0
        for blob in found:
            value = zlib.crc32(memoryview(blob)[skip:], value)
        return value

    json_ms = _median_ms(lambda: merged(_runs(found), orjson.loads), repeats)
    msgpack_ms = _median_ms(lambda: merged(packed, ormsgpack.unpackb), repeats)
    print(
        f"{name:6} {len(found)} leaf chunks ({sum(map(len, found)) - skip * len(found):,} B):"
        f" orjson runs {json_ms:.2f} ms  ormsgpack per chunk {msgpack_ms:.2f} ms"
        f" ({msgpack_ms / json_ms:.2f}x)  crc32 {_median_ms(crc, repeats):.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--mb", type=float, default=10, help="docs and short's size")
    args = parser.parse_args()
    for name, value in shapes(args.mb).items():
        whole(name, value, args.repeats if name != "small" else args.repeats * 200)
        if name != "small":
            chunks(name, value, args.repeats)


if __name__ == "__main__":
    main()
