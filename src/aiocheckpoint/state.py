"""SharedState: a workflow's in-memory state with dot paths, versions and history."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._validation import check_limit
from .codec import Lineage, json_copy
from .models import StateSnapshot, StateVersion, utcnow

__all__ = ["SharedState"]

_MISSING: Any = object()
#: How many earlier lists an appended list names as its prefixes (the newest first).
_LINEAGE = 8
#: Appended lists whose lineage is kept, the latest (a list appended to again hands its
#: entry on): lineages are hints, a list without one is compared element by element, and
#: they keep their lists alive.
_LINEAGES = 16


def _split(path: str) -> list[str]:
    if not isinstance(path, str) or not path:
        raise ValueError(f"a state path must be a non-empty str, got {path!r}")
    parts = path.split(".")
    if "" in parts:
        raise ValueError(f"state path {path!r} has an empty segment")
    return parts


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, Mapping):
            merged[key] = _deep_merge(current, value)
        else:
            merged[key] = json_copy(value)
    return merged


def _copy_version(version: StateVersion) -> StateVersion:
    # StateVersion is frozen, but its changed_fields list is not: never hand out ours.
    return version.model_copy(update={"changed_fields": list(version.changed_fields)})


class SharedState:
    """The state of one workflow, shared by its agents.

    Values are addressed by dot paths (``"research.results"`` is
    ``data["research"]["results"]``). Every change bumps :attr:`version` by one and is kept in
    a bounded history that :meth:`restore` can go back to. Values passed in and handed out are
    copies: changing them never changes the state, and vice versa.

    Internally the tree is never mutated in place: a change copies only the dicts along its
    path, so history entries share every untouched sub-tree and a change costs the depth of
    its path, not the size of the state.

    ``on_change``, if given, is called with the new :class:`StateVersion` after each change.
    """

    def __init__(
        self,
        initial_data: Mapping[str, Any] | None = None,
        on_change: Callable[[StateVersion], None] | None = None,
        *,
        max_history: int = 100,
    ) -> None:
        if max_history < 1:
            raise ValueError("max_history must be at least 1")
        self._data: dict[str, Any] = json_copy(dict(initial_data or {}))
        self._on_change = on_change
        first = StateVersion(version=0, timestamp=utcnow(), agent_id=None, changed_fields=[])
        self._history: deque[tuple[StateVersion, dict[str, Any]]] = deque(
            [(first, self._data)], maxlen=max_history
        )
        #: By id of a list :meth:`append` made: its lineage (see :meth:`_lineages`).
        self._grown: dict[int, Lineage] = {}

    @classmethod
    def from_snapshot(
        cls,
        snapshot: StateSnapshot,
        on_change: Callable[[StateVersion], None] | None = None,
        *,
        max_history: int = 100,
    ) -> SharedState:
        """Rebuild a state from a snapshot, keeping the snapshot's version number."""
        state = cls(snapshot.data, on_change, max_history=max_history)
        state._history[0] = (snapshot.version, state._data)
        return state

    @property
    def version(self) -> int:
        """The current version: 0 for a new state, +1 per change."""
        return self._history[-1][0].version

    def get(self, path: str, default: Any = None) -> Any:
        """Return a copy of the value at ``path``, or ``default`` when there is none."""
        node: Any = self._data
        for part in _split(path):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return json_copy(node)

    def set(self, path: str, value: Any, agent_id: str | None = None) -> None:
        """Set the value at ``path`` (intermediate dicts are created), as one new version."""
        self.update({path: value}, agent_id)

    def update(self, values: Mapping[str, Any], agent_id: str | None = None) -> None:
        """Set several paths at once, as a single new version (none if ``values`` is empty)."""
        if not values:
            return
        data = self._data
        for path, value in values.items():
            data = self._with(data, _split(path), json_copy(value), path)
        self._commit(data, agent_id, list(values))

    def delete(self, path: str, agent_id: str | None = None) -> bool:
        """Remove the value at ``path``; return whether it existed (no version bump if not)."""
        parts = _split(path)
        node: Any = self._data
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or parts[-1] not in node:
            return False
        self._commit(self._with(self._data, parts, _MISSING, path), agent_id, [path])
        return True

    def append(self, path: str, *values: Any, agent_id: str | None = None) -> None:
        """Append ``values`` to the list at ``path`` (a new list if none), as one new version.

        The new list shares the items already there (only the new ones are copied), so a
        growing list costs one pointer per item, and a checkpoint re-encodes only what is
        new. Raises ``TypeError`` if the value at ``path`` is not a list.
        """
        if not values:
            return
        current: Any = self._data
        for part in _split(path):
            current = current.get(part, _MISSING) if isinstance(current, dict) else _MISSING
        if current is _MISSING:
            current = []
        if not isinstance(current, list):
            raise TypeError(f"cannot append to {path!r}: it is a {type(current).__name__}")
        items = [*current, *json_copy(list(values))]
        self._note_grown(items, current)
        self._commit(self._with(self._data, _split(path), items, path), agent_id, [path])

    def _note_grown(self, items: list[Any], base: list[Any]) -> None:
        """Note that ``items`` starts with ``base``'s elements and those ``base`` started with."""
        grown = self._grown
        known = grown.pop(id(base), None)
        older = known[1] if known is not None and known[0] is base else ()
        if len(grown) >= _LINEAGES:
            del grown[next(iter(grown))]  # the oldest
        grown[id(items)] = (items, (base, *older)[:_LINEAGE])

    def _lineages(self) -> Mapping[int, Lineage]:
        """Lists :meth:`append` made, by id: each with the lists it extends, newest first.

        The tree's lists are never changed in place, so a list that another one extends
        stays its prefix: a checkpoint of a growing list resumes the list's last cut without
        comparing the elements before it one by one (:mod:`aiocheckpoint.codec.tree.subtrees`).
        A lineage found here is for the list whose id it is only if its list is that list.
        """
        return self._grown

    def merge(self, data: Mapping[str, Any], agent_id: str | None = None) -> None:
        """Deep-merge ``data`` into the state (nested dicts merge, other values replace)."""
        if not data:
            return
        self._commit(_deep_merge(self._data, data), agent_id, list(data))

    def snapshot(self, metadata: Mapping[str, Any] | None = None) -> StateSnapshot:
        """Return an independent deep copy of the current state and its version."""
        return StateSnapshot(
            data=json_copy(self._data),
            version=_copy_version(self._history[-1][0]),
            metadata=json_copy(dict(metadata or {})),
        )

    def get_history(self, limit: int | None = None) -> list[StateSnapshot]:
        """Snapshots of the recorded versions (data and version), most recent first.

        At most ``limit`` of them (an int >= 1, or None for the whole bounded history);
        each is an independent copy, as from :meth:`snapshot`. :meth:`get_versions` lists
        the versions alone, without copying any data.
        """
        entries = self._newest(limit)
        return [
            StateSnapshot(data=json_copy(data), version=_copy_version(version))
            for version, data in entries
        ]

    def get_versions(self, limit: int | None = None) -> list[StateVersion]:
        """The recorded versions, most recent first (at most ``limit``), without their data."""
        return [_copy_version(version) for version, _data in self._newest(limit)]

    def _newest(self, limit: int | None) -> list[tuple[StateVersion, dict[str, Any]]]:
        count = check_limit(limit)
        entries = list(reversed(self._history))
        return entries if count is None else entries[:count]

    def restore(self, version: int, agent_id: str | None = None) -> None:
        """Go back to the data of an earlier ``version``; this is itself a new version.

        Raises ``ValueError`` if that version is no longer in the (bounded) history.
        """
        for recorded, data in self._history:
            if recorded.version == version:
                self._commit(data, agent_id, [f"restore:{version}"])
                return
        raise ValueError(f"version {version} is not in the state's history")

    def to_dict(self) -> dict[str, Any]:
        """Return a deep copy of the whole state."""
        data: dict[str, Any] = json_copy(self._data)
        return data

    def _peek(self) -> tuple[dict[str, Any], StateVersion]:
        """The live data and version, uncopied: for callers that copy it themselves."""
        return self._data, self._history[-1][0]

    def _mark(self) -> tuple[StateVersion, dict[str, Any]]:
        """The current history entry, for :meth:`_rewind`."""
        return self._history[-1]

    def _rewind(self, mark: tuple[StateVersion, dict[str, Any]]) -> None:
        """Drop every change made after ``mark`` (no callback: nothing new happened)."""
        while self._history and self._history[-1][0].version > mark[0].version:
            self._history.pop()
        if not self._history or self._history[-1] is not mark:
            self._history.append(mark)
        self._data = mark[1]

    def __repr__(self) -> str:
        return f"SharedState(version={self.version}, keys={list(self._data)!r})"

    def _with(self, node: Any, parts: list[str], value: Any, path: str) -> dict[str, Any]:
        """Return a copy of dict ``node`` with ``parts`` set to ``value`` (or removed)."""
        if not isinstance(node, dict):
            raise TypeError(f"cannot set {path!r}: a parent is a {type(node).__name__}, not a dict")
        copy = dict(node)
        head = parts[0]
        if len(parts) == 1:
            if value is _MISSING:
                del copy[head]
            else:
                copy[head] = value
        else:
            copy[head] = self._with(node.get(head, {}), parts[1:], value, path)
        return copy

    def _commit(self, data: dict[str, Any], agent_id: str | None, fields: Iterable[str]) -> None:
        new = StateVersion(
            version=self.version + 1,
            timestamp=utcnow(),
            agent_id=agent_id,
            changed_fields=list(fields),
        )
        self._data = data
        self._history.append((new, data))
        if self._on_change is not None:
            self._on_change(_copy_version(new))
