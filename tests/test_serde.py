import math
import struct
import uuid
import zlib
from datetime import date, datetime, timezone
from enum import Enum
from typing import Any

import pytest
from pydantic import BaseModel

from aiocheckpoint import (
    AgentStatus,
    Checkpoint,
    CheckpointCorruptedError,
    CheckpointSerializationError,
    StateSnapshot,
)
from aiocheckpoint.codec.copy import storable_copy, storable_copy_work, to_storable
from aiocheckpoint.codec.v1 import decode_checkpoint, encode_checkpoint
from aiocheckpoint.format.header import HEADER_SIZE, MAGIC
from aiocheckpoint.format.limits import MAX_DEPTH


def _checkpoint(data: dict[str, Any], **extra: Any) -> Checkpoint:
    return Checkpoint(
        workflow_id=extra.pop("workflow_id", "wf"),
        step=extra.pop("step", 3),
        agent_id="agent",
        status=AgentStatus.COMPLETED,
        state_snapshot=StateSnapshot(data=to_storable(data)),
        **extra,
    )


def _round_trip(data: dict[str, Any]) -> dict[str, Any]:
    cp = _checkpoint(data)
    back = decode_checkpoint(encode_checkpoint(cp), workflow_id="wf", step=3)
    assert back == cp
    return back.state_snapshot.data


def test_round_trip_is_exact_for_json_values() -> None:
    """JSON-compatible values, key order included, come back exactly."""
    data = {
        "z": 1,
        "a": [1, -2, 3.5, -0.0, "x", None, True, False],
        "nested": {"b": {"c": [{"d": '日本語 \u2028 "quoted"'}]}},
        "big": 2**200,
        "neg": -(10**50),
    }
    back = _round_trip(data)
    assert back == data
    assert list(back) == ["z", "a", "nested", "big", "neg"]
    assert math.copysign(1.0, back["a"][3]) == -1.0


def test_ints_beyond_the_digit_limit_round_trip() -> None:
    """Ints with tens of thousands of digits survive despite Python's str conversion limit."""
    huge = 7**40000  # about 33,800 digits
    back = _round_trip({"huge": huge, "neg": -huge, "list": [huge, 1]})
    assert back == {"huge": huge, "neg": -huge, "list": [huge, 1]}


def test_nan_and_infinities_round_trip() -> None:
    """NaN and the infinities are stored and come back as floats of the same kind."""
    cp = _checkpoint({"nan": math.nan, "inf": math.inf, "ninf": -math.inf})
    back = decode_checkpoint(encode_checkpoint(cp)).state_snapshot.data
    assert math.isnan(back["nan"])
    assert back["inf"] == math.inf
    assert back["ninf"] == -math.inf


def test_standard_types_are_tagged_and_models_need_registering() -> None:
    """Tuples, datetimes and UUIDs are stored tagged (no conversion); an unregistered model
    is refused, naming its path."""

    class Item(BaseModel):
        name: str
        when: datetime

    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    ident = uuid.UUID(int=5)
    data = {"tuple": (1, (2, 3)), "dt": moment, "d": date(2026, 1, 2), "id": ident}
    assert _round_trip(data) == {
        "tuple": {"$tup": [1, {"$tup": [2, 3]}]},
        "dt": {"$dt": moment.isoformat()},
        "d": {"$date": "2026-01-02"},
        "id": {"$uuid": ident.hex},
    }
    with pytest.raises(CheckpointSerializationError, match=r"state\.model: .*Item is not a reg"):
        to_storable({"model": Item(name="n", when=moment)})


class Color(Enum):
    RED = 1


class Weird:
    pass


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"plan": {"items": [0, 1, 2, {Weird()}]}}, "state.plan.items[3][0]"),
        ({"k": {1: Weird()}}, "state.k[1]"),
        ({"k": {(1, 2): Weird()}}, "state.k[(1, 2)]"),
        ({"odd key": [Weird()]}, "state['odd key'][0]"),
        ({"c": Color.RED}, "state.c"),
        ({"f": (1, Weird())}, "state.f[1]"),
        ({"n": [None, object()]}, "state.n[1]"),
    ],
)
def test_unstorable_values_name_their_path(value: dict[str, Any], path: str) -> None:
    """Unregistered classes raise CheckpointSerializationError naming the path."""
    with pytest.raises(CheckpointSerializationError) as info:
        to_storable(value)
    assert info.value.path == path
    assert path in str(info.value)


def test_str_and_int_subclasses_are_refused() -> None:
    """Subclasses of str and int (enums and the like) are not converted silently."""

    class MyStr(str):
        pass

    with pytest.raises(CheckpointSerializationError):
        to_storable({"s": MyStr("x")})
    with pytest.raises(CheckpointSerializationError):
        to_storable({"s": AgentStatus.COMPLETED})


def test_cycles_are_refused() -> None:
    """A container that contains itself raises instead of recursing forever."""
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(CheckpointSerializationError, match="cycle") as info:
        to_storable({"a": loop})
    assert info.value.path == "state.a.self"


def test_shared_references_are_not_cycles() -> None:
    """The same list referenced twice is stored twice, not refused."""
    shared = [1, 2]
    assert to_storable({"a": shared, "b": shared}) == {"a": [1, 2], "b": [1, 2]}


def test_nesting_limit() -> None:
    """Nesting deeper than MAX_DEPTH raises; up to the limit it round-trips."""
    ok: Any = "leaf"
    for _ in range(MAX_DEPTH - 1):
        ok = [ok]
    assert _round_trip({"deep": ok}) == {"deep": ok}
    too_deep: Any = "leaf"
    for _ in range(MAX_DEPTH + 5):
        too_deep = {"x": too_deep}
    with pytest.raises(CheckpointSerializationError, match="nesting"):
        to_storable(too_deep)


def test_to_storable_copies() -> None:
    """The storable form is independent of the input."""
    source = {"list": [1, {"x": 2}]}
    copy = to_storable(source)
    source["list"][1]["x"] = 99  # type: ignore[index]
    assert copy == {"list": [1, {"x": 2}]}


def test_record_layout() -> None:
    """A record is the documented header followed by a UTF-8 JSON body."""
    data = encode_checkpoint(_checkpoint({"k": "v"}))
    magic, version, flags, _reserved, length, crc = struct.unpack(">4sBBHQI", data[:HEADER_SIZE])
    body = data[HEADER_SIZE:]
    assert (magic, version, flags, length) == (MAGIC, 1, 0, len(body))
    assert crc == zlib.crc32(body)
    assert b'"k":"v"' in body


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda b: b[:-1], "truncated"),
        (lambda b: b[:10], "too short"),
        (lambda b: b + b"x", "padded"),
        (
            lambda b: b[: HEADER_SIZE + 3] + bytes([b[HEADER_SIZE + 3] ^ 4]) + b[HEADER_SIZE + 4 :],
            "checksum",
        ),
        (lambda b: b"XXXX" + b[4:], "magic"),
        (lambda b: b[:4] + b"\x09" + b[5:], "format version"),
        (lambda b: b"", "too short"),
    ],
)
def test_damaged_records_raise_corrupted(mangle: Any, reason: str) -> None:
    """Truncation, bit flips, bad magic and unknown versions raise CheckpointCorruptedError."""
    good = encode_checkpoint(_checkpoint({"k": "value"}))
    with pytest.raises(CheckpointCorruptedError, match=reason) as info:
        decode_checkpoint(mangle(good), workflow_id="wf", step=3)
    assert (info.value.workflow_id, info.value.step) == ("wf", 3)


def test_valid_crc_but_invalid_body_is_corrupted() -> None:
    """A well-formed header over a body that is not a checkpoint is still refused."""
    for body in (b"[1,2]", b"{}", b'{"state": 1}', b"\xff\xfe", b"not json"):
        header = struct.pack(">4sBBHQI", MAGIC, 1, 0, 0, len(body), zlib.crc32(body))
        with pytest.raises(CheckpointCorruptedError):
            decode_checkpoint(header + body)


def test_record_of_another_workflow_or_step_is_refused() -> None:
    """A valid record stored under the wrong key is detected."""
    data = encode_checkpoint(_checkpoint({}, workflow_id="other", step=3))
    with pytest.raises(CheckpointCorruptedError, match="belongs to workflow"):
        decode_checkpoint(data, workflow_id="wf", step=3)
    with pytest.raises(CheckpointCorruptedError, match="belongs to step"):
        decode_checkpoint(data, workflow_id="other", step=4)


def _run_work(value: Any) -> tuple[tuple[Any, bool], int]:
    """Drive storable_copy_work to its end; return its result and how often it yielded."""
    work = storable_copy_work(value)
    yields = 0
    try:
        while True:
            next(work)
            yields += 1
    except StopIteration as stop:
        return stop.value, yields


class _Color(Enum):
    RED = 1


@pytest.mark.parametrize(
    "value",
    [
        {"docs": [{"id": i, "text": "t" * 50, "score": i / 7} for i in range(3000)], "n": 1},
        {"rows": [[i, -0.0, math.nan, 2**70] for i in range(500)], "meta": {"k": "v"}},
        [{"when": datetime(2026, 1, 1, tzinfo=timezone.utc)} for _ in range(100)],
        {"deep": {str(i): list(range(40)) for i in range(200)}},
        {"tiny": True},
        "just a string",
        # One "$" key over more than a batch (16) of elements: escaped as "$map".
        {"$x": [{"n": i} for i in range(17)]},
        {"$set": list(range(20))},
        {"$": {str(i): i for i in range(20)}},
        {1: list(range(20))},
    ],
)
def test_the_sliced_copy_equals_the_one_shot_copy(value: Any) -> None:
    """storable_copy_work gives storable_copy's result, finiteness flag included."""
    (copied, finite), _ = _run_work(value)
    expected, expected_finite = storable_copy(value)
    assert repr(copied) == repr(expected)  # repr: NaN and -0.0 compare exactly
    assert finite == expected_finite
    assert copied is not value or type(value) is str


def test_the_sliced_copy_yields_on_large_values_and_is_independent() -> None:
    """A large value is copied over several slices into objects that share nothing."""
    value = {"docs": [{"id": i, "tags": ["a", "b"]} for i in range(200_000)]}
    (copied, finite), yields = _run_work(value)
    assert yields > 1 and finite
    copied["docs"][0]["tags"].append("c")
    assert value["docs"][0]["tags"] == ["a", "b"]


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"docs": [{"id": i} for i in range(100)] + [{"bad": Weird()}]}, "state.docs[100].bad"),
        ({"docs": [{"c": _Color.RED}] * 40}, "state.docs[0].c"),
        ({"docs": [{1: Weird()}] * 40}, "state.docs[0][1]"),
        ({str(i): i for i in range(50)} | {"x": Weird()}, "state.x"),
    ],
)
def test_the_sliced_copy_names_what_is_unstorable(value: Any, path: str) -> None:
    """Errors are those of storable_copy, naming the same path."""
    with pytest.raises(CheckpointSerializationError) as sliced:
        _run_work(value)
    with pytest.raises(CheckpointSerializationError) as whole:
        storable_copy(value)
    assert str(sliced.value) == str(whole.value)
    assert path in str(sliced.value)
