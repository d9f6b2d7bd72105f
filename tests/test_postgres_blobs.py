"""Incremental checkpoints on PostgreSQL: the blobs table and its reference counts.

Every test runs against the real server (tests/pg_support.py). ``check_counts`` compares the
stored counts with the truth computed from the stored records and blobs: exact, with no
leaked and no missing blob.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from aiocheckpoint import (
    AgentStatus,
    Checkpoint,
    CheckpointCorruptedError,
    CheckpointManager,
    InvalidArgumentError,
    LeaseLostError,
    StateSnapshot,
    StorageBackendError,
)
from aiocheckpoint.codec.tree.join import areferenced_hashes
from aiocheckpoint.codec.tree.v2 import encode_checkpoint_v2
from aiocheckpoint.codec.v1 import encode_checkpoint
from aiocheckpoint.format import open_record_v2 as _open_v2
from aiocheckpoint.format.header import record_format_version
from aiocheckpoint.format.tree import SplitResult, TreeParams, node_children, record_root_refs
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.storage.postgres import schema as _pg_schema
from tests._blob_child import state_for
from tests.pg_support import DSN, pg_schema, terminate_backends

__all__ = ["pg_schema"]

ROOT = Path(__file__).resolve().parents[1]
#: Tiny nodes: a few KB of state make trees several levels deep with many shared nodes.
SMALL = TreeParams(inline_limit=128, root_inline_limit=512, chunk_min=64, chunk_avg=256)
# Every chunk its own blob: trees of one shape whatever their data (for counting statements).
UNBUNDLED = TreeParams(
    inline_limit=128, root_inline_limit=512, chunk_min=64, chunk_avg=256, bundle_chunks=1
)


@pytest.fixture
async def admin() -> AsyncIterator[asyncpg.Connection]:
    """A plain asyncpg connection for inspecting and damaging the store."""
    con = await asyncpg.connect(DSN)
    yield con
    await con.close()


def store(schema: str, **options: Any) -> PostgresCheckpointStorage:
    options.setdefault("max_size", 4)
    return PostgresCheckpointStorage(DSN, schema=schema, **options)


async def check_counts(admin: asyncpg.Connection, schema: str) -> int:
    """Assert every count is its true number of referrers and no blob is missing or leaked.

    Returns the number of blobs stored.
    """
    records = await admin.fetch(f'SELECT data FROM "{schema}".checkpoints')
    data_rows = await admin.fetch(f'SELECT hash FROM "{schema}".blobs')
    blobs = {
        bytes(r["hash"]): (r["refs"], bytes(r["data"]))
        for r in await admin.fetch(
            f'SELECT hash, refs, data FROM "{schema}".blob_refs JOIN "{schema}".blobs USING (hash)'
        )
    }
    # Every count has its data and every data row its count.
    assert len(data_rows) == len(blobs)
    assert await admin.fetchval(f'SELECT count(*) FROM "{schema}".blob_refs') == len(blobs)
    truth: Counter[bytes] = Counter()
    for row in records:
        data = bytes(row["data"])
        if data[:5] == b"ACKP\x02":  # version 2: the others hold no refs
            truth.update(record_root_refs(data))
    for h, (_refs, data) in blobs.items():
        truth.update(node_children(data, len(h)))
    assert set(truth) <= set(blobs), "a record or node references a missing blob"
    assert set(blobs) <= set(truth), "leaked blobs: stored but referenced by nothing"
    assert {h: refs for h, (refs, _) in blobs.items()} == dict(truth)
    return len(blobs)


def doc_state(rng: random.Random, docs: dict[str, str], n: int) -> dict[str, Any]:
    return {"docs": dict(docs), "n": n, "log": [f"entry {i} " * 3 for i in range(n % 17)]}


async def test_counts_stay_exact_through_saves_replacements_deletes_and_retention(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """Random saves, replacements, deletes and keep_last keep every count exact."""
    rng = random.Random(5)
    docs = {f"d{i}": "lorem ipsum " * rng.randint(5, 30) for i in range(12)}
    expected: dict[tuple[str, int], Any] = {}
    steps = {"a": 0, "b": 0}
    async with store(pg_schema, blob_params=SMALL) as storage:
        keeping = CheckpointManager(storage, max_checkpoints=3)
        plain = CheckpointManager(storage)
        for op in range(80):
            wf = rng.choice(["a", "b"])
            action = rng.random()
            mine = sorted(k for k in expected if k[0] == wf)
            if action < 0.1 and mine:
                victim = rng.choice(mine)
                assert await plain.delete_checkpoints(*victim)
                del expected[victim]
            else:
                if action < 0.5:
                    key = rng.choice(list(docs))
                    docs[key] += f" edit {op}"
                replace = action > 0.85 and steps[wf] > 0
                step = steps[wf] if replace else steps[wf] + 1
                steps[wf] = step
                state = {"small": op} if action > 0.97 else doc_state(rng, docs, op)
                manager = keeping if wf == "a" else plain
                await manager.create_checkpoint(wf, step, "x", "running", state)
                expected[wf, step] = state
                if wf == "a":
                    for old in sorted(k for k in expected if k[0] == "a")[:-3]:
                        del expected[old]
            await check_counts(admin, pg_schema)
        for (wf, step), state in expected.items():
            got = await plain.get_checkpoint(wf, step)
            assert got.state_snapshot.data == state
        assert await check_counts(admin, pg_schema) > 20
        assert await plain.delete_checkpoints("a")
        assert await plain.delete_checkpoints("b")
    assert await check_counts(admin, pg_schema) == 0


async def test_store_at_version_2_migrates_and_reads_its_records(
    pg_schema: str, admin: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store created by the previous version opens, keeps its records and takes blobs."""
    monkeypatch.setattr(_pg_schema, "MIGRATIONS", _pg_schema.MIGRATIONS[:2])
    monkeypatch.setattr(_pg_schema, "SCHEMA_VERSION", 2)
    async with CheckpointManager(store(pg_schema)) as old:
        await old._storage.list_workflows()  # creates the version-2 schema
    # Written as version-2 code wrote it (today's statements name later columns).
    await admin.execute(
        f'INSERT INTO "{pg_schema}".checkpoints (workflow_id, step, data) '
        "VALUES ('wf', 0, 'raw record'::bytea)"
    )
    assert await admin.fetchval(f"SELECT to_regclass('\"{pg_schema}\".blobs')") is None
    monkeypatch.undo()
    big = {"text": "x" * 20_000, "items": list(range(2_000))}
    async with CheckpointManager(store(pg_schema)) as manager:
        got = await manager._storage.load("wf", 0)
        assert got is not None and got.data == b"raw record"
        await manager.create_checkpoint("wf", 1, "a", "running", big)
        assert (await manager.get_checkpoint("wf", 1)).state_snapshot.data == big
    version = await admin.fetchval(f'SELECT value FROM "{pg_schema}".meta')
    assert version == str(_pg_schema.SCHEMA_VERSION)
    assert await check_counts(admin, pg_schema) > 0


async def test_store_at_version_3_moves_its_counts_to_blob_refs(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """A version-3 store (counts in ``blobs.refs``) migrates: same counts, same checkpoints."""
    states = [state_for(step, step) for step in range(4)]
    async with CheckpointManager(store(pg_schema)) as manager:
        for step, state in enumerate(states):
            await manager.create_checkpoint("wf", step, "a", "running", state)
    counts = dict(await admin.fetch(f'SELECT hash, refs FROM "{pg_schema}".blob_refs'))
    assert len(counts) > 10
    # Put the store back in version 3's layout, counts included.
    s = f'"{pg_schema}"'
    for statement in (
        f"ALTER TABLE {s}.blobs ADD COLUMN refs bigint",
        f"UPDATE {s}.blobs b SET refs = r.refs FROM {s}.blob_refs r WHERE r.hash = b.hash",
        f"ALTER TABLE {s}.blobs ALTER COLUMN refs SET NOT NULL",
        f"DROP TABLE {s}.blob_refs",
        f"UPDATE {s}.meta SET value = '3'",
    ):
        await admin.execute(statement)
    async with CheckpointManager(store(pg_schema)) as manager:
        for step, state in enumerate(states):
            assert (await manager.get_checkpoint("wf", step)).state_snapshot.data == state
        assert await admin.fetchval(f"SELECT value FROM {s}.meta") == str(_pg_schema.SCHEMA_VERSION)
        assert dict(await admin.fetch(f"SELECT hash, refs FROM {s}.blob_refs")) == counts
        columns = await admin.fetch(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = $1 AND table_name = 'blobs' ORDER BY ordinal_position",
            pg_schema,
        )
        assert [c["column_name"] for c in columns] == ["hash", "data"]
        # Counting goes on in the new table: a save and a delete keep every count exact.
        await manager.create_checkpoint("wf", 4, "a", "running", state_for(4, 4))
        assert await manager.delete_checkpoints("wf", 0)
    await check_counts(admin, pg_schema)


async def test_old_store_records_written_by_version_2_code_read_after_upgrade(
    pg_schema: str, admin: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints written through the manager at schema version 2 read back after upgrade."""
    monkeypatch.setattr(_pg_schema, "MIGRATIONS", _pg_schema.MIGRATIONS[:2])
    monkeypatch.setattr(_pg_schema, "SCHEMA_VERSION", 2)
    states = [{"k": i} for i in range(3)]
    async with CheckpointManager(store(pg_schema), incremental=False) as manager:
        await manager.list_workflows()  # creates the version-2 schema
        for i, state in enumerate(states):
            # The records version-2 code wrote (today's statements name later columns).
            cp = Checkpoint(
                workflow_id="wf",
                step=i,
                agent_id="a",
                status=AgentStatus.COMPLETED,
                state_snapshot=StateSnapshot(data=state),
            )
            await admin.execute(
                f'INSERT INTO "{pg_schema}".checkpoints (workflow_id, step, data) '
                "VALUES ($1, $2, $3)",
                "wf",
                i,
                encode_checkpoint(cp),
            )
    monkeypatch.undo()
    async with CheckpointManager(store(pg_schema)) as manager:
        listed = await manager.list_checkpoints("wf")
        assert [c.state_snapshot.data for c in listed] == states
        assert await manager.delete_checkpoints("wf", 1)
    version = await admin.fetchval(f'SELECT value FROM "{pg_schema}".meta')
    assert version == str(_pg_schema.SCHEMA_VERSION)


async def test_concurrent_writers_sharing_subtrees_keep_counts_exact(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """Tasks and a second process share sub-trees with retention: all loads, counts exact."""
    child = asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "tests" / "_pg_blob_child.py"),
        DSN,
        pg_schema,
        "child",
        "1",
        "30",
        "3",
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with store(pg_schema, write_concurrency=3) as storage:
        # Create the schema first, so the child and these tasks do not race on the DDL.
        await storage.exists("x")
        proc = await child

        async def writer(w: int) -> None:
            manager = CheckpointManager(storage, max_checkpoints=2)
            for step in range(12):
                # Seeds 1 and 2: the same documents as the child's, rewritten differently.
                await manager.create_checkpoint(
                    f"t{w}", step, "t", "running", state_for(1 + w % 2, step % 5)
                )
                if step == 6:
                    await manager.delete_checkpoints(f"t{w}", 5)

        await asyncio.gather(*(writer(w) for w in range(6)))
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert out.decode().split() == [str(s) for s in range(30)]
        manager = CheckpointManager(storage)
        for wf in [*(f"t{w}" for w in range(6)), "child"]:
            listed = await manager.list_checkpoints(wf)
            assert len(listed) in (2, 3)
            for c in listed:
                seed = 1 if wf == "child" else 1 + int(wf[1:]) % 2
                step = c.step if wf == "child" else c.step % 5
                assert c.state_snapshot.data == state_for(seed, step)
    assert await check_counts(admin, pg_schema) > 0


async def test_concurrent_batches_over_crossing_trees_all_commit(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """Writers whose trees share nodes at different levels all commit, counts exact."""
    rng = random.Random(3)
    parts = [f"part {i} " * 40 for i in range(30)]
    storages = [store(pg_schema, write_concurrency=2, blob_params=SMALL) for _ in range(3)]
    await storages[0].exists("x")

    async def writer(w: int) -> None:
        manager = CheckpointManager(storages[w % 3], max_checkpoints=2)
        for step in range(10):
            picked = rng.sample(parts, 12)
            state = {"a": picked[:6], "b": {"nested": picked[6:], "w": w % 3}}
            await manager.create_checkpoint(f"w{w}", step, "x", "running", state)

    try:
        await asyncio.gather(*(writer(w) for w in range(12)))
    finally:
        for s in storages:
            await s.close()
    async with CheckpointManager(store(pg_schema, blob_params=SMALL)) as manager:
        for w in range(12):
            assert [c.step for c in await manager.list_checkpoints(f"w{w}")] == [8, 9]
    await check_counts(admin, pg_schema)


async def test_sigkilled_writer_leaves_every_record_loadable(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """A writer killed mid large saves: every record loads, every acknowledged step is there."""
    async with store(pg_schema) as storage:
        await storage.exists("x")
    rng = random.Random(11)
    for round_ in range(3):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ROOT / "tests" / "_pg_blob_child.py"),
            DSN,
            pg_schema,
            f"wf{round_}",
            str(round_),
            "1000",
            "0",
            env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
            stdout=asyncio.subprocess.PIPE,
        )
        acked: list[int] = []
        assert proc.stdout is not None
        target = rng.randint(3, 8)
        while len(acked) < target:
            line = await proc.stdout.readline()
            assert line, "the child died before it was killed"
            acked.append(int(line))
        await asyncio.sleep(rng.uniform(0, 0.05))
        proc.send_signal(signal.SIGKILL)
        rest, _ = await proc.communicate()
        acked += [int(s) for s in rest.split()]
        async with CheckpointManager(store(pg_schema)) as manager:
            listed = await manager.list_checkpoints(f"wf{round_}")
            steps = [c.step for c in listed]
            assert set(acked) <= set(steps)
            for c in listed:
                assert c.state_snapshot.data == state_for(round_, c.step)
    await check_counts(admin, pg_schema)


async def test_missing_or_damaged_blob_is_corruption_and_resume_falls_back(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """A deleted or altered blob row: CheckpointCorruptedError, the resume uses the step before."""
    async with CheckpointManager(store(pg_schema)) as manager:
        for step in range(3):
            await manager.create_checkpoint("wf", step, "a", "running", state_for(step, step))
        for step, damage in ((2, "DELETE FROM {b} WHERE hash = $1"), (1, None)):
            stored = await manager._storage.load("wf", step)
            assert stored is not None and record_format_version(stored.data) == 2
            # The blobs of this step's stored tree that no other step holds.
            _meta, _digest, root = _open_v2(stored.data)
            tree = await areferenced_hashes([root], manager._storage.fetch_blobs)  # type: ignore[attr-defined]
            others = await admin.fetch(
                f'SELECT hash FROM "{pg_schema}".blob_refs WHERE refs = 1 AND hash = ANY($1)',
                list(tree),
            )
            victim = bytes(others[-1]["hash"])
            if damage is None:
                await admin.execute(
                    f'UPDATE "{pg_schema}".blobs SET data = $2 WHERE hash = $1',
                    victim,
                    b"\x00" * 40,
                )
            else:
                await admin.execute(damage.format(b=f'"{pg_schema}".blobs'), victim)
            with pytest.raises(CheckpointCorruptedError) as info:
                await manager.get_checkpoint("wf", step)
            assert (info.value.workflow_id, info.value.step) == ("wf", step)
        resume = await manager.get_resume_point("wf")
        assert resume is not None and resume[0] == 0
        assert resume[1].data == state_for(0, 0)


async def test_terminated_backends_during_save_tree_lose_no_acknowledged_write(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """Backends killed while trees are written: acknowledged saves load, counts stay exact."""
    app = f"aiocp-blobs-{os.getpid()}-{random.randrange(10**9)}"
    storage = store(pg_schema, max_size=4, server_settings={"application_name": app})
    manager = CheckpointManager(storage, max_checkpoints=3)
    acked: list[tuple[str, int]] = []
    failures: list[BaseException] = []
    kills = 0

    async def writer(w: int) -> None:
        for step in range(8):
            try:
                await manager.create_checkpoint(f"wf{w}", step, "a", "running", state_for(w, step))
                acked.append((f"wf{w}", step))
            except StorageBackendError as exc:
                failures.append(exc)

    async def killer() -> None:
        nonlocal kills
        for _ in range(12):
            await asyncio.sleep(0.05)
            kills += await terminate_backends(admin, app)

    try:
        await storage.exists("open")
        await asyncio.gather(killer(), *(writer(w) for w in range(6)))
    finally:
        await manager.close()
    assert kills > 0 and acked
    assert all(isinstance(f, StorageBackendError) for f in failures)
    async with CheckpointManager(store(pg_schema)) as again:
        for wf, step in acked:
            listed = await again.list_checkpoints(wf)
            kept = [c.step for c in listed]
            assert step in kept or step < max(kept) - 2, (wf, step)
            for c in listed:
                assert c.state_snapshot.data == state_for(int(wf[2:]), c.step)
    await check_counts(admin, pg_schema)


async def test_stale_fenced_tree_adds_nothing(pg_schema: str, admin: asyncpg.Connection) -> None:
    """A save_tree refused for a stale lease leaves no blob and no count behind."""
    async with store(pg_schema) as storage:
        manager = CheckpointManager(storage)
        first = await storage.acquire_lease("wf", "me", 30)
        await storage.release_lease(first)
        await storage.acquire_lease("wf", "other", 30)  # a new token: ``first`` is stale
        with pytest.raises(LeaseLostError):
            await manager.create_checkpoint("wf", 0, "a", "running", state_for(1, 1), lease=first)
        assert await storage.load("wf") is None
    assert await check_counts(admin, pg_schema) == 0


async def test_cli_reads_verifies_and_copies_incremental_postgres_records(
    pg_schema: str, admin: asyncpg.Connection, tmp_path: Path
) -> None:
    """verify, show, copy and export handle PostgreSQL records whose states are blobs."""
    from aiocheckpoint import open_storage
    from tests.test_cli import cli

    url = f"{DSN}?schema={pg_schema}"
    big = {"docs": [{"id": i, "text": f"document {i} " * 20} for i in range(400)]}
    async with CheckpointManager(store(pg_schema)) as manager:
        for step in range(3):
            await manager.create_checkpoint("big", step, "a", "completed", {**big, "n": step})
    assert await check_counts(admin, pg_schema) > 0
    verify = cli("--json", "verify", url)
    assert verify.code == 0, verify.err
    shown = cli("--json", "show", url, "big", "1")
    assert shown.code == 0, shown.err
    assert "document 399" in shown.out
    copied = cli("copy", url, f"file:{tmp_path}/copy")
    assert copied.code == 0, copied.err
    async with CheckpointManager(open_storage(f"file:{tmp_path}/copy")) as manager:
        got = await manager.get_checkpoint("big", 2)
        assert got.state_snapshot.data == {**big, "n": 2}
    exported = cli("export", url, "-")
    assert exported.code == 0, exported.err
    assert "exported 3 checkpoints" in exported.err


async def test_small_state_replacing_a_large_one_releases_its_blobs(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """A version-1 save over a version-2 record (no keep_last) frees the old tree's blobs."""
    async with CheckpointManager(store(pg_schema)) as manager:
        await manager.create_checkpoint("wf", 1, "a", "running", state_for(1, 1))
        await manager.create_checkpoint("other", 1, "a", "running", {"small": True})
        assert await check_counts(admin, pg_schema) > 0
        await manager.create_checkpoint("wf", 1, "a", "running", {"small": 2})
        assert await check_counts(admin, pg_schema) == 0
        assert (await manager.get_checkpoint("wf", 1)).state_snapshot.data == {"small": 2}
        await manager.create_checkpoint("wf", 1, "a", "running", state_for(2, 2))
        assert (await manager.get_checkpoint("wf", 1)).state_snapshot.data == state_for(2, 2)
        assert await check_counts(admin, pg_schema) > 0


async def test_a_bad_tree_fails_only_its_own_caller(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """A split lacking a blob it references fails alone; the rest of its batch is stored."""
    async with store(pg_schema) as storage:
        manager = CheckpointManager(storage)
        good = [
            await manager.create_checkpoint("seed", n, "a", "running", state_for(n, n))
            for n in range(3)
        ]
        await manager.delete_checkpoints("seed")
        good = [cp.model_copy(update={"workflow_id": f"ok{cp.step}"}) for cp in good]
        bad = good.pop().model_copy(update={"workflow_id": "bad", "step": 0})
        record, split = encode_checkpoint_v2(bad, storage.blob_params)
        broken = type(split)(split.root, {}, split.children, split.root_refs)
        results = await asyncio.gather(
            storage.save_tree("bad", 0, record, broken),
            *(
                storage.save_tree(f"ok{n}", n, *encode_checkpoint_v2(cp, storage.blob_params))
                for n, cp in enumerate(good)
            ),
            return_exceptions=True,
        )
        assert type(results[0]).__name__ == "InvalidArgumentError"
        assert results[1:] == [None, None]
        assert await storage.load("bad") is None
        for n, cp in enumerate(good):
            stored = await storage.load(f"ok{n}", n)
            assert stored is not None
            assert (
                await manager.decode_record(f"ok{n}", stored)
            ).state_snapshot == cp.state_snapshot
    await check_counts(admin, pg_schema)


async def test_fetch_blobs_refuses_hashes_that_are_not_bytes(pg_schema: str) -> None:
    """fetch_blobs takes bytes; anything else is an InvalidArgumentError, not a query."""
    from aiocheckpoint import InvalidArgumentError

    async with store(pg_schema) as storage:
        assert await storage.fetch_blobs([]) == {}
        with pytest.raises(InvalidArgumentError):
            await storage.fetch_blobs([5])  # type: ignore[list-item]
        assert await storage.fetch_blobs([b"\x01" * 16]) == {}


def tree_depth(split: SplitResult) -> int:
    """How many levels the tree's blobs span below the root (the add walk's statements)."""
    depth, level = 0, set(split.root_refs)
    while level:
        depth += 1
        level = {c for h in level for c in split.children.get(h, ())}
    return depth


async def test_a_batch_of_trees_costs_one_blob_statement_per_level(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """Trees saved together share each level's statement; a delete releases one per level."""
    splits = []
    for n in range(12):
        cp = Checkpoint(
            workflow_id=f"wf{n}",
            step=0,
            agent_id="a",
            status=AgentStatus.RUNNING,
            state_snapshot=StateSnapshot(
                data={"docs": [f"{n:02} {i:03} " * 30 for i in range(40)]}
            ),
        )
        splits.append(encode_checkpoint_v2(cp, UNBUNDLED))
    depths = {tree_depth(split) for _, split in splits}
    assert len(depths) == 1 and min(depths) >= 3  # same shape, distinct blobs
    (depth,) = depths
    async with store(pg_schema, blob_params=UNBUNDLED, write_concurrency=1) as storage:
        await asyncio.gather(
            *(storage.save_tree(f"wf{n}", 0, *split) for n, split in enumerate(splits))
        )
        stats = storage.stats
        assert stats.retries == 0 and stats.rows == 12
        assert stats.batches < 12  # several trees shared a batch ...
        assert stats.blob_statements == depth * stats.batches  # ... and its level statements
        blobs = await check_counts(admin, pg_schema)
        assert blobs == sum(len(split.blobs) for _, split in splits)
        for n in range(12):
            before = stats.blob_statements
            assert await storage.delete(f"wf{n}")
            assert stats.blob_statements - before == depth  # every level reaches 0
    assert await check_counts(admin, pg_schema) == 0


def text_tree(workflow_id: str, step: int, text: str) -> tuple[bytes, SplitResult]:
    """A version-2 record and split of a state holding ``text`` (one blob when it is long)."""
    cp = Checkpoint(
        workflow_id=workflow_id,
        step=step,
        agent_id="a",
        status=AgentStatus.RUNNING,
        state_snapshot=StateSnapshot(data={"text": text, "n": step}),
    )
    return encode_checkpoint_v2(cp)


async def test_a_tree_of_stored_blobs_costs_three_statements(pg_schema: str) -> None:
    """BEGIN, the blob lock with the first blob level and the upsert, COMMIT: nothing else."""
    logged: list[str] = []

    async def log_queries(con: asyncpg.Connection) -> None:
        con.add_query_logger(lambda query: logged.append(query.query))

    text = "".join(f"{i:05} stored blob " for i in range(500))
    async with store(pg_schema, init=log_queries) as storage:
        await storage.save_tree("wf", 0, *text_tree("wf", 0, text))
        logged.clear()
        await storage.save_tree("wf", 1, *text_tree("wf", 1, text))
        assert await storage.exists("wf", 1)
    # The last one is exists'.
    assert [q.split()[0] for q in logged] == ["BEGIN;", "WITH", "COMMIT;", "SELECT"]
    lock, level, upsert = (logged[1].index(part) for part in ("lock(", "blob_refs", "checkpoints"))
    assert lock < level < upsert
    assert not any("pg_advisory_unlock_all" in q for q in logged)  # no reset on release


async def test_a_tree_batch_takes_the_blob_lock_before_any_blob_row_lock(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """While another transaction holds the blob lock, a tree save waits, locking no row."""
    text = "".join(f"{i:05} locked blob " for i in range(500))
    async with store(pg_schema) as storage:
        first = text_tree("wf", 0, text)
        await storage.save_tree("wf", 0, *first)
        holder = await asyncpg.connect(DSN)
        try:
            tx = holder.transaction()
            await tx.start()
            await holder.execute(
                "SELECT pg_advisory_xact_lock(hashtext('aiocheckpoint.blobs:' || $1::text))",
                pg_schema,
            )
            second = text_tree("wf", 1, text)
            save = asyncio.create_task(storage.save_tree("wf", 1, *second, keep_last=2))
            waiting = (
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' "
                "AND strpos(query, $1) > 0 AND strpos(query, 'blob_refs') > 0"
            )
            for _ in range(1000):
                if await admin.fetchval(waiting, f'"{pg_schema}"'):
                    break
                await asyncio.sleep(0.01)
            else:
                pytest.fail("the save never waited for the blob lock")
            async with admin.transaction():  # NOWAIT: a row the save locked raises
                rows = await admin.fetch(
                    f'SELECT hash FROM "{pg_schema}".blob_refs WHERE hash = ANY($1::bytea[]) '
                    "FOR UPDATE NOWAIT",
                    list(first[1].root_refs),
                )
                assert len(rows) == len(first[1].root_refs) == 1
                for table in ("workflows", "checkpoints"):
                    rows = await admin.fetch(
                        f'SELECT 1 FROM "{pg_schema}".{table} WHERE workflow_id = $1 '
                        "FOR UPDATE NOWAIT",
                        "wf",
                    )
                    assert len(rows) == 1
            assert not save.done()
            await tx.commit()
        finally:
            await holder.close()
        await save
    assert await check_counts(admin, pg_schema) == 1


async def test_a_blob_over_max_record_bytes_fails_only_its_own_save(
    pg_schema: str, admin: asyncpg.Connection
) -> None:
    """A tree with a blob over the limit is refused alone; nothing of it is stored."""
    big = text_tree("big", 0, "".join(f"{i:05} big blob " for i in range(2000)))
    small = text_tree("ok", 0, "".join(f"{i:05} small blob " for i in range(500)))
    assert max(map(len, big[1].blobs.values())) > 10_000 > len(big[0])
    assert max(map(len, small[1].blobs.values())) < 10_000
    async with store(pg_schema, max_record_bytes=10_000) as storage:
        results = await asyncio.gather(
            storage.save_tree("big", 0, *big),
            storage.save_tree("ok", 0, *small),
            return_exceptions=True,
        )
        assert isinstance(results[0], InvalidArgumentError), results
        assert "max_record_bytes" in str(results[0])
        assert results[1] is None
        assert not await storage.exists("big")
        assert await storage.exists("ok", 0)
    assert await check_counts(admin, pg_schema) == len(small[1].blobs)
