"""Durability under power cuts: the power-loss suite's trials on our stores and the peers'.

    python bench/powerloss.py [--cuts N] [--only SYSTEM,...] [--markdown FILE]

Runs the trials of tests/powerloss (LazyFS, built on first use; root and /dev/fuse needed)
on each system: a writer process saving small and large states, cut at random moments;
after each cut, every acknowledged checkpoint must be there and verify. Prints one JSON
line per system, then a markdown table: cuts, checkpoints acknowledged before the cuts, and
how many of them were lost or came back corrupted. Peers: LangGraph's ``AsyncSqliteSaver``
and the seed's synchronous ``FileCheckpointStorage`` (``splinter-agent``, no fsync), both
wrapped as in bench/systems.py and without retention (they have none). A run does not
stop at a loss: the table says how much each system loses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "src"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))  # measure this checkout, not an installed copy

from tests.powerloss.harness import Config, Result, Trials  # noqa: E402
from tests.powerloss.lazyfs import build  # noqa: E402
from tests.powerloss.targets import Outcome, Target  # noqa: E402
from tests.powerloss.workload import digest  # noqa: E402

from bench.systems import Env, LangGraphSQLite, SeedThread, System  # noqa: E402

OURS = "tests.powerloss.targets:Aiocheckpoint"
FILE = {"gc_interval": 0.2, "blob_grace_seconds": 2.0}


class _Peer(Target):
    """A bench.systems peer: written through its ``save``, read back through its own API."""

    system_class: type[System]

    async def open(self) -> None:
        self.system = self.system_class(self.path, Env(root=self.path, pg_dsn=""))
        await self.system.open()

    async def save(self, wf: str, step: int, state: dict[str, Any], keep: int | None) -> None:
        await self.system.save(wf, step, state)

    async def close(self) -> None:
        await self.system.close()


class LangGraphTarget(_Peer):
    """LangGraph's AsyncSqliteSaver (WAL; SQLite's default synchronous=FULL)."""

    system_class = LangGraphSQLite

    async def workflows(self) -> list[str]:
        conn = self.system.conn  # type: ignore[attr-defined]
        async with conn.execute("SELECT DISTINCT thread_id FROM checkpoints") as cursor:
            return [row[0] async for row in cursor]

    async def records(self, wf: str, since: int) -> dict[int, Outcome]:
        out: dict[int, Outcome] = {}
        for found in await self.system.page(wf, 1 << 30):
            step = found.metadata["step"]
            if step >= since:
                out[step] = digest(found.checkpoint["channel_values"])
        return out

    async def load(self, wf: str, step: int) -> Outcome | None:
        return (await self.records(wf, step)).get(step)

    async def latest(self, wf: str) -> int | None:
        found = await self.system.latest(wf)
        return None if found is None else int(found.metadata["step"])


class SeedTarget(_Peer):
    """The seed's FileCheckpointStorage (JSON written and renamed into place, no fsync)."""

    system_class = SeedThread

    def _root(self) -> Path:
        return self.path / "store"

    async def workflows(self) -> list[str]:
        return sorted(os.listdir(self._root())) if self._root().is_dir() else []

    def _outcome(self, wf: str, step: int) -> Outcome | None:
        try:
            checkpoint = self.system.manager._storage.load(wf, step)  # type: ignore[attr-defined]
        except Exception as exc:  # what its reader raises on an empty or torn file
            return f"!{type(exc).__name__}: {exc}"
        return None if checkpoint is None else digest(checkpoint.state_snapshot.data)

    async def records(self, wf: str, since: int) -> dict[int, Outcome]:
        names = os.listdir(self._root() / wf)
        steps = [
            int(n[11:-5]) for n in names if n.startswith("checkpoint_") and n.endswith(".json")
        ]
        return {s: o for s in sorted(steps) if s >= since and (o := self._outcome(wf, s))}

    async def load(self, wf: str, step: int) -> Outcome | None:
        return self._outcome(wf, step)

    async def latest(self, wf: str) -> int | None:
        found = await self.system.latest(wf)
        return None if found is None else int(found.step)


def configs(cuts: int) -> list[Config]:
    """Every row of the table."""
    here = "bench.powerloss:"
    peers = (
        "bench.powerloss",
        "langgraph.checkpoint.sqlite.aio",
        "splinter.coordination.checkpoint",
    )
    rows = [
        Config("ours-file, 1 writer", OURS, {"backend": "file", "storage": FILE}, 1, cuts),
        Config("ours-file, 50 writers", OURS, {"backend": "file", "storage": FILE}, 50, cuts),
        Config(
            "ours-file, 50 writers, use_syncfs=False",
            OURS,
            {"backend": "file", "storage": {**FILE, "use_syncfs": False}},
            50,
            cuts,
        ),
        Config("ours-sqlite, 1 writer", OURS, {"backend": "sqlite"}, 1, cuts),
        Config("ours-sqlite, 50 writers", OURS, {"backend": "sqlite"}, 50, cuts),
    ]
    for name, target in (("lg-sqlite", "LangGraphTarget"), ("seed-file", "SeedTarget")):
        for tasks in (1, 50):
            rows.append(
                Config(
                    f"{name}, {tasks} writer{'s' if tasks > 1 else ''}",
                    here + target,
                    {},
                    tasks,
                    cuts,
                    retention=False,
                    preload=peers,
                )
            )
    return rows


def row(result: Result) -> dict[str, Any]:
    """The JSON record of one system's trials."""
    return {
        "system": result.config,
        "cuts": result.cuts,
        "lazyfs_cuts": result.unchosen,
        "acknowledged": result.acknowledged,
        "lost": result.lost,
        "cuts_with_loss": result.bad_cuts,
        "torn_unacknowledged": result.count("torn"),
        "behind": result.count("behind"),
        "errors": result.count("error"),
        "lazyfs_failures": len(result.lazyfs),
        "seconds": round(result.seconds, 1),
        "examples": result.examples(2)[:4],
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the rows."""
    lines = [
        "| system | cuts | acknowledged | lost or corrupted | cuts with a loss |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cuts = f"{r['cuts']}" + (f" (+{r['lazyfs_cuts']} by LazyFS)" if r["lazyfs_cuts"] else "")
        lines.append(
            f"| {r['system']} | {cuts} | {r['acknowledged']:,} | {r['lost']:,} "
            f"| {r['cuts_with_loss']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuts", type=int, default=40, help="cuts per system (default 40)")
    parser.add_argument(
        "--only", action="append", default=[], help="systems (ours-file, lg-sqlite, ...), a,b,..."
    )
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args()
    only = {n.strip() for chunk in args.only for n in chunk.split(",") if n.strip()}
    binary = build()
    rows = []
    for config in configs(args.cuts):
        if only and config.name.split(",")[0] not in only:
            continue
        with tempfile.TemporaryDirectory(prefix="aiocp-powerloss-bench") as workdir:
            result = Trials(config, binary, Path(workdir), seed=20261201).run()
        record = row(result)
        print(json.dumps(record), flush=True)
        rows.append(record)
    text = table(rows)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
