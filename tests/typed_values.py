"""Hypothesis strategies over every type the value stage stores, and an exact comparison."""

from __future__ import annotations

import decimal
import math
from datetime import datetime, time, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
# Keys that look like the format's tags, and ordinary ones.
keys = st.sampled_from(["$", "$dt", "$map", "$tup", "$x", "$b", "a", ""]) | text
offsets = st.timedeltas(
    min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)
).map(timezone)
zones = st.none() | st.just(timezone.utc) | offsets
hashable = (
    st.integers()
    | text
    | st.binary(max_size=8)
    | st.uuids()
    | st.datetimes(timezones=zones)
    | st.dates()
    | st.timedeltas()
)
scalars = (
    st.none()
    | st.booleans()
    | hashable
    | st.sampled_from([70, -6000, 64]).map(lambda e: 7**e if e > 0 else -(7**-e))
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.decimals(allow_nan=True, allow_infinity=True)
    | st.times(timezones=zones)
    | st.binary(max_size=8).map(bytearray)
)
sets = st.sets(hashable, max_size=4) | st.frozensets(hashable, max_size=4)
odd_keys = st.integers() | st.tuples(st.integers(), text) | st.uuids()


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=5).map(tuple)
        | st.dictionaries(keys, inner, max_size=5)
        | st.dictionaries(odd_keys, inner, max_size=3)
    )


values = st.recursive(scalars | sets, _containers, max_leaves=20)
states = st.dictionaries(keys, values, max_size=6)


def same(a: Any, b: Any) -> bool:
    """Whether ``b`` is exactly ``a``: same types all the way down, equal values.

    NaN equals NaN, -0.0 differs from 0.0, Decimals compare digit for digit, datetimes
    and times compare their UTC offsets too.
    """
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (math.isnan(a) and math.isnan(b)) or (a == b and repr(a) == repr(b))
    if type(a) is decimal.Decimal:
        return str(a) == str(b)
    if type(a) in (datetime, time):
        return bool(a == b and a.utcoffset() == b.utcoffset() and str(a) == str(b))
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        pairs = zip(a.items(), b.items(), strict=True)
        return len(a) == len(b) and all(same(k, j) and same(v, w) for (k, v), (j, w) in pairs)
    if type(a) in (set, frozenset):
        return a == b and all(same(x, next(y for y in b if y == x)) for x in a)
    return bool(a == b)
