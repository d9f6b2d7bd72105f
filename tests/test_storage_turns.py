"""storage.turns: a batch's rows handled in stretches, with the loop or the GIL let go between."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from aiocheckpoint.storage import turns


async def test_in_turns_maps_every_item_in_order_and_lets_other_tasks_run() -> None:
    ran: list[int] = []
    items = list(range(3 * turns.ROWS + 5))

    async def other() -> None:
        while True:
            ran.append(len(ran))
            await asyncio.sleep(0)

    task = asyncio.ensure_future(other())
    await asyncio.sleep(0)  # started
    before = len(ran)
    try:
        assert await turns.in_turns(lambda n: n * 3, items) == [n * 3 for n in items]
        # One break between each stretch of ROWS: the other task ran at least 3 times.
        assert len(ran) - before >= 3
    finally:
        task.cancel()
    assert await turns.in_turns(str, []) == []


def test_gil_breaks_yields_every_row_and_sleeps_between_stretches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    rows = list(range(2 * turns.ROWS + 1))
    original = time.sleep

    def counting(seconds: float) -> None:
        if threading.current_thread() is worker:
            slept.append(seconds)
        original(seconds)

    got: list[int] = []
    worker = threading.Thread(target=lambda: got.extend(turns.gil_breaks(rows)))
    monkeypatch.setattr(turns.time, "sleep", counting)
    worker.start()
    worker.join()
    assert got == rows
    assert slept == [0, 0]
