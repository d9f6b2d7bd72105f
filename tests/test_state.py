from typing import Any

import pytest

from aiocheckpoint import SharedState, StateVersion


def test_new_state_starts_at_version_zero() -> None:
    """A new state has version 0 and a copy of its initial data."""
    initial = {"a": {"b": 1}}
    state = SharedState(initial)
    initial["a"]["b"] = 2
    assert state.version == 0
    assert state.to_dict() == {"a": {"b": 1}}
    assert SharedState().to_dict() == {}


def test_dot_paths_get_and_set() -> None:
    """set creates intermediate dicts; get follows dot paths and returns the default."""
    state = SharedState()
    state.set("research.results", [1, 2], agent_id="researcher")
    assert state.get("research.results") == [1, 2]
    assert state.get("research") == {"results": [1, 2]}
    assert state.get("research.missing", "dflt") == "dflt"
    assert state.get("research.results.deeper") is None
    assert state.version == 1
    assert state.get_versions(1)[0].agent_id == "researcher"
    assert state.get_versions(1)[0].changed_fields == ["research.results"]


def test_values_in_and_out_are_copies() -> None:
    """Changing a value after set, or a value returned by get, never changes the state."""
    state = SharedState()
    value = {"items": [1]}
    state.set("x", value)
    value["items"].append(2)
    got = state.get("x")
    got["items"].append(3)
    state.to_dict()["x"]["items"].append(4)
    assert state.get("x") == {"items": [1]}


def test_set_through_a_non_dict_raises_and_changes_nothing() -> None:
    """Setting below a scalar raises TypeError and leaves the state and version as they were."""
    state = SharedState({"a": 1})
    with pytest.raises(TypeError, match="not a dict"):
        state.set("a.b", 2)
    assert state.to_dict() == {"a": 1}
    assert state.version == 0


@pytest.mark.parametrize("path", ["", ".a", "a.", "a..b"])
def test_bad_paths(path: str) -> None:
    """Empty paths and empty segments raise ValueError."""
    with pytest.raises(ValueError, match="path"):
        SharedState().set(path, 1)


def test_update_is_one_version() -> None:
    """update applies several paths as one version bump, or none if any path fails."""
    state = SharedState({"s": 1})
    state.update({"a.b": 1, "c": 2}, agent_id="x")
    assert state.version == 1
    assert state.to_dict() == {"s": 1, "a": {"b": 1}, "c": 2}
    with pytest.raises(TypeError):
        state.update({"d": 4, "s.x": 5})
    assert state.version == 1
    assert "d" not in state.to_dict()


def test_delete() -> None:
    """delete removes a path and reports whether it existed, bumping the version only then."""
    state = SharedState({"a": {"b": 1, "c": 2}})
    assert state.delete("a.b") is True
    assert state.to_dict() == {"a": {"c": 2}}
    assert state.version == 1
    assert state.delete("a.b") is False
    assert state.delete("x.y.z") is False
    assert state.version == 1


def test_merge_is_deep() -> None:
    """merge combines nested dicts and replaces other values."""
    state = SharedState({"cfg": {"a": 1, "nested": {"x": 1}}, "list": [1]})
    state.merge({"cfg": {"b": 2, "nested": {"y": 2}}, "list": [2]})
    assert state.to_dict() == {"cfg": {"a": 1, "b": 2, "nested": {"x": 1, "y": 2}}, "list": [2]}
    assert state.version == 1


def test_snapshot_is_independent() -> None:
    """A snapshot never shows later changes, and changing it never changes the state."""
    state = SharedState({"a": [1]})
    snap = state.snapshot()
    state.set("a", [2])
    assert snap.data == {"a": [1]}
    assert snap.version.version == 0
    snap.data["a"].append(5)
    assert state.get("a") == [2]


def test_history_and_restore() -> None:
    """History lists versions newest first; restore brings back old data as a new version."""
    state = SharedState({"n": 0})
    for n in range(1, 4):
        state.set("n", n)
    assert [v.version for v in state.get_versions()] == [3, 2, 1, 0]
    assert [v.version for v in state.get_versions(limit=2)] == [3, 2]
    state.restore(1)
    assert state.get("n") == 1
    assert state.version == 4
    with pytest.raises(ValueError, match="not in the state's history"):
        state.restore(99)


def test_history_is_bounded() -> None:
    """Only the newest max_history versions are kept."""
    state = SharedState(max_history=3)
    for n in range(10):
        state.set("n", n)
    assert [v.version for v in state.get_versions()] == [10, 9, 8]
    with pytest.raises(ValueError, match="history"):
        state.restore(2)


def test_history_shares_untouched_subtrees() -> None:
    """Old versions keep their data even though changes copy only the path they touch."""
    state = SharedState({"big": {"k": list(range(100))}, "small": 0})
    state.set("small", 1)
    state.set("big.k", [])
    state.restore(1)
    assert state.to_dict() == {"big": {"k": list(range(100))}, "small": 1}


def test_on_change_receives_each_version() -> None:
    """on_change is called once per change with the new version."""
    seen: list[StateVersion] = []
    state = SharedState(on_change=seen.append)
    state.set("a", 1, agent_id="x")
    state.update({"b": 2, "c": 3})
    state.delete("a")
    state.delete("missing")
    assert [(v.version, v.agent_id, v.changed_fields) for v in seen] == [
        (1, "x", ["a"]),
        (2, None, ["b", "c"]),
        (3, None, ["a"]),
    ]


def test_from_snapshot_keeps_version() -> None:
    """A state rebuilt from a snapshot continues its version numbering."""
    original = SharedState()
    original.set("a", 1)
    original.set("b", 2)
    rebuilt = SharedState.from_snapshot(original.snapshot())
    assert rebuilt.version == 2
    assert rebuilt.to_dict() == {"a": 1, "b": 2}
    rebuilt.set("c", 3)
    assert rebuilt.version == 3


def test_arbitrary_values_are_kept_in_memory() -> None:
    """Values that cannot be stored may still live in memory (checkpointing refuses them)."""
    state = SharedState()
    value: Any = {1, 2}
    state.set("s", value)
    assert state.get("s") == {1, 2}
    assert state.get("s") is not value


def test_get_history_returns_snapshots_newest_first() -> None:
    """As in the seed: get_history gives StateSnapshots (data and version), newest first."""
    state = SharedState({"n": 0})
    for n in range(1, 4):
        state.set("n", n, agent_id="counter")
    history = state.get_history(limit=3)
    assert [type(s).__name__ for s in history] == ["StateSnapshot"] * 3
    assert [(s.data, s.version.version) for s in history] == [
        ({"n": 3}, 3),
        ({"n": 2}, 2),
        ({"n": 1}, 1),
    ]
    assert history[0].version.agent_id == "counter"
    history[0].data["n"] = 99
    assert state.get_history(1)[0].data == {"n": 3}
    assert len(state.get_history()) == 4


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_history_limits_are_checked(limit: Any) -> None:
    """A history limit that is not an int >= 1 (or None) raises InvalidArgumentError."""
    from aiocheckpoint import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="limit"):
        SharedState().get_history(limit)
    with pytest.raises(InvalidArgumentError, match="limit"):
        SharedState().get_versions(limit)


def test_append_shares_the_items_already_there_and_copies_the_new_ones() -> None:
    seen: list[StateVersion] = []
    state = SharedState({"chat": {"messages": [{"text": "hi"}]}}, seen.append)
    before = state._peek()[0]["chat"]["messages"]
    message = {"text": "hello"}
    state.append("chat.messages", message, {"text": "bye"}, agent_id="bot")
    after = state._peek()[0]["chat"]["messages"]
    assert after == [{"text": "hi"}, {"text": "hello"}, {"text": "bye"}]
    assert after is not before and after[0] is before[0]  # copy-on-write, items shared
    message["text"] = "changed"  # the caller's object, not the state's
    assert state.get("chat.messages")[1] == {"text": "hello"}
    assert before == [{"text": "hi"}]  # the previous version is untouched
    assert state.version == 1 and seen[-1].changed_fields == ["chat.messages"]
    state.append("new.list", 1)
    assert state.get("new.list") == [1]
    state.append("new.list")  # nothing to append: no new version
    assert state.version == 2


def test_append_to_a_non_list_raises_and_changes_nothing() -> None:
    state = SharedState({"a": {"b": 1}})
    with pytest.raises(TypeError):
        state.append("a.b", 2)
    with pytest.raises(TypeError):
        state.append("a", 2)
    assert state.version == 0 and state.to_dict() == {"a": {"b": 1}}
