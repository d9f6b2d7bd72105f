"""Power-loss trials: run a writer on LazyFS, cut the power at a random moment, check.

One trial: mount LazyFS, fork a writer (see child.py) on the store; read its announcements
and acknowledgements from a FIFO while it runs; at a random moment SIGSTOP it (and wait
until every thread is stopped, so no acknowledgement can follow), ``lazyfs::clear-cache``
(the cut), SIGKILL it and unmount; then fork a verifier that opens the store and checks it
against the ledger. The verifier reads LazyFS's backing directory, the "disk": after the
cut and the unmount it holds exactly what a remount would show, and reading it directly
spares the check LazyFS's ~2 ms per call and its bugs. The next trial mounts again and
writes on to the same store (its writer opens the store through LazyFS after the cut);
every ``cuts_per_store`` trials the store gets a last full check (every acknowledged
checkpoint of its life, every visible record) and a fresh one starts.

LazyFS failures (a death, a hang, an ESTALE) are bounded by timeouts and survived: a
LazyFS that dies or fails while the writer runs is a cut at a moment nobody chose, checked
like a chosen one but not counted towards the target. Nothing that could not be checked
counts as a pass: the trials stop with :class:`HarnessError` (a failure) when they run out
of time or attempts before reaching the target.

LazyFS also errs without dying: it has answered an fsync without its disk holding the data,
and served a short read of a record its disk held whole. The writer audits it (audit.py)
and reports each such file by its inode on the disk; what a check then finds wrong with
that very record is a LazyFS failure with the evidence, not a loss of the store's, and the
trial is not counted towards the target (see ``_audited`` and ``_check``).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from .audit import KIND as AUDIT_KIND
from .audit import MISREAD
from .lazyfs import REPO, LazyFS, LazyFSFault, mounted
from .workload import STRIDE, Ledger, workflows

#: How the writer's exit code says why it stopped on its own (see child.run_job).
_LAZYFS_EXIT = 4
#: How the LazyFS failures the writer's audit caught begin (see ``_audited``).
AUDITED = ("fsync not honoured", "short read")
#: A writer gets this long to start and acknowledge its first save (it takes well under 1 s).
_FIRST_ACK_SECONDS = 20


class HarnessError(Exception):
    """The harness could not carry out its trials: a failure, never a pass."""


@dataclass(frozen=True)
class Config:
    """One configuration of trials: a target, a workload and how many cuts."""

    name: str
    target: str
    options: dict[str, Any]
    tasks: int
    cuts: int
    retention: bool = True
    cuts_per_store: int = 10
    run_for: float = 0.4  # a writer runs up to this long after its first acknowledgement
    early: float = 0.1  # the share of cuts made while a writer starts up
    gc_every: float = 0.1
    cache_mb: int = 16
    seconds_per_cut: float = 6.0  # the time budget; running out of it is a failure
    preload: tuple[str, ...] = ()


@dataclass
class Result:
    """What a configuration's trials did and found."""

    config: str
    cuts: int = 0
    unchosen: int = 0  # LazyFS died or hung mid-run: verified, not counted as a cut
    acknowledged: int = 0
    checked: int = 0  # required acknowledged checkpoints checked, over all checks
    bad_cuts: int = 0  # trials whose check found anything wrong
    problems: dict[str, dict[str, str]] = field(default_factory=dict)  # kind: {key: detail}
    lazyfs: list[str] = field(default_factory=list)
    cache_peak: float = 0.0  # the most of LazyFS's cache in use at a cut, in percent
    seconds: float = 0.0

    def count(self, kind: str) -> int:
        """How many distinct problems of ``kind`` (lost, corrupt, torn, behind, error)."""
        return len(self.problems.get(kind, ()))

    @property
    def lost(self) -> int:
        """Acknowledged checkpoints missing or not verifying after a cut."""
        return self.count("lost") + self.count("corrupt")

    @property
    def failures(self) -> int:
        """Every distinct problem found."""
        return sum(len(found) for found in self.problems.values())

    def summary(self) -> str:
        """One line for the end of the run."""
        kinds = ", ".join(f"{k} {len(v)}" for k, v in sorted(self.problems.items()) if v)
        return (
            f"{self.config}: {self.cuts} cuts (+{self.unchosen} by LazyFS itself), "
            f"{self.acknowledged} acknowledged, {self.lost} lost"
            + (f" ({kinds})" if kinds else "")
            + f", {len(self.lazyfs)} LazyFS failures, cache peak {self.cache_peak:.0f}%, "
            f"{self.seconds:.0f} s"
        )

    def lazyfs_failures(self) -> str:
        """What went wrong with LazyFS, by kind (the start of each message)."""
        kinds = collections.Counter(why.split(":")[0] for why in self.lazyfs)
        return ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items()))

    def examples(self, n: int = 8) -> list[str]:
        """A few of the problems, for an assertion message."""
        return [f"{k}: {d}" for k, found in self.problems.items() for d in list(found.values())[:n]]


class Zygote:
    """The warmed-up parent of the writers and verifiers (see child.py)."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        src = str(REPO / "src")
        path = os.pathsep.join([str(REPO), src, os.environ.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.powerloss.child", *preload],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
        )
        self.buffer = b""
        self.child: int | None = None  # the child running now

    def _line(self, timeout: float) -> str | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = max(deadline - time.monotonic(), 0)
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise HarnessError(f"the zygote died ({self.proc.wait()})")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def start(self, job: dict[str, Any]) -> int:
        """Fork a child for ``job``; return its pid."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job).encode() + b"\n")
        self.proc.stdin.flush()
        line = self._line(60)
        if line is None or not line.startswith("PID "):
            raise HarnessError(f"the zygote said {line!r}")
        self.child = int(line.split()[1])
        return self.child

    def wait(self, timeout: float) -> int | None:
        """The last child's wait status, or None if it has not ended within ``timeout``."""
        line = self._line(timeout)
        if line is None:
            return None
        if not line.startswith("EXIT "):
            raise HarnessError(f"the zygote said {line!r}")
        self.child = None
        return int(line.split()[1])

    def __enter__(self) -> Zygote:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self.proc.stdin is not None
        if self.child is not None:  # the trials stopped half-way: no orphan writer
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class AckPipe:
    """The read end of the FIFO a writer reports through."""

    def __init__(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.mkfifo(path, 0o600)
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.buffer = b""
        self.lines: list[bytes] = []
        self.ready = False
        self.acks = 0

    def pump(self, timeout: float) -> bool:
        """Read what is there (waiting up to ``timeout``); False when no writer has it open.

        Before the writer opened it that is also the case, so only a writer known to be
        gone makes False the end of the file.
        """
        select.select([self.fd], [], [], timeout)
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:  # a writer has it open; nothing to read yet
            return True
        if not chunk:
            return False
        *complete, self.buffer = (self.buffer + chunk).split(b"\n")
        for line in complete:
            if line == b"R":
                self.ready = True
            else:
                self.acks += line.startswith(b"A\t")
                self.lines.append(line)
        return True

    def drain(self, timeout: float) -> None:
        """Read everything up to the end of file (the writer is gone)."""
        deadline = time.monotonic() + timeout
        while self.pump(0.05):
            if time.monotonic() > deadline:
                raise HarnessError("the ack FIFO never reached its end")
        os.close(self.fd)


class _Unchosen(Exception):
    """LazyFS died or hung before the chosen moment: the cut happened on its own."""


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (or the process is gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if stat.rsplit(")", 1)[1].split()[0] not in ("T", "t", "Z", "X"):
            return False
    return True


def _fuse_waits(pid: int) -> list[str]:
    """The kernel functions where threads of ``pid`` wait for a FUSE request's answer."""
    waits: list[str] = []
    tids: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        tids = os.listdir(f"/proc/{pid}/task")
    for tid in tids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            wchan = Path(f"/proc/{pid}/task/{tid}/wchan").read_text()
            if wchan.startswith("fuse") or "request_wait_answer" in wchan:
                waits.append(wchan)
    return waits


class Trials:
    """The trials of one configuration on one LazyFS under ``workdir``."""

    def __init__(self, config: Config, binary: Path, workdir: Path, seed: int) -> None:
        self.config = config
        self.workdir = workdir
        # Not under ``workdir``: LazyFS misreads some paths (see LazyFS), pytest's among them.
        self.fs = LazyFS(binary, Path(tempfile.mkdtemp(prefix="aiocp_lazyfs_")), config.cache_mb)
        self.rng = random.Random(f"{seed}/{config.name}")
        self.result = Result(config.name)
        self.flows = workflows(config.tasks, config.retention)
        self.ledger = Ledger({wf.name: wf.keep for wf in self.flows})
        self.exit: int | None = None  # the writer's wait status, once it ended
        self.stores = 0  # stores started so far (their steps start at 0 again)
        self.lines: list[bytes] = []  # what the last writer announced and acknowledged
        #: The store's files LazyFS was caught mishandling by the writer's audit (audit.py):
        #: an fsync answered without its disk holding the data, a record its disk holds
        #: whole read short by the garbage collector. By inode on the disk, the evidence:
        #: what the check finds wrong with them is LazyFS's fault, not the store's.
        self.mishandled: dict[int, str] = {}
        #: AIOCHECKPOINT_POWERLOSS_KEEP=DIR: a check that finds a problem copies its evidence
        #: there (the disk, LazyFS's log, the writer's lines and errors; see _keep).
        self.keep = os.environ.get("AIOCHECKPOINT_POWERLOSS_KEEP")

    def run(self, stop_at_failure: bool = False) -> Result:
        """Make ``config.cuts`` cuts, each checked; return what they found.

        ``stop_at_failure`` ends the trials at the first check that finds a problem.
        """
        config, started = self.config, time.monotonic()
        deadline = started + config.cuts * config.seconds_per_cut + 60
        preload = ("tests.powerloss.targets", *config.preload)
        try:
            with Zygote(preload) as self.zygote:
                self._fresh_store()
                trials = 0
                while self.result.cuts < config.cuts:
                    trials += 1
                    if trials > 2 * config.cuts + 20 or time.monotonic() > deadline:
                        raise HarnessError(f"gave up after {trials - 1} trials: {self.result}")
                    if self.ledger.runs >= config.cuts_per_store:
                        self._final_check()
                        self._fresh_store()
                    self._trial()
                    if stop_at_failure and self.result.failures:
                        return self.result
                self._final_check()
        finally:
            self.fs.close()
            if not (mounted(self.fs.mount_dir) or mounted(self.fs.root)):
                shutil.rmtree(self.fs.workdir, ignore_errors=True)
            self.result.lazyfs.extend(self.fs.deaths)
            self.result.seconds = time.monotonic() - started
        return self.result

    # --- one store ---------------------------------------------------------------------

    def _fresh_store(self) -> None:
        self.fs.wipe()
        self.stores += 1
        self.mishandled = {}
        self.ledger = Ledger({wf.name: wf.keep for wf in self.flows})

    def _mount(self) -> None:
        for _ in range(5):
            try:
                self.fs.mount()
                return
            except LazyFSFault:
                continue
        raise HarnessError(f"LazyFS would not mount: {self.fs.tail()}")

    def _final_check(self) -> None:
        """Everything the store's life acknowledged, every record it shows."""
        if self.ledger.runs:
            self._check(since=0, final=True)

    # --- one trial ---------------------------------------------------------------------

    def _trial(self) -> None:
        run = self.ledger.runs
        self.ledger.runs += 1
        self._mount()
        pipe = AckPipe(self.workdir / "acks.fifo")
        self.exit = None
        pid = self.zygote.start(self._job("write", run=run, acks=str(pipe.path)))
        chosen = True
        try:
            self._let_run(pid, pipe)
        except _Unchosen:
            chosen = False
        chosen = self._cut(pid, pipe) and chosen
        self.result.acknowledged += self.ledger.feed(pipe.lines)
        self.lines = pipe.lines
        audited = self._audited(pipe.lines)
        self._writer_exit()
        self.fs.unmount()
        self._check(since=run * STRIDE, how="" if chosen else " (after a cut LazyFS made itself)")
        if chosen and audited:
            self.result.cuts += 1
        else:
            self.result.unchosen += 1

    def _audited(self, lines: list[bytes]) -> bool:
        """Note what the writer's audit caught LazyFS doing (audit.py); False if anything:
        like a full cache, a filesystem that broke fsync or read proves less."""
        honoured = True
        for line in lines:
            kind, _, rest = line.decode(errors="replace").partition("\t")
            if kind == AUDIT_KIND:
                inode, path, written, held = rest.split("\t")
                evidence = (
                    f"fsync not honoured: LazyFS answered the writer's fsync of {path} "
                    f"({written} bytes) with {held} bytes of it on its disk (inode {inode})"
                )
            elif kind == MISREAD:
                inode, where, size, reason = rest.split("\t")
                evidence = (
                    f"short read: the writer's garbage collector read {where} through LazyFS "
                    f"as '{reason}' while LazyFS's disk held it whole ({size} bytes, inode "
                    f"{inode}); the sweep deleted no blob"
                )
            else:
                continue
            self.mishandled[int(inode)] = evidence
            self.result.lazyfs.append(evidence)
            honoured = False
        return honoured

    def _job(self, kind: str, **more: Any) -> dict[str, Any]:
        config = self.config
        return {
            "kind": kind,
            "target": config.target,
            # Writers on LazyFS; verifiers on its disk, unmounted (see _check).
            "path": str(self.fs.mount_dir if kind == "write" else self.fs.root),
            "disk": str(self.fs.root),
            "options": config.options,
            "tasks": config.tasks,
            "retention": config.retention,
            "gc_every": config.gc_every,
            "seed": 20261201,
            "errfile": str(self.workdir / f"{kind}.err"),
            **more,
        }

    def _stalled(self, pid: int) -> None:
        """The writer made no progress: a hung LazyFS (a cut) or a stuck store (a failure)."""
        waits = _fuse_waits(pid)
        if waits:
            self.fs.kill(f"LazyFS hung: the writer waited in {waits} for {_FIRST_ACK_SECONDS} s")
            raise _Unchosen
        os.kill(pid, signal.SIGUSR1)  # the writer prints its threads' stacks (faulthandler)
        time.sleep(1)
        stacks = (self.workdir / "write.err").read_text(errors="replace")[-6000:]
        raise HarnessError(f"the writer did nothing for {_FIRST_ACK_SECONDS} s:\n{stacks}")

    def _let_run(self, pid: int, pipe: AckPipe) -> None:
        """Let the writer run to the chosen moment; raise _Unchosen if LazyFS cuts first."""
        early = self.ledger.acks and self.rng.random() < self.config.early
        deadline = time.monotonic() + _FIRST_ACK_SECONDS
        while not (pipe.ready if early else pipe.acks):
            if time.monotonic() > deadline:
                self._stalled(pid)
            self._pump(pipe, time.monotonic() + 0.005)
        if early:  # in its first saves, while the store recovers from the last cut
            self._pump(pipe, time.monotonic() + self.rng.uniform(0, 0.05))
            return
        self._pump(pipe, time.monotonic() + self.rng.uniform(0, self.config.run_for))

    def _pump(self, pipe: AckPipe, until: float) -> None:
        while (left := until - time.monotonic()) > 0:
            pipe.pump(min(left, 0.02))
            if not self.fs.alive():
                raise _Unchosen
            if self.exit is None:
                self.exit = self.zygote.wait(0)
            if self.exit is not None:
                raise _Unchosen  # it stopped on its own: see _writer_exit

    def _cut(self, pid: int, pipe: AckPipe) -> bool:
        """Stop the writer, cut the power, kill the writer; False if LazyFS failed instead."""
        clean = self._stop(pid)
        pipe.pump(0)
        clean = self._clear_cache(clean) and clean
        self._kill(pid)
        pipe.drain(30)
        return clean

    def _stop(self, pid: int) -> bool:
        """SIGSTOP the writer and wait until no thread of it runs; False if LazyFS hung."""
        if self.exit is not None:
            return True
        with contextlib.suppress(ProcessLookupError):  # it ended, unreported yet
            os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not _stopped(pid):
            if time.monotonic() > deadline:  # a thread waits for LazyFS's answer
                self.fs.kill("the writer hung in a LazyFS call")  # the cut
                return False
            time.sleep(0.001)
        return True

    def _clear_cache(self, alive_before: bool) -> bool:
        """The cut: clear LazyFS's cache; False if LazyFS had died or fails to."""
        if not self.fs.alive():
            if alive_before:  # not killed by _stop: it died by itself
                code = self.fs.proc.poll() if self.fs.proc else None
                self.fs.kill(f"LazyFS died under the writer (exit {code}): {self.fs.tail()[-200:]}")
            return False
        try:
            usage = self.fs.cache_usage()
            self.fs.clear_cache()
        except LazyFSFault as exc:
            self.fs.kill(f"clear-cache failed: {exc}")
            return False
        self.result.cache_peak = max(self.result.cache_peak, usage)
        if usage >= 100:  # writes went straight through: the cut proved less
            self.result.lazyfs.append("cache full at the cut")
            return False
        return True

    def _kill(self, pid: int) -> None:
        """SIGKILL the (stopped) writer and collect its wait status."""
        if self.exit is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.exit = self.zygote.wait(30)
        if self.exit is None:
            self.fs.kill("the killed writer hung in a LazyFS call")
            self.exit = self.zygote.wait(30)
        if self.exit is None:
            raise HarnessError("the writer survived SIGKILL and a dead LazyFS")

    def _writer_exit(self) -> None:
        """A writer that stopped on its own failed: through LazyFS (a cut) or not (a bug)."""
        status = self.exit
        assert status is not None
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            return
        why = (self.workdir / "write.err").read_text(errors="replace")[-2000:]
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _LAZYFS_EXIT:
            found = re.search(r"\[Errno \d+\] ([^:'\"]+)", why)
            label = found.group(1) if found else "an error"
            self.result.lazyfs.append(f"the writer got '{label}' from LazyFS: {why[-300:]}")
            return
        self._found("error", f"the writer failed on its own ({status}): {why}")

    # --- checking ----------------------------------------------------------------------

    def _check(self, since: int, final: bool = False, how: str = "") -> None:
        request = self.workdir / "request.json"
        request.write_text(json.dumps(self.ledger.request(since)))
        result = self._run_verifier(request)
        self.result.checked += result.get("checked", 0)
        inodes: dict[str, list[int]] = result.get("inodes", {})
        bad = False
        for kind in ("lost", "corrupt", "torn", "behind", "error"):
            for problem in result.get(kind, ()):
                # About a record LazyFS was caught mishandling: LazyFS's loss.
                lazyfs = self._mishandled_one(inodes.get(problem.split(": ", 1)[0], []))
                if lazyfs is not None:
                    label, _, evidence = lazyfs.partition(": ")
                    why = f"{label}, then {kind}: {problem}{how}; {evidence}"
                    if why not in self.result.lazyfs:  # later checks find it again
                        self.result.lazyfs.append(why)
                    continue
                bad = True
                self._found(kind, f"{problem}{how}")
        self.result.bad_cuts += bad and not final
        if bad and self.keep:
            self._keep(Path(self.keep), final)

    def _keep(self, keep: Path, final: bool) -> None:
        """Copy a failed check's evidence under ``keep`` (for a human, never read back)."""
        slug = re.sub(r"[^a-z0-9]+", "-", self.config.name.lower()).strip("-")
        check = self.result.cuts + self.result.unchosen
        dest = keep / f"{slug}-store{self.stores}-{'final' if final else f'check{check}'}"
        shutil.copytree(self.fs.root, dest / "disk", symlinks=True, dirs_exist_ok=True)
        for source in (
            self.fs.log,
            self.fs.log.with_suffix(".log.prev"),
            self.fs.workdir / "lazyfs.out",
            *(self.workdir / n for n in ("write.err", "request.json", "result.json")),
        ):
            with contextlib.suppress(FileNotFoundError):
                shutil.copy(source, dest / source.name)
        (dest / "writer-lines.txt").write_bytes(b"\n".join(self.lines) + b"\n")

    def _mishandled_one(self, inodes: list[int]) -> str | None:
        """The evidence that LazyFS mishandled one of these records, if it did."""
        return next((self.mishandled[i] for i in inodes if i in self.mishandled), None)

    def _found(self, kind: str, problem: str) -> None:
        """Count a problem once: a checkpoint's loss is found again by later checks."""
        if kind in ("lost", "corrupt", "torn"):
            key = f"store {self.stores}: {problem.split(': ', 1)[0]}"
        else:  # "behind" and errors are counted per check
            key = f"check {self.result.cuts + self.result.unchosen}: {problem}"
        self.result.problems.setdefault(kind, {}).setdefault(key, problem)

    def _run_verifier(self, request: Path) -> dict[str, Any]:
        out = self.workdir / "result.json"
        out.unlink(missing_ok=True)
        self.zygote.start(self._job("verify", request=str(request), result=str(out)))
        status = self.zygote.wait(600)
        if status is None:
            raise HarnessError("the verifier ran for 10 minutes")
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            loaded: dict[str, Any] = json.loads(out.read_text())
            return loaded
        why = (self.workdir / "verify.err").read_text(errors="replace")[-2000:]
        return {"error": [f"the store did not open or read cleanly ({status}): {why}"]}
