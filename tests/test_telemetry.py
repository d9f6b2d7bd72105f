"""OpenTelemetry spans and metrics, read back from the SDK's in-memory exporters.

Each test installs the SDK as the global providers (tests/otel_support.py) and runs real
workflows on real backends; the last tests check that without the package nothing is
imported and the decorated methods are the methods themselves.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from aiocheckpoint import (
    CheckpointManager,
    InMemoryCheckpointStorage,
    Keyring,
    LeaseLostError,
    ResumableWorkflow,
    RetentionPolicy,
    StorageBackendError,
)
from aiocheckpoint import _telemetry as telemetry
from aiocheckpoint.codec.effects import EffectRecord, EffectState
from aiocheckpoint.effects import idempotency_key
from aiocheckpoint.storage.base import CheckpointStorage
from aiocheckpoint.storage.sqlite import SQLiteCheckpointStorage
from tests.backend_support import any_storage, blob_storage, leasing_storage, pg_schema
from tests.otel_support import Telemetry, installed

APP = trace.get_tracer("the-application")

__all__ = ["any_storage", "blob_storage", "leasing_storage", "pg_schema"]


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    with installed() as found:
        yield found


async def _run(manager: CheckpointManager, steps: range, *, owner: str | None) -> None:
    async with ResumableWorkflow("wf", manager, lease_owner=owner) as wf:
        for step in steps:
            if wf.is_completed(step):
                continue
            async with wf.step(step, agent_id="agent"):
                wf.state.set(f"answer-{step}", "x" * 1000)
                await wf.effect("notify", anyio.sleep, 0)


def _parent(span: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan | None:
    parent = span.parent
    return next((s for s in spans if parent and s.context.span_id == parent.span_id), None)


async def test_a_workflow_run_on_each_backend(
    otel: Telemetry, any_storage: CheckpointStorage
) -> None:
    manager = CheckpointManager(any_storage)
    owner = "runner" if manager.supports_workflow_records() else None
    with APP.start_as_current_span("caller") as caller:
        await _run(manager, range(2), owner=owner)
    spans = otel.finished()
    system = any_storage.db_system  # type: ignore[attr-defined]
    ours = [s for s in spans if s.name != "caller"]
    assert {s.context.trace_id for s in ours} == {caller.get_span_context().trace_id}
    saves = otel.named("aiocheckpoint.create_checkpoint")
    assert [s.attributes["aiocheckpoint.step"] for s in saves] == [0, 1]
    for save in saves:
        assert save.parent is not None
        assert save.parent.span_id == caller.get_span_context().span_id
        assert save.attributes["aiocheckpoint.workflow.id"] == "wf"
        (child,) = [s for s in spans if _parent(s, spans) is save]
        assert child.name == f"save {system}"
        assert child.kind is SpanKind.CLIENT
        assert child.attributes["db.system.name"] == system
        assert child.attributes["db.operation.name"] == "save"
        assert int(child.attributes["aiocheckpoint.write.size"]) > 1000
    effects = otel.named("aiocheckpoint.effect")
    assert [s.attributes["aiocheckpoint.effect.key"] for s in effects] == ["notify", "notify"]
    assert {_parent(s, spans).name for s in ours if s.kind is SpanKind.CLIENT} >= {  # type: ignore[union-attr]
        "aiocheckpoint.create_checkpoint",
        "aiocheckpoint.effect",
        "aiocheckpoint.get_resume_point",
    }
    assert otel.total("aiocheckpoint.checkpoint.save.duration", **{"db.system.name": system}) == 2
    assert otel.total("aiocheckpoint.checkpoint.load.duration") == 1  # the resume point
    assert otel.total("aiocheckpoint.storage.bytes_written", **{"db.operation.name": "save"}) > 2000
    assert (
        otel.total("aiocheckpoint.storage.bytes_written", **{"db.operation.name": "put_effect"}) > 0
    )
    assert otel.total("aiocheckpoint.lease.acquisitions") == (1 if owner else 0)
    assert otel.total("aiocheckpoint.lease.losses") == 0


async def test_an_incremental_save_is_one_batch_of_a_record_and_its_blobs(
    otel: Telemetry, blob_storage: CheckpointStorage
) -> None:
    manager = CheckpointManager(blob_storage)
    state = {f"part-{n}": [f"{n}-{i}" for i in range(400)] for n in range(20)}  # ~150 KB
    await manager.create_checkpoint("wf", 0, "agent", "completed", state)
    (save,) = otel.named(f"save_tree {blob_storage.db_system}")  # type: ignore[attr-defined]
    assert int(save.attributes["db.operation.batch.size"]) > 2
    assert int(save.attributes["aiocheckpoint.write.size"]) > 10_000
    written = otel.total(
        "aiocheckpoint.storage.bytes_written", **{"db.operation.name": "save_tree"}
    )
    assert written == save.attributes["aiocheckpoint.write.size"]


async def test_a_resumed_workflow_shows_its_resume_and_only_the_steps_left(
    otel: Telemetry,
) -> None:
    manager = CheckpointManager()
    await _run(manager, range(1), owner="runner")
    otel.spans.clear()
    with APP.start_as_current_span("second run"):
        await _run(manager, range(3), owner="runner")
    spans = otel.finished()
    (resume,) = otel.named("aiocheckpoint.resume")
    assert resume.attributes["aiocheckpoint.resume.step"] == 1
    (point,) = otel.named("aiocheckpoint.get_resume_point")
    assert _parent(point, spans) is resume
    assert [s.name for s in spans if _parent(s, spans) is point] == ["load aiocheckpoint.memory"]
    saves = otel.named("aiocheckpoint.create_checkpoint")
    assert [s.attributes["aiocheckpoint.step"] for s in saves] == [1, 2]
    assert resume.end_time is not None
    assert all(resume.end_time <= s.start_time for s in saves)  # type: ignore[operator]


class _FailingSaves(InMemoryCheckpointStorage):
    async def save(self, *args: Any, **kwargs: Any) -> None:
        raise StorageBackendError("the disk is on fire")


async def test_a_failing_save_is_an_error_on_both_spans(otel: Telemetry) -> None:
    manager = CheckpointManager(_FailingSaves())
    with pytest.raises(StorageBackendError):
        await manager.create_checkpoint("wf", 0, "agent", "completed", {"a": 1})
    (save,) = otel.named("aiocheckpoint.create_checkpoint")
    (child,) = otel.named("save aiocheckpoint.memory")
    for span in (save, child):
        assert span.status.status_code is StatusCode.ERROR
        assert "the disk is on fire" in (span.status.description or "")
        assert span.attributes["error.type"] == "StorageBackendError"
        assert [event.name for event in span.events] == ["exception"]
    failed = {"error.type": "StorageBackendError"}
    assert otel.total("aiocheckpoint.checkpoint.save.duration", **failed) == 1


async def test_a_lost_lease_is_counted_once_per_refused_operation(otel: Telemetry) -> None:
    manager = CheckpointManager()
    stale = await manager.acquire_lease("wf", "runner-a", ttl=0.05)
    await anyio.sleep(0.1)
    await manager.acquire_lease("wf", "runner-b", ttl=30)
    with pytest.raises(LeaseLostError):
        await manager.create_checkpoint("wf", 0, "agent", "completed", {}, lease=stale)
    with pytest.raises(LeaseLostError):
        await manager.renew_lease(stale)
    assert otel.total("aiocheckpoint.lease.acquisitions") == 2
    assert otel.total("aiocheckpoint.lease.losses") == 2
    (save,) = otel.named("aiocheckpoint.create_checkpoint")
    assert save.attributes["aiocheckpoint.lease.owner"] == "runner-a"
    assert save.status.status_code is StatusCode.ERROR


async def test_an_effect_found_in_doubt_is_counted_and_marked_on_its_span(
    otel: Telemetry,
) -> None:
    manager = CheckpointManager()
    intent = EffectRecord(
        workflow_id="wf",
        step=0,
        key="charge",
        name="charge",
        state=EffectState.IN_DOUBT,
        attempt=1,
        intent_at=datetime.now(timezone.utc),
        idempotency_key=idempotency_key("wf", 0, "charge"),
    )
    await manager.record_effect(intent)

    async def charge(idempotency_key: str) -> str:
        return idempotency_key

    async with ResumableWorkflow("wf", manager) as wf:
        async with wf.step(0, agent_id="agent"):
            await wf.effect("charge", charge, idempotent=True)
    assert otel.total("aiocheckpoint.effect.in_doubt") == 1
    (effect,) = otel.named("aiocheckpoint.effect")
    assert [event.name for event in effect.events] == ["aiocheckpoint.effect.in_doubt"]


SECRET = "card 4242-4242 of zq-secret-customer declined"


class Declined(Exception):
    pass


async def _failing_effect(manager: CheckpointManager) -> None:
    async def charge() -> None:
        raise Declined(SECRET)

    with pytest.raises(Declined):
        async with ResumableWorkflow("wf", manager) as wf:
            async with wf.step(0, agent_id="agent"):
                await wf.effect("charge", charge)


@pytest.mark.parametrize("sealed", [True, False], ids=["encrypted", "plain"])
async def test_an_effects_error_message_stays_off_spans_when_the_store_encrypts_it(
    otel: Telemetry, any_storage: CheckpointStorage, sealed: bool
) -> None:
    """Encrypted at rest, a failed effect's span has its error's type, not its message (nor
    a traceback, whose last line is the message); the sealed record keeps the message. A
    store without encryption puts the message on the span, as for any failed call."""
    keys = Keyring(keys={"k1": os.urandom(32)}, primary="k1") if sealed else None
    manager = CheckpointManager(any_storage, encryption=keys)
    await _failing_effect(manager)
    (effect,) = otel.named("aiocheckpoint.effect")
    assert effect.status.status_code is StatusCode.ERROR
    assert effect.attributes["error.type"] == "Declined"
    assert [event.name for event in effect.events] == ["exception"]
    (record,) = await manager.get_effects("wf", 0)
    assert record.error == {"type": "Declined", "message": SECRET}
    exported = "".join(span.to_json() for span in otel.finished())
    if sealed:
        assert effect.status.description == "Declined"
        assert dict(effect.events[0].attributes or {}) == {"exception.type": "Declined"}
        assert "zq-secret-customer" not in exported
    else:
        assert SECRET in (effect.status.description or "")
        assert (effect.events[0].attributes or {})["exception.message"] == SECRET


def test_counters_summed_in_process_lose_no_add_from_other_threads(otel: Telemetry) -> None:
    """Counters are summed here and read by the SDK when it collects: sums, never reset."""
    live = telemetry._live()
    assert live is not None
    attributes = {"db.operation.name": "save", "db.system.name": "sqlite"}

    def add() -> None:
        for _ in range(5000):
            live.instruments.bytes_written.add(3, dict(reversed(attributes.items())))

    threads = [threading.Thread(target=add) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    written = "aiocheckpoint.storage.bytes_written"
    (point,) = otel.points(written)  # one attribute set, in whatever order it was given
    assert point.value == 4 * 5000 * 3
    assert point.attributes == attributes
    live.instruments.bytes_written.add(1, attributes)
    assert otel.total(written) == 60001  # cumulative: the next collection adds to it


async def test_sqlite_group_commits_record_their_size(otel: Telemetry, tmp_path: Any) -> None:
    async with CheckpointManager(SQLiteCheckpointStorage(tmp_path / "s.db")) as manager:
        async with anyio.create_task_group() as tg:
            for n in range(20):
                tg.start_soon(manager.create_checkpoint, f"wf-{n}", 0, "a", "completed", {})
    (point,) = otel.points("aiocheckpoint.storage.commit.size")
    assert point.sum == 20
    assert point.count < 20  # concurrent saves shared a transaction


async def test_a_sweep_is_a_span_and_counts_what_it_deleted(
    otel: Telemetry, leasing_storage: CheckpointStorage
) -> None:
    policy = RetentionPolicy(keep_last=1, finished_ttl=timedelta(days=1))  # pruned by sweeps
    manager = CheckpointManager(leasing_storage, retention=policy)
    for name in ("done", "running"):
        for step in range(3):
            await manager.create_checkpoint(name, step, "a", "running", {"step": step})
    await manager.mark_workflow("done", "finished")
    later = datetime.now(timezone.utc) + timedelta(days=2)
    dry = await manager.sweep(now=later, dry_run=True)
    report = await manager.sweep(now=later)
    assert report.deleted == 3  # "done" whole, two steps of "running"
    assert dry.deleted >= 3
    first, second = otel.named("aiocheckpoint.sweep")
    assert (
        first.attributes["aiocheckpoint.sweep.dry_run"],
        second.attributes["aiocheckpoint.sweep.dry_run"],
    ) == (True, False)
    assert second.attributes["aiocheckpoint.sweep.deleted"] == 3
    kind, reason = "aiocheckpoint.sweep.kind", "aiocheckpoint.sweep.reason"
    deletions = "aiocheckpoint.sweep.deletions"
    assert otel.total(deletions, **{kind: "workflow", reason: "finished"}) == 1
    assert otel.total(deletions, **{kind: "checkpoint"}) == 2  # the dry run counted nothing


async def test_sampled_out_checkpoints_make_no_span_but_are_measured() -> None:
    with installed(sampler=ALWAYS_OFF) as otel:
        manager = CheckpointManager()
        with APP.start_as_current_span("caller"):
            await manager.create_checkpoint("wf", 0, "a", "completed", {"a": 1})
        assert otel.finished() == []
        assert otel.total("aiocheckpoint.checkpoint.save.duration") == 1
        assert otel.total("aiocheckpoint.storage.bytes_written") > 0


async def test_a_meter_provider_alone_gives_metrics_and_starts_no_span() -> None:
    with installed(tracing=False) as otel:
        live = telemetry._live()
        assert live is not None
        assert not live.tracing
        manager = CheckpointManager()
        await manager.create_checkpoint("wf", 0, "a", "completed", {"a": 1})
        await manager.get_checkpoint("wf", 0)
        assert otel.total("aiocheckpoint.checkpoint.save.duration") == 1
        assert otel.total("aiocheckpoint.checkpoint.load.duration") == 1
    assert otel.finished() == []


async def test_without_a_configured_sdk_no_span_is_made() -> None:
    """The API installed but no provider set: one check, then the method as it is."""
    assert telemetry._live() is None
    assert CheckpointManager.create_checkpoint.__wrapped__  # type: ignore[attr-defined]
    assert asyncio.iscoroutinefunction(CheckpointManager.create_checkpoint)
    manager = CheckpointManager()
    call = telemetry.round_trip(manager.storage.load, "wf")
    assert call.cr_code is InMemoryCheckpointStorage.load.__code__  # type: ignore[attr-defined]
    assert await call is None
    with installed() as otel:
        await manager.create_checkpoint("wf", 0, "a", "completed", {})
    assert len(otel.finished()) == 2
    await manager.create_checkpoint("wf", 1, "a", "completed", {})  # the SDK is gone again
    assert len(otel.finished()) == 2


_BLOCKED = textwrap.dedent(
    """
    import asyncio, importlib.abc, inspect, sys

    class Blocker(importlib.abc.MetaPathFinder):
        tried = []
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                self.tried.append(name)
                raise ImportError(f"{name} is not installed")
            return None

    sys.meta_path.insert(0, Blocker())
    import aiocheckpoint
    from aiocheckpoint import CheckpointManager, ResumableWorkflow, _telemetry
    from aiocheckpoint.effects import StepEffects
    from aiocheckpoint.storage.memory import InMemoryCheckpointStorage

    assert not _telemetry.ENABLED
    assert not [m for m in sys.modules if m.startswith("opentelemetry")]
    assert Blocker.tried == ["opentelemetry"], Blocker.tried  # one attempt, at import
    for method in (CheckpointManager.create_checkpoint, CheckpointManager.get_resume_point,
                   CheckpointManager.acquire_lease, StepEffects.run,
                   ResumableWorkflow.try_resume):
        assert not hasattr(method, "__wrapped__"), method  # the method itself
        assert inspect.iscoroutinefunction(method)
    manager = CheckpointManager()
    call = _telemetry.round_trip(manager.storage.load, "wf")
    assert call.cr_code is InMemoryCheckpointStorage.load.__code__
    call.close()

    async def main():
        async with ResumableWorkflow("wf", manager, lease_owner="me") as wf:
            async with wf.step(0, agent_id="a"):
                wf.state.set("done", await wf.effect("e", asyncio.sleep, 0, "ok"))
        assert (await manager.get_latest_checkpoint("wf")).state_snapshot.data == {"done": "ok"}

    asyncio.run(main())
    print("no opentelemetry")
    """
)


def test_without_opentelemetry_nothing_is_imported_and_methods_are_unwrapped() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no opentelemetry"
