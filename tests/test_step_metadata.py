"""A step's metadata is stored as given: every typed kind round-trips through ``wf.step``.

``create_checkpoint(metadata=...)`` and ``wf.step(n, agent_id, metadata=...)`` store the
same values: COMPLETED, FAILED (the user's metadata beside the error) and BLOCKED, on every
backend, encrypted at rest or not.
"""

from __future__ import annotations

import dataclasses
import decimal
import os
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import (
    AgentStatus,
    CheckpointManager,
    Keyring,
    ResumableWorkflow,
    TaggedValue,
    TypeRegistry,
)
from tests.backend_support import ALL, make_storage
from tests.pg_support import pg_schema
from tests.typed_values import same

__all__ = ["pg_schema"]

ZONE = timezone(timedelta(hours=-3, minutes=-30))


@dataclasses.dataclass
class Ticket:
    number: int
    opened: datetime


def metadata() -> dict[str, Any]:
    """One value of every kind the value stage stores, and keys that look like tags."""
    return {
        "datetime": datetime(2026, 12, 7, 3, 4, 5, 6, tzinfo=ZONE),
        "naive": datetime(2020, 2, 29, 23, 59, 59),
        "date": date(2026, 12, 7),
        "time": time(1, 2, 3, 4, tzinfo=timezone.utc),
        "timedelta": timedelta(days=-1, seconds=5, microseconds=7),
        "uuid": uuid.UUID(int=7),
        "decimal": decimal.Decimal("-1.2300"),
        "bytes": b"\x00\xff",
        "bytearray": bytearray(b"\x01"),
        "tuple": (1, ("nested", 2.5)),
        "set": {1, 2},
        "frozenset": frozenset({"a"}),
        "map": {(1, "a"): "tuple key", 2: "int key"},
        "query": {"$gt": 5},
        "tag-like": {"$dt": "not a date", "$tup": [1]},
        "registered": Ticket(7, datetime(2026, 1, 1, tzinfo=timezone.utc)),
        "big": 7**70,
        "plain": {"list": [1, "x", None, True]},
    }


def registry() -> TypeRegistry:
    types = TypeRegistry()
    types.register(Ticket, name="Ticket")
    return types


@pytest.fixture(
    params=[(kind, sealed) for kind in ALL for sealed in (False, True)],
    ids=lambda param: f"{param[0]}-{'sealed' if param[1] else 'plain'}",
)
async def managers(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[Callable[..., CheckpointManager]]:
    """New managers on one store (each reads the stored record, not a copy it kept)."""
    kind, sealed = request.param
    keys = Keyring(keys={"k1": os.urandom(32)}, primary="k1") if sealed else None
    async with make_storage(kind, tmp_path, pg_schema) as store:

        def manager(typed: bool = True) -> CheckpointManager:
            return CheckpointManager(store, types=registry() if typed else None, encryption=keys)

        yield manager


class Boom(RuntimeError):
    pass


async def test_a_step_stores_its_typed_metadata_as_create_checkpoint_does(
    managers: Callable[..., CheckpointManager],
) -> None:
    """COMPLETED and FAILED steps store the user's metadata as given, read back exactly."""
    manager = managers()
    direct = metadata()
    await manager.create_checkpoint("direct", 0, "a", "completed", {}, metadata=direct)
    given = metadata()
    async with ResumableWorkflow("wf", manager) as wf:
        async with wf.step(0, "a", metadata=given):
            given["datetime"] = "changed by the body"  # the step's copy was taken on entry
        with pytest.raises(Boom):
            async with wf.step(1, "a", metadata=metadata()):
                raise Boom("no luck")
    fresh = managers()
    assert same(metadata(), (await fresh.get_checkpoint("direct", 0)).metadata)
    completed = await fresh.get_checkpoint("wf", 0)
    assert completed.status is AgentStatus.COMPLETED
    assert same(metadata(), completed.metadata)
    failed = await fresh.get_checkpoint("wf", 1)
    assert failed.status is AgentStatus.FAILED
    error = {"type": "Boom", "message": "no luck"}
    assert same({**metadata(), "error": error}, failed.metadata)


async def test_a_paused_step_keeps_its_typed_metadata_beside_the_pause(
    managers: Callable[..., CheckpointManager],
) -> None:
    """A step that pauses stores its metadata and the pause's data, typed, read back exactly."""
    manager = managers()
    given = metadata()
    async with ResumableWorkflow("wf", manager) as wf:
        async with wf.step(0, "a", metadata=given):
            given.clear()  # the step's copy was taken on entry
            await wf.pause("approve", data={"until": date(2027, 1, 1)})
    blocked = await managers().get_checkpoint("wf", 0)
    assert blocked.status is AgentStatus.BLOCKED
    pause = {"pause": {"reason": "approve", "data": {"until": date(2027, 1, 1)}}}
    assert same({**metadata(), **pause}, blocked.metadata)


async def test_a_value_of_an_unknown_type_passes_through_a_step_as_it_was_read(
    managers: Callable[..., CheckpointManager],
) -> None:
    """A TaggedValue (read raw, of a type this manager does not know) is stored as the
    value it stands for, as create_checkpoint stores it: a manager that knows it reads it."""
    manager = managers(typed=False)
    raw = TaggedValue("Ticket", 1, {"number": 3, "opened": datetime(2026, 1, 1)})
    async with ResumableWorkflow("wf", manager) as wf:
        async with wf.step(0, "a", metadata={"ticket": raw}):
            pass
    assert (await manager.get_checkpoint("wf", 0, raw=True)).metadata == {"ticket": raw}
    back = await managers().get_checkpoint("wf", 0)
    assert same({"ticket": Ticket(3, datetime(2026, 1, 1))}, back.metadata)
