"""The processes of a power-loss trial: a zygote that forks writers and verifiers.

    python -m tests.powerloss.child MODULE...

imports the modules (warming up what the children use), then for each JSON job on stdin
forks a child, prints ``PID <pid>``, waits for it and prints ``EXIT <wait status>``.
Forking a warmed-up process keeps hundreds of trials cheap; every child is still a real
process, stopped and killed for real.

A ``write`` job opens its target on the LazyFS mount and runs the workload's tasks until it
is killed. Before each save it writes ``I<TAB>workflow<TAB>step<TAB>digest`` to the ack
FIFO, and after ``save`` returned ``A<TAB>workflow<TAB>step``: one ``write(2)`` each, so an
acknowledgement is in the pipe before the next instruction of the writer runs, and none
can follow a SIGSTOP. A ``verify`` job opens the target after the cut and checks it against
the request the parent wrote (see :func:`verify`), writing its findings as JSON.
"""

from __future__ import annotations

import asyncio
import errno
import faulthandler
import importlib
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from .targets import Target
from .workload import STRIDE, States, Workflow, digest, workflows

#: OS errors that LazyFS itself causes (a dead or confused daemon), not the store.
LAZYFS_ERRNOS = frozenset({errno.ESTALE, errno.ENOTCONN, errno.ECONNABORTED})
#: Workflows checked at once: their reads overlap in the store's worker threads.
CONCURRENT_CHECKS = 16


def make_target(job: dict[str, Any]) -> Target:
    """Build the job's target from its ``module:Class`` name."""
    module, name = job["target"].split(":")
    cls: type[Target] = getattr(importlib.import_module(module), name)
    return cls(Path(job["path"]), job["options"])


async def _write(job: dict[str, Any]) -> None:
    fd = os.open(job["acks"], os.O_WRONLY)
    target = make_target(job)
    await target.open()
    if job.get("disk"):  # what LazyFS answers against its disk (audit.py)
        target.audit_lazyfs(job["disk"], lambda line: os.write(fd, line.encode() + b"\n"))
    os.write(fd, b"R\n")
    seed, run = job["seed"], job["run"]
    flows = workflows(job["tasks"], job["retention"])

    async def task(mine: list[Workflow]) -> None:
        states = {wf.name: States(seed, run, wf) for wf in mine}
        step = run * STRIDE
        while True:
            for wf in mine:
                state = states[wf.name].next(step)
                os.write(fd, f"I\t{wf.name}\t{step}\t{digest(state)}\n".encode())
                await target.save(wf.name, step, state, wf.keep)
                os.write(fd, f"A\t{wf.name}\t{step}\n".encode())
            step += 1

    async def collector() -> None:
        while True:
            await asyncio.sleep(job["gc_every"])
            await target.collect()

    tasks = sorted({wf.task for wf in flows})
    await asyncio.gather(collector(), *(task([w for w in flows if w.task == t]) for t in tasks))


async def verify(target: Target, request: dict[str, Any]) -> dict[str, Any]:
    """Check the store after a cut against the parent's ledger, workflows side by side.

    Every visible record from ``since`` on must verify and be the state a writer announced
    for that step (nothing half-written, nothing invented); every required acknowledged
    step must be there and verify; each workflow's latest step may not be behind its last
    acknowledged one.
    """
    found: dict[str, list[str]] = {"lost": [], "corrupt": [], "torn": [], "behind": []}
    names = set(await target.workflows()) | set(request["last_acks"])
    limit = asyncio.Semaphore(CONCURRENT_CHECKS)

    async def check(wf: str) -> None:
        async with limit:
            await _check_workflow(target, request, wf, found)

    await asyncio.gather(*(check(wf) for wf in sorted(names)))
    checked = sum(len(steps) for steps in request["required"].values())
    return {"checked": checked, **found, "inodes": _inodes(target, request, found)}


def _inodes(
    target: Target, request: dict[str, Any], found: dict[str, list[str]]
) -> dict[str, list[int]]:
    """The inodes of the records each problem may be about, by its subject: the record of
    ``wf@step`` (lost, corrupt, torn), or every record of ``wf`` from its last acknowledged
    step on (behind: one of them is what the latest is behind or fails on). The parent
    matches them against the files the writer's audit caught LazyFS mishandling (audit.py)."""
    out: dict[str, list[int]] = {}
    for kind, problems in found.items():
        for problem in problems:
            subject = problem.split(": ", 1)[0]
            if kind == "behind":
                records = target.record_inodes(subject, int(request["last_acks"][subject]))
                out[subject] = sorted(records.values())
            else:
                wf, _, step_text = subject.rpartition("@")
                record = target.record_inodes(wf, int(step_text)).get(int(step_text))
                out[subject] = [] if record is None else [record]
    return out


async def _check_workflow(
    target: Target, request: dict[str, Any], wf: str, found: dict[str, list[str]]
) -> None:
    since = request["since"]
    announced = request["intents"].get(wf, {})
    required = request["required"].get(wf, {})
    seen = await target.records(wf, since)
    for step, outcome in seen.items():
        # A required step that does not verify is a loss, counted below.
        if announced.get(str(step)) != outcome and str(step) not in required:
            found["torn"].append(f"{wf}@{step}: {outcome[:200]}")
    for step_text, expected in required.items():
        step = int(step_text)
        outcome = seen.get(step) if step >= since else await target.load(wf, step)
        if outcome is None:
            found["lost"].append(f"{wf}@{step}")
        elif outcome != expected:
            found["corrupt"].append(f"{wf}@{step}: {outcome[:200]}")
    last = request["last_acks"].get(wf)
    if last is None:
        return
    try:
        position = await target.latest(wf)
    except Exception as exc:
        found["behind"].append(f"{wf}: the latest does not load ({exc!r})")
        return
    if position is None or position < last:
        found["behind"].append(f"{wf}: latest {position}, acknowledged {last}")


async def _verify(job: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    target = make_target(job)
    await target.open()
    try:
        return await verify(target, request)
    finally:
        await target.close()


def _lazyfs_error(exc: BaseException | None) -> bool:
    """Whether an exception (or one it chains) is an OS error LazyFS causes."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in LAZYFS_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def run_job(job: dict[str, Any]) -> int:
    """Run one job in this (forked) process; 0 when done, 3 on a failure (see its errfile)."""
    errfile = os.open(job["errfile"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(errfile, 1)
    os.dup2(errfile, 2)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks, if the parent asks
    try:
        if job["kind"] == "write":
            asyncio.run(_write(job))
        else:
            request = json.loads(Path(job["request"]).read_text())
            result = asyncio.run(_verify(job, request))
            Path(job["result"]).write_text(json.dumps(result))
    except BaseException as exc:
        traceback.print_exc()
        sys.stderr.flush()
        return 4 if _lazyfs_error(exc) else 3
    return 0


def zygote(modules: list[str]) -> None:
    """Fork one child per job line on stdin; report its pid and wait status."""
    for module in modules:
        getattr(importlib.import_module(module), "warm", lambda: None)()
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os._exit(run_job(job))
        print(f"PID {pid}", flush=True)
        _pid, status = os.waitpid(pid, 0)
        print(f"EXIT {status}", flush=True)


if __name__ == "__main__":
    zygote(sys.argv[1:])
