"""LazyFS for the power-loss suite: build it once, mount it, cut the power, outlive its bugs.

LazyFS (INESC TEC) is a FUSE filesystem that keeps written data in its own page cache until
the file is fsynced; ``lazyfs::clear-cache`` written to its faults FIFO drops everything not
yet synced, as a power cut would. Metadata (creates, renames, unlinks) reaches the disk at
once, so it cannot catch a missing directory fsync (the strace-style checks of
``tests/test_file_storage.py`` cover those).

It is a research prototype: it segfaults, deadlocks and answers ESTALE now and then. Every
wait here is bounded, and a LazyFS that misbehaves is SIGKILLed and lazily unmounted; its
death loses every unsynced write, which is one more power cut (at a moment nobody chose).

``build()`` runs ``build-lazyfs.sh`` (found in ``shared/tools/lazyfs/`` next to the
repository, or named by ``AIOCHECKPOINT_LAZYFS_SCRIPT``) into a directory outside the
repository (``AIOCHECKPOINT_LAZYFS_BUILD``, default ``<tmp>/aiocheckpoint-lazyfs``); the
script does nothing when the binary is already there. ``AIOCHECKPOINT_LAZYFS`` names a
binary built beforehand (``.ci/run`` builds it first). Failing to build is an error, never
a skip.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path("shared") / "tools" / "lazyfs" / "build-lazyfs.sh"
_USAGE = "cache usage (%pages) is "


class LazyFSFault(Exception):
    """LazyFS died, hung or refused a command: the trial is a cut nobody chose, or a retry."""


def build_script() -> Path:
    """``build-lazyfs.sh``: named by the environment or next to one of the repo's parents."""
    named = os.environ.get("AIOCHECKPOINT_LAZYFS_SCRIPT")
    candidates = [Path(named)] if named else [parent / SCRIPT for parent in REPO.parents]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise RuntimeError(
        f"cannot build LazyFS: no {SCRIPT} beside the repository (looked in "
        f"{', '.join(str(c) for c in candidates)}); set AIOCHECKPOINT_LAZYFS_SCRIPT or "
        "AIOCHECKPOINT_LAZYFS"
    )


def build() -> Path:
    """The LazyFS binary, built once per build directory (a lock keeps builds apart)."""
    prebuilt = os.environ.get("AIOCHECKPOINT_LAZYFS")
    if prebuilt:
        binary = Path(prebuilt)
        if not os.access(binary, os.X_OK):
            raise RuntimeError(f"AIOCHECKPOINT_LAZYFS={prebuilt} is not an executable")
        return binary
    out = Path(
        os.environ.get("AIOCHECKPOINT_LAZYFS_BUILD")
        or Path(tempfile.gettempdir()) / "aiocheckpoint-lazyfs"
    )
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(
            ["bash", str(build_script()), str(out / "build")],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not os.access(lines[-1], os.X_OK):
        raise RuntimeError(
            f"build-lazyfs.sh failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
            f"\n{proc.stderr[-3000:]}"
        )
    return Path(lines[-1])


def _config(fifo: Path, done: Path, log: Path, cache_mb: int) -> str:
    # AIOCHECKPOINT_LAZYFS_LOG_OPS=1 logs every operation (slower; evidence for a human).
    ops = "true" if os.environ.get("AIOCHECKPOINT_LAZYFS_LOG_OPS") == "1" else "false"
    return (
        f'[faults]\nfifo_path="{fifo}"\nfifo_path_completed="{done}"\n'
        f'[cache]\napply_eviction=false\n[cache.simple]\ncustom_size="{cache_mb}mb"\n'
        f'blocks_per_page=1\n[filesystem]\nlog_all_operations={ops}\nlogfile="{log}"\n'
    )


def mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point, from /proc (a stat could hang on a dead FUSE)."""
    target = os.fsencode(path)
    with open("/proc/self/mountinfo", "rb") as info:
        return any(line.split(b" ")[4] == target for line in info)


class LazyFS:
    """One LazyFS daemon: ``root`` (the "disk") seen through ``mount`` (the filesystem).

    ``cache_mb`` must hold everything written between two cuts: with eviction off, LazyFS
    writes straight through once its cache is full, and the trial would prove less.
    """

    def __init__(self, binary: Path, workdir: Path, cache_mb: int = 24) -> None:
        if "-o" in str(workdir).lower():  # LazyFS would take its config path for an option
            raise ValueError(f"LazyFS cannot use a directory whose path holds '-o': {workdir}")
        self.binary = binary
        self.workdir = workdir
        self.mount_dir = workdir / "mnt"
        self.root = workdir / "root"
        self.fifo = workdir / "faults.fifo"
        self.done = workdir / "done.fifo"
        self.log = workdir / "lazyfs.log"
        self.config = workdir / "lazyfs.toml"
        self.cache_mb = cache_mb
        self.proc: subprocess.Popen[bytes] | None = None
        self.done_fd: int | None = None  # our end of the completions FIFO, open while mounted
        self.deaths: list[str] = []  # how each unplanned death or hang ended

    def mount(self, timeout: float = 30.0) -> None:
        """Start the daemon and wait for the mount; raise :class:`LazyFSFault` if it fails."""
        self.mount_dir.mkdir(parents=True, exist_ok=True)
        assert mounted(self.root), "wipe() first: it mounts the disk"
        self.config.write_text(_config(self.fifo, self.done, self.log, self.cache_mb))
        with contextlib.suppress(FileNotFoundError):  # the log holds this mount's life only
            self.log.replace(self.log.with_suffix(".log.prev"))
        with open(self.workdir / "lazyfs.out", "ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(self.binary),
                    str(self.mount_dir),
                    "--config-path",
                    str(self.config),
                    "-o",
                    "allow_other",
                    "-o",
                    "modules=subdir",
                    "-o",
                    f"subdir={self.root}",
                    "-f",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not (mounted(self.mount_dir) and self.done.exists()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill(f"mount failed (exit {self.proc.poll()})")
                raise LazyFSFault(f"LazyFS did not mount: {self.tail()}")
            time.sleep(0.005)
        # Its faults worker opens the completions FIFO for writing, blocking until a reader
        # comes, and would die of SIGPIPE writing to it with none: ours stays open.
        self.done_fd = os.open(self.done, os.O_RDONLY | os.O_NONBLOCK)

    def alive(self) -> bool:
        """Whether the daemon still runs."""
        return self.proc is not None and self.proc.poll() is None

    def clear_cache(self, timeout: float = 15.0) -> None:
        """Lose every unsynced write (the power cut); raise :class:`LazyFSFault` if it fails."""
        assert self.done_fd is not None
        self._command(b"lazyfs::clear-cache\n", timeout)
        answer = b""
        deadline = time.monotonic() + timeout
        while b"finished::clear-cache" not in answer:
            left = deadline - time.monotonic()
            if left <= 0 or not self.alive():
                raise LazyFSFault(f"clear-cache not confirmed: {self.tail()}")
            if select.select([self.done_fd], [], [], min(left, 0.05))[0]:
                with contextlib.suppress(BlockingIOError):
                    answer += os.read(self.done_fd, 4096)

    def cache_usage(self, timeout: float = 5.0) -> float:
        """The share of the cache in use, in percent (100: writes now go straight through).

        LazyFS reads one command per ``read(2)`` of its FIFO, so commands go one at a time:
        this one is answered in its log.
        """
        before = self._log().count(_USAGE)
        self._command(b"lazyfs::display-cache-usage\n", timeout)
        deadline = time.monotonic() + timeout
        while (log := self._log()).count(_USAGE) == before:
            if time.monotonic() > deadline or not self.alive():
                raise LazyFSFault(f"no answer to display-cache-usage: {self.tail()}")
            time.sleep(0.002)
        return float(log.rsplit(_USAGE, 1)[1].split("%", 1)[0])

    def _log(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _command(self, line: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:  # ENXIO: its reader is not (yet, or any more) there
                if exc.errno != errno.ENXIO or time.monotonic() > deadline or not self.alive():
                    raise LazyFSFault(f"faults FIFO refused the command: {exc}") from exc
                time.sleep(0.005)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def unmount(self, timeout: float = 15.0) -> None:
        """Unmount cleanly, or kill the daemon and unmount lazily if that does not work."""
        if self.proc is None and not mounted(self.mount_dir):
            return  # killed already
        if not self.alive():
            self.kill("died before the unmount")
            return
        try:
            subprocess.run(
                ["fusermount3", "-u", str(self.mount_dir)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=True,
            )
            assert self.proc is not None
            self.proc.wait(timeout)  # it aborts on its way out, which is harmless
        except (subprocess.SubprocessError, OSError) as exc:
            self.kill(f"unmount failed: {exc}")
            return
        self.proc = None
        self._close_done()

    def _close_done(self) -> None:
        if self.done_fd is not None:
            os.close(self.done_fd)
            self.done_fd = None

    def kill(self, why: str) -> None:
        """SIGKILL the daemon (its unsynced data dies with it) and detach the mount."""
        self.deaths.append(why)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        self.proc = None
        self._close_done()
        for _ in range(50):
            if not mounted(self.mount_dir):
                return
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run(
                    ["fusermount3", "-u", "-z", str(self.mount_dir)],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=15,
                )
            time.sleep(0.05)
        raise RuntimeError(f"{self.mount_dir} stays mounted after killing LazyFS")

    def wipe(self) -> None:
        """Empty the disk (LazyFS unmounted): the next store starts from nothing.

        The disk is a tmpfs of its own: LazyFS already decides what a power cut keeps, and a
        real disk's fsyncs under it (~5 ms each here) would only slow the trials down.
        """
        assert not mounted(self.mount_dir)
        if not mounted(self.root):
            self.root.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=1g,mode=0700", "tmpfs", str(self.root)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=30,
                check=True,
            )
        for entry in os.scandir(self.root):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)

    def close(self) -> None:
        """Unmount LazyFS and the disk, if they are mounted."""
        if mounted(self.mount_dir):
            self.unmount()
        if mounted(self.root):
            subprocess.run(
                ["umount", "-l", str(self.root)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=30,
                check=True,
            )

    def tail(self) -> str:
        """The end of the daemon's output, for error messages."""
        try:
            return (self.workdir / "lazyfs.out").read_text(errors="replace")[-1500:]
        except OSError:
            return ""


if __name__ == "__main__":
    print(build())  # .ci/run builds it before the tests and passes it on as AIOCHECKPOINT_LAZYFS
