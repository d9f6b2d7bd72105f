import hashlib
import json
import math
import random
import string
import zlib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiocheckpoint import (
    AgentStatus,
    Checkpoint,
    CheckpointCorruptedError,
    CheckpointSerializationError,
    StateSnapshot,
)
from aiocheckpoint.codec.copy import to_storable
from aiocheckpoint.codec.tree.join import (
    ajoin_state,
    areferenced_hashes,
    join_state,
    referenced_hashes,
)
from aiocheckpoint.codec.tree.split import split_state
from aiocheckpoint.codec.tree.splitmemory import recovered_memory
from aiocheckpoint.codec.tree.v2 import (
    adecode_checkpoint_v2,
    decode_checkpoint_v2,
    encode_checkpoint_v2,
    encode_v2_work,
)
from aiocheckpoint.codec.v1 import encode_checkpoint
from aiocheckpoint.format.header import record_format_version
from aiocheckpoint.format.tree import SplitResult, TreeParams, node_children, record_root_refs
from tests.tiered import examples

# Tiny limits make even small generated states into deep trees of chunks and indexes.
TINY = TreeParams(
    inline_limit=16,
    root_inline_limit=0,
    chunk_min=16,
    chunk_avg=48,
    chunk_max=128,
    fanout_min=2,
    fanout_avg=3,
    fanout_max=6,
)
SMALL = TreeParams(inline_limit=64, root_inline_limit=0, chunk_min=64, chunk_avg=256)
DEFAULT = TreeParams()


class Store:
    """A blob store in a dict that counts fetch calls."""

    def __init__(self, blobs: Mapping[bytes, bytes] | None = None) -> None:
        self.blobs: dict[bytes, bytes] = dict(blobs or {})
        self.calls: list[list[bytes]] = []

    def add(self, split: SplitResult) -> int:
        """Store a split's blobs; return how many bytes were new."""
        new = 0
        for h, blob in split.blobs.items():
            if h not in self.blobs:
                self.blobs[h] = blob
                new += len(blob)
        return new

    def fetch(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        self.calls.append(list(hashes))
        return {h: self.blobs[h] for h in hashes if h in self.blobs}

    async def afetch(self, hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        return self.fetch(hashes)


def canon(value: Any) -> Any:
    """A comparable form that keeps key order, int/float/bool distinctions, NaN and -0.0."""
    kind = type(value)
    if kind is dict:
        return ("dict", [(k, canon(v)) for k, v in value.items()])
    if kind is list:
        return ("list", [canon(v) for v in value])
    if kind is float:
        return ("float", repr(value))
    return (kind.__name__, value)


def round_trip(
    data: Any, params: TreeParams, *, finite: bool = False
) -> tuple[Any, Store, SplitResult]:
    split = split_state(data, params, finite=finite)
    store = Store(split.blobs)
    return join_state(split.root, store.fetch, digest_size=params.digest_size), store, split


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([70, 6000]).map(lambda e: 7**e)
    | st.sampled_from([64, 6000]).map(lambda e: -(7**e))
    | st.floats(allow_nan=True, allow_infinity=True)
    | text
)


def states_of(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts of nested lists and dicts with ``leaves`` at the bottom."""
    values = st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=12) | st.dictionaries(text, inner, max_size=12),
        max_leaves=30,
    )
    return st.dictionaries(text, values, max_size=10)


states = states_of(scalars)
# No NaN or infinity (what finite=True promises); ints around and beyond 64 bits.
finite_states = states_of(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**63, 2**64 - 1, -(2**63), 7**70])
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states)
def test_random_states_round_trip_exactly_through_deep_trees(data: dict[str, Any]) -> None:
    """Random nested states come back exactly (key order, types, big ints, NaN, -0.0)."""
    back, _, _ = round_trip(data, TINY)
    assert canon(back) == canon(data)


# 40 examples (15 in the fast tier): test_the_text_checksum_matches_what_readers_rebuild
# round-trips 60 more finite states through the same encoder (20 in the fast tier), and
# drawing a state costs more than checking it.
@examples(fast=15, full=40)
def test_finite_states_round_trip_exactly_through_the_fast_encoder(examples: int) -> None:
    """The orjson encoder (finite=True) gives exact round trips too, ints of 64+ bits included.

    An int beyond 64 bits makes it fall back to the exact encoder; both kinds of tree read
    back the same way.
    """

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(finite_states)
    def check(data: dict[str, Any]) -> None:
        for params in (TINY, SMALL):
            back, _, split = round_trip(data, params, finite=True)
            assert canon(back) == canon(data)
            if not any(type(leaf) is float for leaf in _leaves(data)):
                # The same nodes: only floats may be written differently (1e-05 vs 0.00001).
                assert split_state(data, params).root == split.root

    check()


def _leaves(value: Any) -> list[Any]:
    if type(value) is dict:
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if type(value) is list:
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


@examples(fast=15, full=40)
def test_random_states_round_trip_with_default_params(examples: int) -> None:
    """With the default parameters (small states inline in the root) states round trip."""

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(states)
    def check(data: dict[str, Any]) -> None:
        back, _, _ = round_trip(data, TreeParams())
        assert canon(back) == canon(data)

    check()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states, st.integers(min_value=0, max_value=2**62))
def test_random_checkpoints_round_trip_through_v2_records(data: dict[str, Any], step: int) -> None:
    """A checkpoint survives a version-2 record and its blobs unchanged."""
    cp = _checkpoint(data, step=step)
    record, split = encode_checkpoint_v2(cp, TINY)
    back = decode_checkpoint_v2(record, Store(split.blobs).fetch, workflow_id="wf", step=step)
    assert canon(back.state_snapshot.data) == canon(cp.state_snapshot.data)
    assert back.model_dump(exclude={"state_snapshot"}) == cp.model_dump(exclude={"state_snapshot"})
    assert back.state_snapshot.version == cp.state_snapshot.version


def _checkpoint(data: dict[str, Any], step: int = 3) -> Checkpoint:
    return Checkpoint(
        workflow_id="wf",
        step=step,
        agent_id="agent",
        status=AgentStatus.COMPLETED,
        state_snapshot=StateSnapshot(data=to_storable(data), metadata={"m": [1, 2]}),
        metadata={"note": "x"},
    )


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(n))


def test_the_cooperative_encoder_yields_between_slices_and_matches_the_one_shot_one() -> None:
    """encode_v2_work (what the manager runs on the event loop) slices a 1 MB state.

    Its result is the same record and blobs as encode_checkpoint_v2's; the exact encoder
    (finite=False) does not slice.
    """
    rng = random.Random(7)
    data = {"docs": [{"id": i, "text": _words(rng, 150)} for i in range(1000)], "n": 1.5}
    cp = _checkpoint(data)
    work = encode_v2_work(cp, finite=True)
    slices = jobs = 0
    try:
        step = next(work)
        while True:
            slices += step is None
            jobs += step is not None
            step = work.send(None if step is None else step())
    except StopIteration as stop:
        record, split = stop.value
    assert slices >= 1_000_000 // (64 * 1024)
    assert jobs >= 1  # the checksum of the 1 MB list's text, for a worker thread
    assert (record, split) == encode_checkpoint_v2(cp, finite=True)
    back = decode_checkpoint_v2(record, Store(split.blobs).fetch)
    assert canon(back.state_snapshot.data) == canon(cp.state_snapshot.data)
    assert sum(1 for _ in encode_v2_work(cp)) == 0


def test_trees_written_by_the_first_writer_still_decode() -> None:
    """A tree the first version-2 writer made (with TINY) reads back exactly.

    It predates the orjson encoder and boundaries counted in bytes; tests/data holds its
    root and blobs as written then.
    """
    saved = json.loads(
        (Path(__file__).parent / "data" / "incremental_first_writer.json").read_text()
    )
    blobs = {bytes.fromhex(h): bytes.fromhex(b) for h, b in saved["blobs"].items()}
    back = join_state(bytes.fromhex(saved["root"]), Store(blobs).fetch)
    expected = {
        "msgs": [{"role": "user", "text": f"hello {i} \u00fc"} for i in range(6)],
        "n": 7**30,
        "x": -0.0,
        "nan": [math.nan, 1e-05],
    }
    assert canon(back) == canon(expected)


def test_special_values_survive_inside_blobs() -> None:
    """NaN, infinities, -0.0 and ints beyond the 4300-digit limit round trip inside blobs."""
    huge = 7**20000
    data = {"pad": "p" * 3000, "vals": [math.nan, math.inf, -math.inf, -0.0, huge, -huge] * 3}
    back, store, _ = round_trip(data, TreeParams())
    assert store.blobs
    assert canon(back) == canon(data)


def test_text_that_looks_like_a_reference_is_just_text() -> None:
    """User values shaped like the node format (null, hashes, kind bytes) stay user values."""
    split0 = split_state({"a": "x" * 100}, SMALL)
    fake = next(iter(split0.blobs))
    data = {
        "nulls": [None] * 50,
        "hash": fake.hex(),
        "tricky": ["V", "null", {"null": None}, "\x00\x01", '"null"'] * 20,
    }
    back, _, _ = round_trip(data, TINY)
    assert canon(back) == canon(data)


def test_repeated_subtrees_are_stored_once_and_come_back_as_separate_objects() -> None:
    """An identical sub-tree used twice is one blob, yet the copies do not alias."""
    doc = {"body": "same text " * 100, "tags": ["a", "b"]}
    data = {"first": doc, "second": dict(doc)}
    back, _, split = round_trip(data, TreeParams(root_inline_limit=0))
    assert len(split.root_refs) == 1 or len(split.blobs) < 3
    assert back == data
    assert back["first"] is not back["second"]
    back["first"]["tags"].append("c")
    assert back["second"]["tags"] == ["a", "b"]


def test_unchanged_subtrees_are_shared_between_checkpoints() -> None:
    """Changing one small key of a ~1 MB state adds a few small blobs, not a copy.

    With the previous split's memory (what the manager passes) the edited region is cut
    into its chunks; without it, the region is rewritten whole: bounded either way.
    """
    rng = random.Random(5)
    state = {
        "counter": 0,
        "docs": {f"d{i}": {"n": 0, "body": _words(rng, 140)} for i in range(1000)},
    }
    store = Store()
    first_split = split_state(state)
    first = store.add(first_split)
    assert first > 900_000
    state["counter"] = 1
    state["docs"]["d500"]["n"] = 1
    blind = split_state(state)
    split = split_state(state, previous=first_split.memory)
    added = store.add(split)
    # The edited region's chunks (at most chunk_max bytes) and the index path above them.
    assert added < DEFAULT.bundle_max + 4 * 1024
    assert store.add(blind) < DEFAULT.bundle_max + 4 * 1024
    assert join_state(split.root, store.fetch) == state
    assert join_state(blind.root, store.fetch) == state
    # A second edit in the same region, now cut into chunks, rewrites about one chunk.
    state["docs"]["d501"]["n"] = 1
    again = split_state(state, previous=split.memory)
    assert store.add(again) < 2 * 1024 + 4 * 1024
    assert join_state(again.root, store.fetch) == state


def _counter(state: dict[str, Any], value: int) -> dict[str, Any]:
    copy = to_storable(state)
    copy["docs"]["d500"]["n"] = value
    return copy


@pytest.mark.parametrize("size", [2000, 8000])
def test_appending_to_a_long_list_rewrites_a_bounded_number_of_bytes(size: int) -> None:
    """Appending one element adds bytes bounded by the chunk size and tree depth, not n."""
    rng = random.Random(size)
    params = TreeParams(root_inline_limit=0)
    items = [{"id": i, "text": _words(rng, 12)} for i in range(size)]
    store = Store()
    store.add(split_state({"log": items}, params))
    total = sum(map(len, store.blobs.values()))
    for i in range(5):
        items.append({"id": size + i, "text": _words(rng, 12)})
        split = split_state({"log": items}, params)
        added = store.add(split)
        assert added <= params.chunk_max + 4 * params.fanout_max * params.digest_size
        assert join_state(split.root, store.fetch) == {"log": items}
    assert total > 4 * (params.chunk_max + 4 * params.fanout_max * params.digest_size)


def test_inserting_in_the_middle_of_a_list_rewrites_only_nearby_chunks() -> None:
    """Content-defined boundaries resynchronise after an insertion."""
    rng = random.Random(9)
    params = TreeParams(root_inline_limit=0)
    items = [_words(rng, 15) for _ in range(4000)]
    store = Store()
    store.add(split_state(items, params))
    items.insert(2000, "inserted " * 5)
    split = split_state(items, params)
    assert store.add(split) < 4 * params.chunk_max
    assert join_state(split.root, store.fetch) == items


def test_fetch_is_called_once_per_tree_level() -> None:
    """Blobs are requested level by level, each hash at most once."""
    data = {"l": [{"k": i, "v": "x" * 40} for i in range(300)]}
    split = split_state(data, TINY)
    store = Store(split.blobs)
    assert join_state(split.root, store.fetch) == data
    requested = [h for call in store.calls for h in call]
    assert len(requested) == len(set(requested)) == len(split.blobs)
    assert 3 <= len(store.calls) < 20


async def test_async_fetch_round_trips() -> None:
    """ajoin_state and adecode_checkpoint_v2 give the same results as the sync forms."""
    data = {"l": [{"k": i, "v": "y" * 40} for i in range(200)], "s": "z" * 5000}
    split = split_state(data, SMALL)
    store = Store(split.blobs)
    assert await ajoin_state(split.root, store.afetch) == data
    cp = _checkpoint(data)
    record, split2 = encode_checkpoint_v2(cp, SMALL)
    back = await adecode_checkpoint_v2(record, Store(split2.blobs).afetch, step=3)
    assert back == cp
    assert await areferenced_hashes([split.root], store.afetch) == set(split.blobs)


def _big_split() -> tuple[SplitResult, dict[str, Any]]:
    data = {"items": [{"i": i, "t": "w" * 50} for i in range(400)], "top": "q" * 3000}
    return split_state(data, SMALL), data


def test_a_missing_blob_is_reported_as_corruption() -> None:
    """A reader whose store lacks one blob raises CheckpointCorruptedError naming it."""
    split, _ = _big_split()
    for victim in list(split.blobs)[:: max(1, len(split.blobs) // 7)]:
        blobs = dict(split.blobs)
        del blobs[victim]
        with pytest.raises(CheckpointCorruptedError, match=victim.hex()):
            join_state(split.root, Store(blobs).fetch)


def test_a_corrupted_blob_is_reported_as_corruption() -> None:
    """A bit flip anywhere in any blob fails its hash check."""
    split, _ = _big_split()
    rng = random.Random(1)
    for victim in list(split.blobs)[:: max(1, len(split.blobs) // 7)]:
        blob = bytearray(split.blobs[victim])
        blob[rng.randrange(1, len(blob))] ^= 0x10
        blobs = dict(split.blobs)
        blobs[victim] = bytes(blob)
        with pytest.raises(CheckpointCorruptedError):
            join_state(split.root, Store(blobs).fetch)


def test_a_blob_stored_under_another_hash_is_detected() -> None:
    """A store that answers with the wrong (but intact) blob is caught by the hash."""
    split, _ = _big_split()
    keys = list(split.blobs)
    blobs = dict(split.blobs)
    blobs[keys[0]], blobs[keys[1]] = blobs[keys[1]], blobs[keys[0]]
    with pytest.raises(CheckpointCorruptedError, match="does not match its hash"):
        join_state(split.root, Store(blobs).fetch)


def _large_record() -> tuple[bytes, SplitResult, dict[str, Any]]:
    rng = random.Random(11)
    data = {"docs": [{"i": i, "t": _words(rng, 30)} for i in range(600)], "n": 1}
    record, split = encode_checkpoint_v2(_checkpoint(data), SMALL, finite=True)
    return record, split, data


def _record_meta(record: bytes) -> dict[str, Any]:
    meta_len = int.from_bytes(record[20:24], "big")
    parsed: dict[str, Any] = json.loads(record[25 : 25 + meta_len])
    return parsed


def test_records_carry_the_checksum_of_the_whole_state_text() -> None:
    """The fast encoder records the CRC-32 of the state's JSON text; a reader checks it."""
    record, split, data = _large_record()
    assert split.text_crc is not None
    assert _record_meta(record)["state"]["text_crc32"] == split.text_crc
    assert split.text_crc == zlib.crc32(json.dumps(data, separators=(",", ":")).encode())
    back = decode_checkpoint_v2(record, Store(split.blobs).fetch)
    assert back.state_snapshot.data == data
    assert "text_crc32" not in back.state_snapshot.model_dump()
    # The exact encoder (NaN, big ints) has no whole text at hand: nodes are hashed instead.
    exact_record, exact = encode_checkpoint_v2(_checkpoint({**data, "nan": math.nan}), SMALL)
    assert exact.text_crc is None
    assert "text_crc32" not in _record_meta(exact_record)["state"]


def test_a_corrupted_blob_fails_the_text_checksum_and_is_named() -> None:
    """Under a record's text checksum a bit flip, a swapped or a missing blob is still caught.

    A mismatch hashes every node to name the damaged blob.
    """
    record, split, _ = _large_record()
    rng = random.Random(2)
    keys = list(split.blobs)
    for victim in keys[:: max(1, len(keys) // 9)]:
        blob = bytearray(split.blobs[victim])
        blob[rng.randrange(8, len(blob) - 1)] ^= 0x04
        blobs = {**split.blobs, victim: bytes(blob)}
        with pytest.raises(CheckpointCorruptedError, match=victim.hex()):
            decode_checkpoint_v2(record, Store(blobs).fetch)
        missing = dict(split.blobs)
        del missing[victim]
        with pytest.raises(CheckpointCorruptedError, match=victim.hex()):
            decode_checkpoint_v2(record, Store(missing).fetch)
    leaves = [h for h in keys if split.children[h] == ()]
    swapped = {**split.blobs, leaves[0]: split.blobs[leaves[1]], leaves[1]: split.blobs[leaves[0]]}
    with pytest.raises(CheckpointCorruptedError, match="does not match its hash"):
        decode_checkpoint_v2(record, Store(swapped).fetch)


def test_a_wrong_text_checksum_is_reported_as_corruption() -> None:
    """Intact blobs under a record whose text checksum disagrees: the record is damaged."""
    record, split, _ = _large_record()
    meta = _record_meta(record)
    for bad in (meta["state"]["text_crc32"] ^ 1, -1, "x", 2**32):
        meta["state"]["text_crc32"] = bad
        meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
        forged = _rebuilt_record(meta_bytes, record)
        with pytest.raises(CheckpointCorruptedError, match="checksum"):
            decode_checkpoint_v2(forged, Store(split.blobs).fetch)


def test_a_chunk_orjson_refuses_in_a_large_list_goes_to_the_exact_parser() -> None:
    """A list of over 1 MB is parsed by orjson a run of chunks at a time; a run it refuses
    (here in a crafted store, under a matching text checksum) is read by the exact parser: a
    NaN as from any record. A lone surrogate is refused as corruption, naming first the blob
    whose bytes no longer match its name.
    """
    rng = random.Random(5)
    data = {"docs": [{"i": i, "t": _words(rng, 40)} for i in range(5000)]}
    record, split = encode_checkpoint_v2(_checkpoint(data), DEFAULT, finite=True)
    assert split.text_crc is not None and len(json.dumps(data)) > 1024 * 1024
    victim = next(h for h, blob in split.blobs.items() if b'{"i":7,' in blob)
    for value, read in (("NaN", math.nan), ('"\\ud800"', None)):
        blobs = dict(split.blobs)
        blobs[victim] = blobs[victim].replace(b'{"i":7,', b'{"i":%s,' % value.encode())
        crafted = {"docs": [dict(d) for d in data["docs"]]}
        crafted["docs"][7]["i"] = "SPOT"
        text = json.dumps(crafted, separators=(",", ":")).replace('"SPOT"', value)
        crafted["docs"][7]["i"] = read
        meta = _record_meta(record)
        meta["state"]["text_crc32"] = zlib.crc32(text.encode())
        forged = _rebuilt_record(json.dumps(meta, separators=(",", ":")).encode(), record)
        if read is None:
            with pytest.raises(CheckpointCorruptedError, match=f"{victim.hex()} does not match"):
                decode_checkpoint_v2(forged, Store(blobs).fetch)
        else:
            back = decode_checkpoint_v2(forged, Store(blobs).fetch)
            assert canon(back.state_snapshot.data) == canon(crafted)


def _rebuilt_record(meta_bytes: bytes, record: bytes) -> bytes:
    """``record`` with its metadata replaced, header and CRC made consistent again."""
    meta_len = int.from_bytes(record[20:24], "big")
    digest = record[24:25]
    root = record[25 + meta_len :]
    body = len(meta_bytes).to_bytes(4, "big") + digest + meta_bytes + root
    return record[:8] + len(body).to_bytes(8, "big") + zlib.crc32(body).to_bytes(4, "big") + body


@examples(fast=20, full=60)
def test_the_text_checksum_matches_what_readers_rebuild(examples: int) -> None:
    """For any finite state, the recorded checksum is that of the text the join rebuilds.

    A disagreement would make an intact checkpoint unreadable, so it is checked on random
    states through deep trees (TINY) and with memory-driven bundling.
    """

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(finite_states)
    def check(data: dict[str, Any]) -> None:
        cp = _checkpoint(data)
        previous = None
        for params in (TINY, SMALL):
            record, split = encode_checkpoint_v2(cp, params, finite=True, previous=previous)
            back = decode_checkpoint_v2(record, Store(split.blobs).fetch)
            assert canon(back.state_snapshot.data) == canon(cp.state_snapshot.data)
            previous = split.memory

    check()


def _list_leaves(split: SplitResult) -> list[bytes]:
    return [h for h, children in split.children.items() if not children]


def test_new_regions_are_bundled_and_edited_ones_cut_into_chunks() -> None:
    """Fresh data is stored as region-sized blobs; an edit with memory rewrites one chunk.

    The bundle sizes trade a large state's resume (fewer nodes) against nothing the
    workloads pay: appends and edits cut only the regions they touch.
    """
    rng = random.Random(4)
    items = [{"id": i, "text": _words(rng, 20)} for i in range(3000)]
    unbundled = split_state(items, TreeParams(bundle_chunks=1), finite=True)
    bundled = split_state(items, finite=True)
    assert len(_list_leaves(bundled)) * 4 < len(_list_leaves(unbundled))
    assert max(map(len, bundled.blobs.values())) <= DEFAULT.bundle_max + 64
    store = Store()
    store.add(bundled)
    items[1500]["text"] = "edited"
    edited = split_state(items, finite=True, previous=bundled.memory)
    first_edit = store.add(edited)
    assert first_edit < DEFAULT.bundle_max + 4 * 1024
    items[1500]["text"] = "edited twice"
    again = split_state(items, finite=True, previous=edited.memory)
    assert store.add(again) < 2 * DEFAULT.chunk_avg + 4 * 1024
    # Unchanged regions keep their form (bundled), so they are shared, not rewritten.
    assert len(set(_list_leaves(again)) - set(_list_leaves(bundled))) <= 32
    assert join_state(again.root, store.fetch) == items


def test_appends_with_memory_rewrite_about_one_chunk_per_step() -> None:
    """A message list that grows by one entry per save pays about one entry, not a region."""
    rng = random.Random(6)
    messages = [{"id": i, "content": _words(rng, 150)} for i in range(200)]
    store = Store()
    split = split_state({"messages": messages}, finite=True)
    store.add(split)
    added = []
    for i in range(200, 300):
        messages.append({"id": i, "content": _words(rng, 150)})
        split = split_state({"messages": messages}, finite=True, previous=split.memory)
        added.append(store.add(split))
    message = len(json.dumps(messages[-1]))
    # One new chunk of about one message, plus a few index nodes on its path.
    assert sum(added) / len(added) < 2 * message + 1024
    assert join_state(split.root, store.fetch) == {"messages": messages}


BUNDLING = TreeParams(
    inline_limit=64, root_inline_limit=0, chunk_min=32, chunk_avg=128, bundle_chunks=3
)
edits = st.lists(
    st.tuples(
        st.sampled_from(["append", "edit", "insert", "delete", "replace"]),
        st.integers(min_value=0, max_value=10**6),
        text,
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(text, min_size=20, max_size=120), edits, st.booleans())
def test_edit_sequences_with_memory_round_trip(
    start: list[str], changes: list[tuple[str, int, str]], nested: bool
) -> None:
    """Any sequence of edits, each split with the previous split's memory, reads back exactly.

    Memory only decides which blobs are made (bundled or per chunk), so every step must
    decode, with the text checksum, from the blobs stored so far.
    """
    items: list[Any] = [{"k": i, "v": t} if nested else t for i, t in enumerate(start)]
    store = Store()
    previous = None
    for kind, at, value in changes:
        n = len(items)
        entry: Any = {"k": -at, "v": value} if nested else value
        if kind == "append":
            items.append(entry)
        elif kind == "insert":
            items.insert(at % (n + 1), entry)
        elif kind == "delete" and n:
            del items[at % n]
        elif kind == "edit" and n:
            items[at % n] = entry
        elif kind == "replace":
            items = [entry, *items[1:]]
        state = {"items": items, "n": len(items)}
        record, split = encode_checkpoint_v2(
            _checkpoint(state), BUNDLING, finite=True, previous=previous
        )
        store.add(split)
        previous = split.memory
        back = decode_checkpoint_v2(record, store.fetch)
        assert back.state_snapshot.data == state


def test_a_memory_is_recovered_from_the_first_chunks_a_store_holds() -> None:
    """A split without memory names each region's first chunk; a store holding it means cut.

    Recovering gives the same blobs as the memory the lost split would have passed on.
    """
    rng = random.Random(12)
    items = [{"id": i, "text": _words(rng, 20)} for i in range(1500)]
    store = Store()
    split = split_state(items, finite=True)
    store.add(split)
    for i in (100, 700, 1400):  # three edits, each cutting the region it lands in
        items[i]["text"] = f"edited {i}"
        split = split_state(items, finite=True, previous=split.memory)
        store.add(split)
    assert split.memory is not None and not split.memory.first_chunks
    cut = [key for key, whole in split.memory.regions.items() if not whole]
    assert len(cut) >= 3  # an edit may move a region's end and cut its neighbour too
    items[1400]["text"] = "edited again"
    with_memory = split_state(items, finite=True, previous=split.memory)
    blind = split_state(items, finite=True)
    assert blind.memory is not None and len(blind.memory.first_chunks) > 10
    held = set(blind.memory.first_chunks.values()) & set(store.blobs)
    assert len(held) == len(cut)
    recovered = recovered_memory(blind.memory, held)
    assert recovered is not None
    assert with_memory.memory is not None
    assert {k for k, whole in recovered.regions.items() if not whole} == {
        k for k, whole in with_memory.memory.regions.items() if not whole
    }
    again = split_state(items, finite=True, previous=recovered)
    assert set(again.blobs) == set(with_memory.blobs)
    assert recovered_memory(blind.memory, ()) is None  # nothing held: the split stands


def test_damaged_v2_records_are_reported_as_corruption() -> None:
    """Truncated, bit-flipped or mislabelled version-2 records raise CheckpointCorruptedError."""
    record, split = encode_checkpoint_v2(_checkpoint({"a": "b" * 3000}), SMALL)
    fetch = Store(split.blobs).fetch
    for damaged in (record[:-1], record[:10], record[:30] + bytes([record[30] ^ 1]) + record[31:]):
        with pytest.raises(CheckpointCorruptedError):
            decode_checkpoint_v2(damaged, fetch)
    with pytest.raises(CheckpointCorruptedError, match="step"):
        decode_checkpoint_v2(record, fetch, step=4)
    with pytest.raises(CheckpointCorruptedError, match="workflow"):
        decode_checkpoint_v2(record, fetch, workflow_id="other")


def test_tree_expansion_is_bounded() -> None:
    """A reader refuses trees that expand beyond its byte budget."""
    split, _ = _big_split()
    with pytest.raises(CheckpointCorruptedError, match="limit"):
        join_state(split.root, Store(split.blobs).fetch, max_bytes=1000)


def test_version_1_records_still_decode() -> None:
    """decode_checkpoint_v2 reads records written in format version 1."""
    cp = _checkpoint({"a": [1, 2.5, None], "big": 7**6000})
    record = encode_checkpoint(cp)
    assert record_format_version(record) == 1
    assert record_root_refs(record) == ()
    assert decode_checkpoint_v2(record, Store().fetch, workflow_id="wf", step=3) == cp


def test_small_states_are_stored_inline_without_blobs() -> None:
    """A ~1 KB state makes a self-contained version-2 record and never calls fetch."""
    cp = _checkpoint({"goal": "g" * 800, "n": 1})
    record, split = encode_checkpoint_v2(cp)
    assert record_format_version(record) == 2
    assert split.blobs == {} and split.root == b"" and record_root_refs(record) == ()

    def no_fetch(hashes: Collection[bytes]) -> Mapping[bytes, bytes]:
        raise AssertionError("fetch called for an inline state")

    assert decode_checkpoint_v2(record, no_fetch) == cp


def test_reference_bookkeeping_matches_the_tree() -> None:
    """children, root_refs, referenced, node_children and referenced_hashes agree."""
    split, _ = _big_split()
    record, split2 = encode_checkpoint_v2(_checkpoint(_big_split()[1]), SMALL)
    assert set(record_root_refs(record)) == set(split2.root_refs) == set(split.root_refs)
    for h, blob in split.blobs.items():
        assert node_children(blob) == split.children[h]
    reachable = referenced_hashes([split.root], Store(split.blobs).fetch)
    assert reachable == set(split.referenced) == set(split.blobs)
    assert referenced_hashes(split.root, Store(split.blobs).fetch) == reachable
    first = next(iter(split.root_refs))
    assert referenced_hashes([split.root], Store(split.blobs).fetch, skip={first}) == {
        h for h in reachable if h != first
    } - _descendants(first, split)


def _descendants(h: bytes, split: SplitResult) -> set[bytes]:
    out: set[bytes] = set()
    todo = list(split.children[h])
    while todo:
        child = todo.pop()
        if child not in out:
            out.add(child)
            todo.extend(split.children[child])
    return out


def test_marking_reports_missing_blobs() -> None:
    """The mark phase refuses to silently skip a blob that is gone."""
    split, _ = _big_split()
    blobs = dict(split.blobs)
    del blobs[next(iter(split.root_refs))]
    with pytest.raises(CheckpointCorruptedError, match="missing"):
        referenced_hashes([split.root], Store(blobs).fetch)


def test_known_blobs_are_not_encoded_again() -> None:
    """Blobs whose hash the caller already stores are left out of the result."""
    split, data = _big_split()
    assert split.stored_bytes() == sum(map(len, split.blobs.values())) > 0
    again = split_state(data, SMALL, known=split.blobs.keys())
    assert again.blobs == {}
    assert again.children == split.children
    assert again.stored_bytes() == 0


def test_zstd_compression_is_flagged_and_round_trips() -> None:
    """Compressed blobs carry the zstd flag, are smaller, and read back exactly."""
    data = {"docs": [{"body": "lorem ipsum dolor " * 60} for _ in range(50)]}
    params = TreeParams(root_inline_limit=0, compression="zstd")
    split = split_state(data, params)
    plain = split_state(data, TreeParams(root_inline_limit=0))
    assert split.blobs.keys() == plain.blobs.keys()
    assert any(blob[0] == 1 for blob in split.blobs.values())
    assert sum(map(len, split.blobs.values())) < sum(map(len, plain.blobs.values())) / 2
    assert split.stored_bytes() == sum(map(len, split.blobs.values()))  # compressed bytes
    assert join_state(split.root, Store(split.blobs).fetch) == data
    mixed = {h: (split.blobs[h] if i % 2 else plain.blobs[h]) for i, h in enumerate(split.blobs)}
    assert join_state(split.root, Store(mixed).fetch) == data


def test_unknown_blob_flags_are_corruption() -> None:
    """A blob whose flags byte is unknown is refused."""
    split, _ = _big_split()
    blobs = {h: b"\x80" + b[1:] for h, b in split.blobs.items()}
    with pytest.raises(CheckpointCorruptedError, match="flags"):
        join_state(split.root, Store(blobs).fetch)


@pytest.mark.parametrize("bad", [{"s": {1, 2}}, {"b": b"x"}, {"u": "\ud800" * 600}])
def test_unstorable_values_raise_serialization_errors(bad: dict[str, Any]) -> None:
    """Values outside the storable set are refused with CheckpointSerializationError."""
    with pytest.raises(CheckpointSerializationError):
        split_state(bad, TreeParams(root_inline_limit=0))


def test_bad_parameters_are_refused() -> None:
    """TreeParams rejects inconsistent sizes and unknown compressors."""
    from aiocheckpoint import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        TreeParams(digest_size=8)
    with pytest.raises(InvalidArgumentError):
        TreeParams(chunk_min=10, chunk_avg=5)
    with pytest.raises(InvalidArgumentError):
        TreeParams(compression="lz4")


def _crafted(nodes: dict[str, bytes], root_ref: str) -> tuple[bytes, dict[bytes, bytes]]:
    """A tree from hand-made nodes: ``{name: node bytes}``, where ``@name`` in an index
    node stands for that node's hash; the root is a value node holding ``root_ref``."""
    hashes: dict[str, bytes] = {}
    blobs: dict[bytes, bytes] = {}
    for name, node in nodes.items():
        for other, h in hashes.items():
            node = node.replace(f"@{other}".encode(), h)
        h = hashlib.sha256(node).digest()[:16]
        hashes[name] = h
        blobs[h] = b"\x00" + node
    root = b"\x00V" + (1).to_bytes(4, "big") + hashes[root_ref] + bytes(4) + b"null"
    return root, blobs


@pytest.mark.parametrize(
    "nodes",
    [
        # A dict index over list chunks.
        {"a": b"V\0\0\0\0[1,2]", "b": b"V\0\0\0\0[3]", "i": b"D@a@b"},
        # A list index over a chunk that is not a container.
        {"a": b"V\0\0\0\0[1,2]", "b": b'V\0\0\0\0"xy"', "i": b"L@a@b"},
        # A dict index under a list index.
        {"a": b'V\0\0\0\0{"k":1}', "b": b'V\0\0\0\0{"j":2}', "d": b"D@a@b", "i": b"L@d@a"},
        # An empty chunk.
        {"a": b"V\0\0\0\0[1,2]", "b": b"V\0\0\0\0[]", "i": b"L@a@b"},
    ],
)
def test_index_nodes_over_chunks_of_the_wrong_kind_are_corruption(nodes: dict[str, bytes]) -> None:
    """Hash-valid nodes that do not splice into one container are refused, not misread."""
    root, blobs = _crafted(nodes, "i")
    with pytest.raises(CheckpointCorruptedError, match="wrong kind"):
        join_state(root, Store(blobs).fetch)


def test_a_crafted_index_over_leaf_chunks_joins_them() -> None:
    """The same hand-made layout with matching kinds reads back (the test above can fail)."""
    nodes = {"a": b'V\0\0\0\0{"k":1}', "b": b'V\0\0\0\0{"j":[2]}', "d": b"D@a@b", "i": b"D@d@a"}
    root, blobs = _crafted(nodes, "i")
    assert join_state(root, Store(blobs).fetch) == {"k": 1, "j": [2]}
