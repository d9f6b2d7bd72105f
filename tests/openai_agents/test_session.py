"""The ``agents.memory.Session`` contract, from the protocol's documented behaviour.

Run on every backend, plain and encrypted: items come back in the order added; ``limit``
gives the latest N in chronological order (None: all, or ``session_settings.limit``);
``pop_item`` removes and returns the latest item, None when empty; ``clear_session``
removes every item; sessions are independent; another session object (another process)
on the same store sees the same items.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from agents.memory import Session, SessionSettings

from aiocheckpoint import CheckpointManager, InvalidArgumentError
from aiocheckpoint.integrations.openai_agents import AioCheckpointSession


def msg(n: int) -> Any:
    return {"role": "user", "content": f"m{n}"}


def contents(items: list[Any]) -> list[str]:
    return [item["content"] for item in items]


async def test_is_a_session(manager: CheckpointManager) -> None:
    session = AioCheckpointSession("s", manager)
    assert isinstance(session, Session)
    assert session.session_id == "s"
    assert session.session_settings is None


async def test_items_come_back_in_the_order_added(manager: CheckpointManager) -> None:
    session = AioCheckpointSession("s", manager)
    assert await session.get_items() == []
    await session.add_items([msg(0), msg(1)])
    await session.add_items([msg(2)])
    await session.add_items([])
    await session.add_items([msg(3), msg(4), msg(5)])
    assert contents(await session.get_items()) == [f"m{n}" for n in range(6)]
    assert await session.get_items() == [msg(n) for n in range(6)]


async def test_limit_is_the_latest_n_in_chronological_order(manager: CheckpointManager) -> None:
    session = AioCheckpointSession("s", manager)
    for first in range(0, 9, 3):
        await session.add_items([msg(first), msg(first + 1), msg(first + 2)])
    assert contents(await session.get_items(limit=1)) == ["m8"]
    assert contents(await session.get_items(limit=4)) == ["m5", "m6", "m7", "m8"]
    assert contents(await session.get_items(limit=9)) == [f"m{n}" for n in range(9)]
    assert contents(await session.get_items(limit=50)) == [f"m{n}" for n in range(9)]
    assert await session.get_items(limit=0) == []


async def test_session_settings_limit_is_the_default(manager: CheckpointManager) -> None:
    session = AioCheckpointSession("s", manager, session_settings=SessionSettings(limit=2))
    await session.add_items([msg(0), msg(1), msg(2)])
    assert contents(await session.get_items()) == ["m1", "m2"]
    assert contents(await session.get_items(limit=3)) == ["m0", "m1", "m2"]


async def test_a_negative_limit_is_refused(manager: CheckpointManager) -> None:
    session = AioCheckpointSession("s", manager)
    with pytest.raises(InvalidArgumentError):
        await session.get_items(limit=-1)


async def test_pop_item_returns_the_latest_then_none(manager: CheckpointManager) -> None:
    session = AioCheckpointSession("s", manager)
    assert await session.pop_item() is None
    await session.add_items([msg(0), msg(1)])
    await session.add_items([msg(2)])
    assert await session.pop_item() == msg(2)
    assert await session.pop_item() == msg(1)
    assert contents(await session.get_items()) == ["m0"]
    await session.add_items([msg(3)])
    assert contents(await session.get_items()) == ["m0", "m3"]
    assert await session.pop_item() == msg(3)
    assert await session.pop_item() == msg(0)
    assert await session.pop_item() is None
    assert await session.get_items() == []


async def test_clear_session_removes_every_item(manager: CheckpointManager) -> None:
    session = AioCheckpointSession("s", manager)
    await session.clear_session()
    await session.add_items([msg(0), msg(1)])
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    await session.add_items([msg(2)])
    assert await session.get_items() == [msg(2)]


async def test_sessions_are_independent(manager: CheckpointManager) -> None:
    one, two = AioCheckpointSession("one", manager), AioCheckpointSession("two", manager)
    await one.add_items([msg(1)])
    await two.add_items([msg(2)])
    await one.clear_session()
    assert await one.get_items() == []
    assert await two.get_items() == [msg(2)]


async def test_another_session_object_sees_the_same_items(manager: CheckpointManager) -> None:
    await AioCheckpointSession("s", manager).add_items([msg(0), msg(1)])
    again = AioCheckpointSession("s", manager)
    assert await again.pop_item() == msg(1)
    assert await AioCheckpointSession("s", manager).get_items() == [msg(0)]


async def test_unstorable_items_are_refused_and_change_nothing(manager: CheckpointManager) -> None:
    from aiocheckpoint import CheckpointSerializationError

    session = AioCheckpointSession("s", manager)
    await session.add_items([msg(0)])
    with pytest.raises(CheckpointSerializationError):
        await session.add_items([msg(1), {"role": "user", "content": object()}])  # type: ignore[list-item]
    assert await session.get_items() == [msg(0)]


async def test_eight_writers_in_one_process_lose_and_reorder_nothing(
    manager: CheckpointManager,
) -> None:
    async def writer(w: int) -> None:
        session = AioCheckpointSession("s", manager)
        for n in range(10):
            await session.add_items(
                [
                    {"role": "user", "content": f"{w}:{n}:a"},
                    {"role": "user", "content": f"{w}:{n}:b"},
                ]
            )

    async with anyio.create_task_group() as tg:
        for w in range(8):
            tg.start_soon(writer, w)
    items = contents(await AioCheckpointSession("s", manager).get_items())
    assert_whole_and_ordered(items, writers=range(8), batches=10)


def assert_whole_and_ordered(items: list[str], writers: range, batches: int) -> None:
    """Every writer's batches are all there, each whole (a then b), in the writer's order."""
    assert len(items) == len(writers) * batches * 2
    for i in range(0, len(items), 2):
        first, second = items[i].split(":"), items[i + 1].split(":")
        assert first[:2] == second[:2]
        assert (first[2], second[2]) == ("a", "b")
    for w in writers:
        seen = [int(item.split(":")[1]) for item in items[::2] if item.startswith(f"{w}:")]
        assert seen == list(range(batches))


async def test_bad_arguments_are_refused(manager: CheckpointManager) -> None:
    with pytest.raises(InvalidArgumentError):
        AioCheckpointSession("", manager)
    with pytest.raises(InvalidArgumentError):
        AioCheckpointSession("s", object())  # type: ignore[arg-type]
    session = AioCheckpointSession("s", manager)
    with pytest.raises(InvalidArgumentError):
        await session.add_items(msg(0))


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_runner_pools_never_claim_a_session(manager: CheckpointManager) -> None:
    """The session's record is finished, also when recreated after another writer's clear."""
    one, two = AioCheckpointSession("s", manager), AioCheckpointSession("s", manager)
    await one.add_items([msg(0)])
    await two.add_items([msg(1)])
    await one.clear_session()  # deletes the workflow, its record with it
    await two.add_items([msg(2)])
    await AioCheckpointSession("empty", manager).clear_session()
    assert await AioCheckpointSession("empty", manager).pop_item() is None
    record = await manager.get_workflow(two.workflow_id)
    assert record is not None
    assert record.status == "finished"
    assert await manager.claim_workflow("runner") is None
    assert await two.get_items() == [msg(2)]


async def test_a_session_id_too_long_for_a_workflow_id_is_refused_at_once(
    manager: CheckpointManager,
) -> None:
    from aiocheckpoint import InvalidWorkflowIdError

    with pytest.raises(InvalidWorkflowIdError):
        AioCheckpointSession("s" * 300, manager)
    with pytest.raises(InvalidWorkflowIdError):
        AioCheckpointSession("bad\x00id", manager)
