"""Agent Framework workflows for the tests: real executors, run by the framework's runner.

``build_orders``: ``intake`` turns an order id into an ``Order`` (a registered dataclass
holding a tuple and a datetime) and fans it out to ``price`` and, through ``relay`` (one
superstep later), ``stock``; their results fan in to ``pack``, which loops the order back
to ``intake`` for its next round until three rounds are done, keeping typed values (a
tuple, a set, a datetime, a ``Decimal``) in the workflow state. A fan-in buffer holding
``price``'s message (in the state) and in-flight messages sit in its checkpoints.

``build_approval``: ``ask`` requests a human's answer (a ``request_info`` event, an
``Order`` asking for a ``str``); ``ask``'s response handler yields the verdict. Its
checkpoint holds the pending request.

``build_counter``: a small loop with a per-step delay, for the crash test.
"""

from __future__ import annotations

import dataclasses
import decimal
from datetime import datetime, timedelta, timezone
from typing import Any

import anyio
from agent_framework import (
    Executor,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    executor,
    handler,
    response_handler,
)

from aiocheckpoint import TypeRegistry

ORDERS = "orders"
APPROVAL = "approval"
COUNTER = "counter"
ROUNDS = 3
START = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))


@dataclasses.dataclass
class Order:
    """An order: its id, round, items and when it was placed."""

    order_id: str
    round: int
    items: tuple[str, ...]
    placed: datetime


@dataclasses.dataclass
class Priced:
    """An order's price, from ``price``."""

    order_id: str
    total: decimal.Decimal


def registry() -> TypeRegistry:
    """The manager's types for these workflows."""
    types = TypeRegistry()
    types.register(Order, name="tests.Order")
    types.register(Priced, name="tests.Priced")
    return types


#: The framework's file storage needs the same classes let through its unpickler.
FILE_ALLOWED = [f"{__name__}:Order", f"{__name__}:Priced"]


def build_orders(storage: Any) -> Workflow:
    """The order workflow (module docstring), checkpointing to ``storage``."""

    @executor(id="intake")
    async def intake(message: str | Order, ctx: WorkflowContext[Order]) -> None:
        if isinstance(message, str):
            order = Order(message, 0, ("apple", "pear"), START)
        else:
            order = dataclasses.replace(
                message, round=message.round + 1, items=(*message.items, f"extra{message.round}")
            )
        ctx.set_state("placed", order.placed + timedelta(days=order.round))
        await ctx.send_message(order)

    @executor(id="price")
    async def price(order: Order, ctx: WorkflowContext[Priced]) -> None:
        total = decimal.Decimal("1.25") * len(order.items) + order.round
        await ctx.send_message(Priced(order.order_id, total))

    @executor(id="relay")
    async def relay(order: Order, ctx: WorkflowContext[Order]) -> None:
        await ctx.send_message(order)

    @executor(id="stock")
    async def stock(order: Order, ctx: WorkflowContext[tuple[str, int]]) -> None:
        await ctx.send_message((order.order_id, len(order.items) * 10))

    @executor(id="pack")
    async def pack(results: list[Any], ctx: WorkflowContext[Order, str]) -> None:
        priced = next(r for r in results if isinstance(r, Priced))
        stocked = next(r for r in results if isinstance(r, tuple))
        history = [*(ctx.get_state("history") or []), (str(priced.total), stocked[1])]
        ctx.set_state("history", history)
        ctx.set_state("seen", {*(ctx.get_state("seen") or set()), priced.total})
        rounds = len(history)
        if rounds >= ROUNDS:
            await ctx.yield_output(
                f"{priced.order_id}: {history} seen={sorted(ctx.get_state('seen'))} "
                f"placed={ctx.get_state('placed').isoformat()}"
            )
        else:
            order = Order(priced.order_id, rounds - 1, ("apple", "pear"), START)
            for n in range(rounds - 1):
                order = dataclasses.replace(order, items=(*order.items, f"extra{n}"))
            await ctx.send_message(order)

    return (
        WorkflowBuilder(name=ORDERS, start_executor=intake, checkpoint_storage=storage)
        .add_fan_out_edges(intake, [price, relay])
        .add_edge(relay, stock)
        .add_fan_in_edges([price, stock], pack)
        .add_edge(pack, intake)
        .build()
    )


class Ask(Executor):
    """Asks a human about an order, then yields the verdict."""

    def __init__(self) -> None:
        super().__init__(id="ask")

    @handler
    async def start(self, order_id: str, ctx: WorkflowContext[Order]) -> None:
        """Request an answer about the order."""
        ctx.set_state("asked", START)
        await ctx.request_info(Order(order_id, 0, ("apple",), START), str)

    @response_handler
    async def answered(self, request: Order, answer: str, ctx: WorkflowContext[str, str]) -> None:
        """Yield the human's answer."""
        await ctx.yield_output(f"{request.order_id} {request.items}: {answer}")


def build_approval(storage: Any) -> Workflow:
    """The approval workflow (module docstring), checkpointing to ``storage``."""
    return WorkflowBuilder(name=APPROVAL, start_executor=Ask(), checkpoint_storage=storage).build()


def build_counter(storage: Any, delay: float = 0.0) -> Workflow:
    """``add`` sums into the state and passes n + 1 to ``check``, which loops below 5.

    ``delay`` seconds of sleep in each step give a killer time to land mid-run.
    """

    @executor(id="add")
    async def add(n: int, ctx: WorkflowContext[int]) -> None:
        await anyio.sleep(delay)
        ctx.set_state("total", (ctx.get_state("total") or 0) + n)
        ctx.set_state("seen", (*(ctx.get_state("seen") or ()), n))
        await ctx.send_message(n + 1)

    @executor(id="check")
    async def check(n: int, ctx: WorkflowContext[int, str]) -> None:
        if n > 4:
            await ctx.yield_output(f"total={ctx.get_state('total')} seen={ctx.get_state('seen')}")
        else:
            await ctx.send_message(n)

    builder = WorkflowBuilder(name=COUNTER, start_executor=add, checkpoint_storage=storage)
    return builder.add_edge(add, check).add_edge(check, add).build()
