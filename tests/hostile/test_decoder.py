"""A store's contents are untrusted: what the decoder does with records it did not write.

Issue 22, items 1, 2, 4 and 13. The crafted stores are real file stores whose records and
blobs are forged here (valid checksums and hashes, hostile shapes). The readers that could
run out of memory run in a child process under ``RLIMIT_AS`` (1 GiB): they must end with
``CheckpointCorruptedError``, never ``MemoryError`` or a kill.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

import aiocheckpoint
from aiocheckpoint import (
    AgentStatus,
    Checkpoint,
    CheckpointCorruptedError,
    CheckpointManager,
    CheckpointSerializationError,
    FileCheckpointStorage,
    StateSnapshot,
)
from aiocheckpoint.codec.tree.v2 import encode_checkpoint_v2
from aiocheckpoint.codec.v1 import decode_checkpoint, encode_checkpoint
from aiocheckpoint.format import MAX_DEPTH, SplitResult, TreeParams, node_children, open_record_v2
from aiocheckpoint.format.header import HEADER, MAGIC
from aiocheckpoint.format.tree import V2_PREFIX

WF = "wf"
#: The crafted stores' max_record_bytes: what a reader may hold for one record.
LIMIT = 16 * 1024 * 1024
#: The store classes the tests plant trees in and read them from.
FILE = "FileCheckpointStorage"
SQLITE = "SQLiteCheckpointStorage"
#: The address space the child readers get.
MEMORY = 1024 * 1024 * 1024

# --- forging records and trees ------------------------------------------------------------


def name(node: bytes) -> bytes:
    """A node's 16-byte name."""
    return hashlib.sha256(node).digest()[:16]


def value_node(text: bytes, refs: list[tuple[int, bytes]] | None = None) -> bytes:
    """A ``V`` node: the text, with child ``i`` at byte offset ``refs[i][0]`` (a ``null``)."""
    refs = refs or []
    hashes = b"".join(h for _, h in refs)
    offsets = struct.pack(f">{len(refs)}I", *[off for off, _ in refs])
    return b"V" + struct.pack(">I", len(refs)) + hashes + offsets + text


def list_of(count: int, child: bytes) -> bytes:
    """A ``V`` node holding a JSON list of ``count`` references to ``child``."""
    text = b"[" + b",".join([b"null"] * count) + b"]"
    return value_node(text, [(1 + 5 * i, child) for i in range(count)])


def meta_of(step: int) -> dict[str, Any]:
    """The metadata object of a genuine version-2 record of step ``step``."""
    checkpoint = Checkpoint(
        workflow_id=WF,
        step=step,
        agent_id="agent",
        status=AgentStatus.COMPLETED,
        state_snapshot=StateSnapshot(data={"big": "x" * 64}),
    )
    record, _ = encode_checkpoint_v2(checkpoint, TreeParams(root_inline_limit=0, inline_limit=16))
    meta, _digest, _root = open_record_v2(record)
    meta["state"].pop("text_crc32", None)
    return meta


def record_v2(meta: dict[str, Any], root_blob: bytes) -> bytes:
    """A version-2 record with valid checksums around ``meta`` and a stored root."""
    meta_bytes = json.dumps(meta).encode()
    body = V2_PREFIX.pack(len(meta_bytes), 16) + meta_bytes + root_blob
    return HEADER.pack(MAGIC, 2, 0, 0, len(body), zlib.crc32(body)) + body


def record_v1(obj: dict[str, Any]) -> bytes:
    """A version-1 record with a valid checksum around ``obj``."""
    body = json.dumps(obj).encode()
    return HEADER.pack(MAGIC, 1, 0, 0, len(body), zlib.crc32(body)) + body


def body_of(step: int, data: Any, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body of a genuine version-1 record, with ``data`` and ``fields`` replaced."""
    checkpoint = Checkpoint(
        workflow_id=WF,
        step=step,
        agent_id="agent",
        status=AgentStatus.COMPLETED,
        state_snapshot=StateSnapshot(data={}),
    )
    body: dict[str, Any] = json.loads(encode_checkpoint(checkpoint)[HEADER.size :])
    body["state"]["data"] = data
    body.update(fields or {})
    return body


async def plant_tree(
    base: Path, root_node: bytes, blobs: dict[bytes, bytes], store: str = FILE
) -> None:
    """A store (a file store, or ``store``) holding a valid step 0 and, as step 1, a forged
    tree.
    """
    async with getattr(aiocheckpoint, store)(base, max_record_bytes=LIMIT) as storage:
        await CheckpointManager(storage).create_checkpoint(WF, 0, "agent", "completed", {"n": 0})
        split = SplitResult(
            root=b"\x00" + root_node,
            blobs=blobs,
            # The SQLite store counts references down the tree: it needs each blob's.
            children={h: node_children(b) if store == SQLITE else () for h, b in blobs.items()},
            root_refs=node_children(b"\x00" + root_node),
        )
        await storage.save_tree(WF, 1, record_v2(meta_of(1), b"\x00" + root_node), split)


# --- reading in a child process with bounded memory ---------------------------------------

_READER = """
import asyncio, json, logging, resource, sys
{prelude}
limit = int(sys.argv[3])
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import aiocheckpoint

async def main():
    out = {{}}
    storage = aiocheckpoint.{store}(sys.argv[1], max_record_bytes=int(sys.argv[2]))
    async with aiocheckpoint.CheckpointManager(storage) as manager:
        try:
            await manager.get_latest_checkpoint("wf")
            out["latest"] = "read"
        except aiocheckpoint.CheckpointCorruptedError as exc:
            out["latest"] = "corrupted: " + exc.reason
        except BaseException as exc:
            out["latest"] = "raw " + type(exc).__name__
        try:
            step, snapshot, _metrics = await manager.get_resume_point("wf")
            out["resume"] = [step, snapshot.data]
        except BaseException as exc:
            out["resume"] = "raw " + type(exc).__name__
    # This process's own peak (VmHWM): ru_maxrss also counts the peak of the process that
    # started it (Linux carries it over fork and exec), a test worker's after large tests.
    status = open("/proc/self/status").read()
    out["peak_mib"] = int(status.split("VmHWM:")[1].split()[0]) // 1024
    print(json.dumps(out))

logging.disable(logging.WARNING)
asyncio.run(main())
"""


def read_in_child(
    base: Path, *, memory: int = MEMORY, prelude: str = "", store: str = FILE
) -> dict[str, Any]:
    """What a child process reading the store (a file store, or ``store``) gets: the latest
    and the resume point.
    """
    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _READER.format(prelude=prelude, store=store),
            str(base),
            str(LIMIT),
            str(memory),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


#: What a child reader may reach at its peak (resident): the interpreter and its imports,
#: and at most the store's limit in nodes and in text.
PEAK_MIB = 256


def assert_refused_and_skipped(result: dict[str, Any], reason: str) -> None:
    """The forged step 1 is corruption, and the resume point falls back to step 0."""
    assert result["latest"].startswith("corrupted: "), result
    assert reason in result["latest"] and "MemoryError" not in result["latest"], result
    assert result["resume"] == [1, {"n": 0}], result  # step 0 completed: resume at 1
    assert result["peak_mib"] < PEAK_MIB, result


# --- 1. expansion ("billion laughs") ------------------------------------------------------


@pytest.mark.slow
async def test_a_tree_expanding_past_max_record_bytes_is_refused_in_bounded_memory(
    tmp_path: Path,
) -> None:
    """Five levels of 200 references to one sub-tree (~25 KB of blobs) expand to ~30 TB
    of text: the reader counts every spliced byte against the store's max_record_bytes and
    refuses at the limit, in a 1 GiB address space.

    The leaf is a 100-byte string: two levels (4 MB) fit under the limit and the third
    (800 MB) is refused part-way, after ~170,000 splices (a one-byte leaf needs ~8 million
    to reach the limit, which takes the reader seconds for nothing the test looks at).
    """
    leaf = value_node(b'"' + b"x" * 98 + b'"')
    blobs = {name(leaf): b"\x00" + leaf}
    child = name(leaf)
    for _ in range(4):
        node = list_of(200, child)
        child = name(node)
        blobs[child] = b"\x00" + node
    await plant_tree(tmp_path / "store", list_of(200, child), blobs)
    result = read_in_child(tmp_path / "store")
    assert_refused_and_skipped(result, "beyond the record size limit")


@pytest.mark.parametrize(("store", "where"), [(FILE, "store"), (SQLITE, "store.db")])
@pytest.mark.slow  # a kill loop or a decoding bomb: the slow tier
async def test_index_nodes_repeating_one_chunk_are_refused_in_bounded_memory(
    tmp_path: Path, store: str, where: str
) -> None:
    """The same expansion through list index nodes (chunks collected, not spliced); also
    from a SQLite store, which reads the whole tree in one read thread, level after level,
    without the event loop between levels (storage.base.BlobReads).
    """
    chunk = value_node(b"[7]")
    blobs = {name(chunk): b"\x00" + chunk}
    child = name(chunk)
    for _ in range(4):
        index = b"L" + child * 256
        child = name(index)
        blobs[child] = b"\x00" + index
    await plant_tree(tmp_path / where, value_node(b"null", [(0, child)]), blobs, store)
    result = read_in_child(tmp_path / where, store=store)
    assert_refused_and_skipped(result, "beyond the record size limit")


async def test_a_sqlite_store_refuses_a_cycle_of_misnamed_blobs(tmp_path: Path) -> None:
    """Two index nodes stored under names that make each the other's child (a cycle no
    hash allows): the first one read names itself as damaged, in bounded memory.
    """
    a, b = b"a" * 16, b"b" * 16
    blobs = {a: b"\x00L" + b, b: b"\x00L" + a}
    db = tmp_path / "store.db"
    await plant_tree(db, value_node(b"null", [(0, a)]), blobs, SQLITE)
    result = read_in_child(db, store=SQLITE)
    assert_refused_and_skipped(result, "does not match its hash")


async def test_a_sqlite_store_refuses_a_chain_deeper_than_the_reader_recurses(
    tmp_path: Path,
) -> None:
    """A chain of 5,000 value nodes, each the only child of the one above (5,000 tree
    levels, each one query in the read thread): a typed error, in bounded memory.
    """
    node = value_node(b"7")
    blobs = {name(node): b"\x00" + node}
    for _ in range(5000):
        node = value_node(b"[null]", [(1, name(node))])
        blobs[name(node)] = b"\x00" + node
    db = tmp_path / "store.db"
    await plant_tree(db, value_node(b"null", [(0, name(node))]), blobs, SQLITE)
    result = read_in_child(db, store=SQLITE)
    assert_refused_and_skipped(result, "undecodable node (RecursionError)")


async def test_empty_values_cannot_multiply_references_for_free(tmp_path: Path) -> None:
    """A value node with no text splices nothing: refused, so references always cost."""
    empty = value_node(b"")
    await plant_tree(tmp_path / "store", list_of(3, name(empty)), {name(empty): b"\x00" + empty})
    async with FileCheckpointStorage(tmp_path / "store", max_record_bytes=LIMIT) as storage:
        with pytest.raises(CheckpointCorruptedError, match="empty value node"):
            await CheckpointManager(storage).get_checkpoint(WF, 1)


async def test_writes_a_reader_would_refuse_are_refused(tmp_path: Path) -> None:
    """The writer applies the same bound: a state whose text is over the store's
    max_record_bytes is refused before anything is stored (each of its blobs would fit),
    and one just under it round-trips.
    """
    limit = 64 * 1024
    docs = [{"id": i, "body": "lorem ipsum " * 20} for i in range(400)]  # ~100 KB of text
    async with FileCheckpointStorage(tmp_path / "s", max_record_bytes=limit) as storage:
        manager = CheckpointManager(storage)
        with pytest.raises(CheckpointSerializationError, match="max_record_bytes"):
            await manager.create_checkpoint(WF, 1, "agent", "completed", {"docs": docs})
        assert not await storage.exists(WF)
        fits = {"docs": docs[:150]}  # ~40 KB of text, cut into several blobs
        await manager.create_checkpoint(WF, 2, "agent", "completed", fits)
        assert (await manager.get_checkpoint(WF, 2)).state_snapshot.data == fits


# --- 2. decompression bombs -----------------------------------------------------------------


def zstd_bomb(index: int, size: int, *, declare: bool) -> tuple[bytes, bytes]:
    """``(name, stored blob)`` of a node of ``size`` bytes of spaces and a digit, as a zstd
    frame of a few KB (written in pieces: the node is never in memory here).
    """
    import zstandard

    head = value_node(b"")
    tail = str(index).encode()
    piece = b" " * (1 << 20)
    hasher = hashlib.sha256(head)
    packer = zstandard.ZstdCompressor(level=3).compressobj(
        size=len(head) + size + len(tail) if declare else -1
    )
    frame = [packer.compress(head)]
    for _ in range(size // len(piece)):
        hasher.update(piece)
        frame.append(packer.compress(piece))
    hasher.update(tail)
    frame += [packer.compress(tail), packer.flush()]
    return hasher.digest()[:16], b"\x01" + b"".join(frame)


@pytest.mark.slow
@pytest.mark.parametrize("declare", [True, False], ids=["size-declared", "size-unknown"])
async def test_zstd_bombs_are_refused_while_decompressing(tmp_path: Path, declare: bool) -> None:
    """Six blobs of a few KB each inflating to 300 MB: the reader's decompression budget
    (the store's max_record_bytes, for all of a record's blobs) stops the first one, in a
    1 GiB address space; a frame declaring a larger size is not even started.
    """
    bombs = dict(zstd_bomb(i, 300 * 1024 * 1024, declare=declare) for i in range(6))
    assert sum(map(len, bombs.values())) < 200_000
    text = b"[" + b",".join([b"null"] * 6) + b"]"
    root = value_node(text, [(1 + 5 * i, h) for i, h in enumerate(bombs)])
    await plant_tree(tmp_path / "store", root, bombs)
    result = read_in_child(tmp_path / "store")
    reason = "over the record size limit" if declare else "undecompressable blob"
    assert_refused_and_skipped(result, reason)


# --- 4. the writer's limits, on read --------------------------------------------------------


def nest(depth: int) -> Any:
    """``depth`` lists, one inside the other, around a 1."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("where", ["state", "metadata", "state.metadata", "tree"])
async def test_nesting_deeper_than_writers_allow_is_refused_on_read(
    tmp_path: Path, where: str
) -> None:
    """A record nested 900 levels deep (writers stop at MAX_DEPTH) is corruption, so it
    never becomes a resume point whose every save would fail; the previous step is used.
    At the writer's own limit a forged record still reads.
    """
    deep = {"x": nest(900)}
    async with FileCheckpointStorage(tmp_path / "s", max_record_bytes=LIMIT) as storage:
        manager = CheckpointManager(storage)
        await manager.create_checkpoint(WF, 0, "agent", "completed", {"n": 0})
        if where == "tree":
            root = b"\x00" + value_node(json.dumps(deep).encode())
            no_blobs = SplitResult(b"", {}, {}, ())
            await storage.save_tree(WF, 1, record_v2(meta_of(1), root), no_blobs)
        else:
            body = body_of(1, {"n": 1})
            if where == "state":
                body["state"]["data"] = deep
            elif where == "metadata":
                body["metadata"] = deep
            else:
                body["state"]["metadata"] = deep
            await storage.save(WF, 1, record_v1(body))
        with pytest.raises(CheckpointCorruptedError, match=f"deeper than {MAX_DEPTH}"):
            await manager.get_checkpoint(WF, 1)
        step, snapshot, _ = await manager.get_resume_point(WF)  # type: ignore[misc]
        assert (step, snapshot.data) == (1, {"n": 0})
        at_limit = {"x": nest(MAX_DEPTH - 1)}
        await storage.save(WF, 2, record_v1(body_of(2, at_limit)))
        assert (await manager.get_checkpoint(WF, 2)).state_snapshot.data == at_limit


@pytest.mark.parametrize(
    ("body_text", "reason"),
    [
        (b'"\\ud800"', "lone surrogate"),
        (b'{"\\udfff": 1}', "lone surrogate"),
        (b'"\xed\xa0\x80"', "UnicodeDecodeError"),
    ],
    ids=["escaped-value", "escaped-key", "raw-utf8"],
)
def test_strings_writers_refuse_are_refused_on_read(body_text: bytes, reason: str) -> None:
    """Writers never store a lone surrogate; a record holding one, escaped or as raw
    bytes, is corruption. A surrogate pair written as escapes is a valid character.
    """
    template = json.dumps(body_of(1, {"s": "PLACEHOLDER"})).encode()
    body = template.replace(b'"PLACEHOLDER"', body_text)
    data = HEADER.pack(MAGIC, 1, 0, 0, len(body), zlib.crc32(body)) + body
    with pytest.raises(CheckpointCorruptedError, match=reason):
        decode_checkpoint(data)
    pair = template.replace(b'"PLACEHOLDER"', b'"\\ud83d\\ude00 \\\\ud800"')
    data = HEADER.pack(MAGIC, 1, 0, 0, len(pair), zlib.crc32(pair)) + pair
    assert decode_checkpoint(data).state_snapshot.data == {"s": "\U0001f600 \\ud800"}


@pytest.mark.parametrize(
    "fields",
    [{"workflow_id": "w\x00f"}, {"workflow_id": "w" * 256}, {"step": -1}, {"step": 2**63}],
    ids=["nul-in-id", "long-id", "negative-step", "huge-step"],
)
def test_ids_writers_refuse_are_refused_on_read(fields: dict[str, Any]) -> None:
    """A record claiming a workflow id or step no writer accepts is corruption, even when
    no id is expected (tools that read a store's records as they come).
    """
    data = record_v1(body_of(1, {"n": 1}, fields))
    with pytest.raises(CheckpointCorruptedError, match="invalid id"):
        decode_checkpoint(data)


@pytest.mark.parametrize("data", [[1, 2], "text", None, 7], ids=["list", "str", "null", "int"])
def test_a_state_that_is_not_an_object_is_refused_on_read(data: Any) -> None:
    """Writers store a state as a JSON object; any other value there is corruption (the
    reader checks it itself: the state is not passed through the model's validation).
    """
    with pytest.raises(CheckpointCorruptedError, match="state data is not an object"):
        decode_checkpoint(record_v1(body_of(1, data)))
    assert decode_checkpoint(record_v1(body_of(1, {"k": [1]}))).state_snapshot.data == {"k": [1]}


# --- 13. compressed blobs without the zstd extra ------------------------------------------


async def test_without_zstandard_a_compressed_blob_is_a_typed_error_naming_the_extra(
    tmp_path: Path,
) -> None:
    """A reader without the ``zstandard`` package (here: a child process where it cannot be
    imported) gets ``CheckpointCorruptedError`` naming ``aiocheckpoint[zstd]`` for a
    checkpoint with compressed blobs, and ``get_resume_point`` falls back as for any
    corrupted checkpoint.
    """
    base = tmp_path / "store"
    params = TreeParams(compression="zstd")
    async with FileCheckpointStorage(base, blob_params=params) as storage:
        manager = CheckpointManager(storage)
        await manager.create_checkpoint(WF, 0, "agent", "completed", {"n": 0})
        big = {"docs": [{"id": i, "body": "lorem ipsum " * 40} for i in range(300)]}
        await manager.create_checkpoint(WF, 1, "agent", "completed", big)
    blocked = "sys.modules['zstandard'] = None  # import zstandard now raises ImportError"
    result = read_in_child(base, memory=0, prelude=blocked)
    assert_refused_and_skipped(result, "pip install 'aiocheckpoint[zstd]'")
    with_zstd = read_in_child(base, memory=0)  # the control: the extra reads it
    assert with_zstd["latest"] == "read" and with_zstd["resume"][0] == 2
