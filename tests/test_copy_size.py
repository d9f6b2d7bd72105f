"""The size bound the value stage's copy counts decides as ``exceeds`` of the copy does."""

from __future__ import annotations

import dataclasses
import sys
from datetime import datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aiocheckpoint import InMemoryCheckpointStorage, TypeRegistry
from aiocheckpoint.codec.copy import storable_copy, storable_copy_sized
from aiocheckpoint.codec.pipeline import RecordCodec
from aiocheckpoint.codec.sizes import exceeds
from aiocheckpoint.codec.stages import TypedValues
from aiocheckpoint.format.tree import TreeParams
from tests.tiered import examples
from tests.typed_values import same, scalars, sets, states, text


@dataclasses.dataclass
class Note:
    title: str
    at: datetime
    scores: list[float]


TYPES = TypeRegistry()
TYPES.register(Note, name="tests.Note")
LIMITS = (0, 1, 2, 16, 100, 1000, 8192)

# Everything the fast copy takes: str keys that never read as a tag, registered classes.
plain_keys = text.filter(lambda key: not key.startswith("$"))
notes = st.builds(Note, text, st.datetimes(), st.lists(st.floats(), max_size=3))
fast_values = st.recursive(
    scalars | sets | notes,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=5).map(tuple)
        | st.dictionaries(plain_keys, inner, max_size=5)
    ),
    max_leaves=30,
)
fast_states = st.dictionaries(plain_keys, fast_values, max_size=6)


@examples(fast=100, full=400)
def test_counted_bound_is_the_count_exceeds_makes(examples: int) -> None:
    @settings(max_examples=examples, deadline=None)
    @given(fast_states | fast_values)
    def check(value: Any) -> None:
        copy, finite, size = storable_copy_sized(value, sys.maxsize, types=TYPES)
        assert size is not None  # every value here takes the fast path
        # Counted in full, the bound is exactly exceeds' count: over size - 1, not over size.
        assert exceeds(copy, size - 1) and not exceeds(copy, size)
        expected, expected_finite = storable_copy(value, types=TYPES)
        assert finite == expected_finite and same(copy, expected)
        for limit in (*LIMITS, size - 1, size):
            copy, finite, bound = storable_copy_sized(value, limit, types=TYPES)
            assert bound is not None and bound <= size  # counting may stop past the limit
            assert (bound > limit) == exceeds(copy, limit)
            assert finite == expected_finite and same(copy, expected)

    check()


@examples(fast=50, full=200)
def test_codec_decides_as_wants_tree_of_the_copy(examples: int) -> None:
    @settings(max_examples=examples, deadline=None)
    @given(states, st.sampled_from(LIMITS))
    def check(state: dict[Any, Any], limit: int) -> None:
        # States with tag-like keys and non-str keys too: the Encoder's copy, no bound counted.
        store = InMemoryCheckpointStorage(blob_params=TreeParams(root_inline_limit=limit))
        codec = RecordCodec(store, store, TypedValues(TYPES))
        data, finite, tree = codec.copy_state(state)
        assert tree == codec.wants_tree(data) == exceeds(data, limit)
        expected, expected_finite = storable_copy(state, types=TYPES)
        assert finite == expected_finite and same(data, expected)

    check()


def test_the_encoders_copy_leaves_the_bound_to_exceeds() -> None:
    state = {"key": {1: "a"}, "tag": {"$dt": "x"}}
    copy, _, size = storable_copy_sized(state, 8192)
    assert size is None
    assert copy == storable_copy(state)[0]


def test_a_store_without_blobs_never_wants_a_tree() -> None:
    codec = RecordCodec(InMemoryCheckpointStorage(), None)
    assert codec.copy_state({"text": "x" * 100_000})[2] is False
