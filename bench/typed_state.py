"""What typed state costs: the plain hot path before/after, and 100 pydantic messages.

Not a test: it prints one JSON line per figure, then the ratios. Every figure is the best of
several runs of ``time.thread_time()`` (noise only adds), and each comparison alternates its
rows in the same run, so a loaded machine slows both sides alike.

* ``plain``: ``create_checkpoint`` of the ~1 KB bench state (plain JSON) on a memory storage
  whose ``save`` returns at once, and ``get_checkpoint`` of it, for the checkout given by
  ``--baseline`` (for example ``/work/main/src``) and for this one, each in its own
  subprocess, alternating ``--rounds`` times.
* ``messages``: a state of 100 pydantic messages (an enum, a datetime, a UUID, a list of
  tool calls each) written with ``create_checkpoint`` and read with ``get_checkpoint``,
  against the floor (``model_dump_json`` + ``model_validate_json`` of each message by hand)
  and against LangGraph's ``JsonPlusSerializer`` (``dumps_typed`` + ``loads_typed``, from
  the ``bench`` extra) on the same objects.

Usage: ``python bench/typed_state.py [--baseline SRC_DIR] [--rounds N]``
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent

_PLAIN = """
import asyncio, json, sys, time
sys.path[:0] = [{src!r}, {root!r}]
from aiocheckpoint import CheckpointManager
from aiocheckpoint.storage.memory import InMemoryCheckpointStorage
from bench.data import small_state

class Null(InMemoryCheckpointStorage):
    async def save(self, workflow_id, step, data, **_):
        self.last = data

async def main():
    state = small_state(3)
    manager = CheckpointManager(Null())
    writes = []
    for _ in range(5):
        start = time.thread_time()
        for step in range(4000):
            await manager.create_checkpoint("wf-0001", step, "bench", "completed", state)
        writes.append((time.thread_time() - start) / 4000 * 1e6)
    reader = CheckpointManager()
    await reader.create_checkpoint("wf-0001", 0, "bench", "completed", state)
    reads = []
    for _ in range(5):
        start = time.thread_time()
        for _ in range(4000):
            await reader.get_checkpoint("wf-0001", 0)
        reads.append((time.thread_time() - start) / 4000 * 1e6)
    print(json.dumps({{"write_us": min(writes), "read_us": min(reads)}}))

asyncio.run(main())
"""


def emit(**figures: Any) -> None:
    """One JSON line of figures."""
    print(json.dumps(figures), flush=True)


def plain(baseline: str, rounds: int) -> None:
    """The ~1 KB plain state, before (``baseline``) and after (this checkout), alternated."""
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(rounds):
        for name, src in (("before", baseline), ("after", str(ROOT / "src"))):
            code = _PLAIN.format(src=src, root=str(ROOT))
            out = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            )
            runs[name].append(json.loads(out.stdout))
    for name, rows in runs.items():
        emit(
            figure=f"plain ~1 KB state, {name}",
            create_us=round(min(r["write_us"] for r in rows), 2),
            get_us=round(min(r["read_us"] for r in rows), 2),
        )
    for key in ("write_us", "read_us"):
        after = min(r[key] for r in runs["after"])
        before = min(r[key] for r in runs["before"])
        emit(figure=f"plain ~1 KB state, after/before {key}", ratio=round(after / before, 3))


class Role(enum.Enum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ToolCall(BaseModel):
    name: str
    arguments: dict[str, Any]


class Message(BaseModel):
    id: uuid.UUID
    role: Role
    content: str
    created: datetime
    tool_calls: list[ToolCall] = []


def messages(n: int = 100) -> list[Message]:
    """``n`` agent messages of ~300 bytes of JSON each."""
    start = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
    return [
        Message(
            id=uuid.UUID(int=i),
            role=list(Role)[i % 3],
            content=f"message {i}: " + "lorem ipsum dolor sit amet " * 6,
            created=start + timedelta(seconds=i),
            tool_calls=[ToolCall(name="search", arguments={"q": f"query {i}", "k": 5})]
            if i % 3 == 1
            else [],
        )
        for i in range(n)
    ]


def _best_us(fn: Callable[[], object], number: int = 200, repeat: int = 7) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        for _ in range(number):
            fn()
        best = min(best, (time.thread_time() - start) / number * 1e6)
    return best


def typed_messages() -> None:
    """100 messages: ours (write, read) against the floor and against JsonPlusSerializer."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from aiocheckpoint import CheckpointManager, TypeRegistry

    types = TypeRegistry()
    for cls in (Message, ToolCall, Role):
        types.register(cls)
    msgs = messages()
    state = {"messages": msgs}
    loop = asyncio.new_event_loop()
    manager = CheckpointManager(types=types)
    loop.run_until_complete(manager.create_checkpoint("wf", 0, "a", "completed", state))
    texts = [m.model_dump_json() for m in msgs]
    serde = JsonPlusSerializer()
    typed = serde.dumps_typed(state)
    assert serde.loads_typed(typed) == state
    read = loop.run_until_complete(manager.get_checkpoint("wf", 0)).state_snapshot.data
    assert read == state
    rows: dict[str, Callable[[], object]] = {
        "ours write (create_checkpoint)": lambda: loop.run_until_complete(
            manager.create_checkpoint("wf", 1, "a", "completed", state)
        ),
        "ours read (get_checkpoint)": lambda: loop.run_until_complete(
            manager.get_checkpoint("wf", 0)
        ),
        "floor write (model_dump_json)": lambda: [m.model_dump_json() for m in msgs],
        "floor read (model_validate_json)": lambda: [Message.model_validate_json(t) for t in texts],
        "JsonPlusSerializer write (dumps_typed)": lambda: serde.dumps_typed(state),
        "JsonPlusSerializer read (loads_typed)": lambda: serde.loads_typed(typed),
    }
    best = {name: float("inf") for name in rows}
    for _ in range(3):  # alternate the rows: a load spike slows them all alike
        for name, fn in rows.items():
            best[name] = min(best[name], _best_us(fn, number=50, repeat=3))
    for name, us in best.items():
        emit(figure=f"100 messages: {name}", cpu_us=round(us, 1))
    ours = best["ours write (create_checkpoint)"] + best["ours read (get_checkpoint)"]
    floor = best["floor write (model_dump_json)"] + best["floor read (model_validate_json)"]
    plus = (
        best["JsonPlusSerializer write (dumps_typed)"]
        + best["JsonPlusSerializer read (loads_typed)"]
    )
    emit(figure="100 messages: ours/floor (write + read)", ratio=round(ours / floor, 2))
    emit(figure="100 messages: ours/JsonPlusSerializer (write + read)", ratio=round(ours / plus, 2))
    loop.close()


def main() -> None:
    """Parse arguments and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="the src/ directory of the checkout to compare with")
    parser.add_argument("--rounds", type=int, default=5, help="alternations (5)")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    if args.baseline:
        plain(args.baseline, args.rounds)
    typed_messages()


if __name__ == "__main__":
    main()
