"""A warmed-up parent for the child processes tests start over and over.

Starting Python and importing aiocheckpoint costs a quarter of a second to a second of CPU
per child; a crash test that kills thirty children, or a CLI test file that runs hundreds of
commands, spent most of its time there. :class:`Zygote` starts one interpreter that imports
the children's modules once, then forks every child from it. Each child is still a process
of its own: it runs a script (``python SCRIPT ARGS``) or a module (``python -m MODULE ARGS``)
as ``__main__``, with its own argv, descriptors 0-2, working directory and environment, and
it exits, or is SIGKILLed, for real. Users: the crash tests (tests/test_sqlite_crash.py,
tests/test_file_crash.py), the CLI tests' command runner (tests/cli_runner.py) and the docs'
examples (tests/test_docs.py).

A child is what a freshly started process would be, with these exceptions a caller handles:

* nothing carries over from an earlier child: the zygote only imports, it never runs a
  child's code, opens a store or creates an event loop;
* its ``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` are made again over the descriptors it
  was given, as start-up makes them (line-buffered on a terminal, block-buffered on a pipe);
* it runs its target at the top level of this script, so the interpreter itself turns a
  ``SystemExit``, an uncaught exception or a ``KeyboardInterrupt`` into the exit status, and
  runs the atexit hooks, as in a fresh process;
* its ``os.environ`` is the environment it was given, but whatever the interpreter and the
  preloaded modules read while starting up is the zygote's: :attr:`Zygote.imported_env` names
  the variables the imports read, and a caller must not give a child a different value of
  those (tests/cli_runner.py falls back to a fresh process instead);
* it shares the zygote's ``str`` hash seed (a fresh process draws its own).

The zygote is run as ``python _zygote.py SOCKET_FD KIND TARGET MODULE...`` (KIND ``path`` or
``module``). Over the SOCK_SEQPACKET socket it first sends the JSON list of the variables its
imports read; then the test sends one request per child: ``{"argv", "stdio", "cwd", "env"}``
as JSON, with the descriptors ``stdio`` numbers attached (SCM_RIGHTS). The zygote answers
``<pid>``, then, once the child has ended, its exit code (``-N`` for signal N). It reaps the
child only when the next request (or EOF) arrives, so until the test has read the exit code
the pid cannot be reused and SIGKILLing it is safe. One child at a time.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import locale
import os
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

_STDIO = ("stdin", "stdout", "stderr")


class Child:
    """A forked child, used like the ``subprocess.Popen`` it stands for."""

    def __init__(self, zygote: Zygote, pid: int, stdout: IO[Any]) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._zygote = zygote

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child."""
        os.kill(self.pid, sig)

    def wait(self) -> int:
        """Wait for the child to end; its exit code (``-signal`` if a signal killed it)."""
        if self.returncode is None:
            self.returncode = self._zygote.reply()
        return self.returncode


class Zygote:
    """One warmed-up interpreter that forks children (see the module docstring)."""

    def __init__(
        self, target: Path | str, *preload: str, env: Mapping[str, str] | None = None
    ) -> None:
        """Start it. ``target``: the script (a ``Path``) or the module (its name) children
        run; ``preload``: the modules to import once; ``env``: the zygote's environment
        (default: this process's, with aiocheckpoint's source first on ``PYTHONPATH``)."""
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if env is None:
            src = Path(importlib.import_module("aiocheckpoint").__file__ or "").parents[1]
            path = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))
            env = {**os.environ, "PYTHONPATH": path}
        self.env = dict(env)
        kind = "path" if isinstance(target, Path) else "module"
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno()), kind, str(target), *preload],
            stdin=subprocess.DEVNULL,
            pass_fds=[theirs.fileno()],
            env=self.env,
        )
        theirs.close()
        self._imported: frozenset[str] | None = None

    @property
    def imported_env(self) -> frozenset[str]:
        """The environment variables the zygote's imports read (waits for them to finish)."""
        if self._imported is None:
            self._imported = frozenset(json.loads(self._receive()))
        return self._imported

    def spawn(self, *args: str, text: bool = False) -> Child:
        """Fork a child running the target with ``args``; its stdout is ``Child.stdout``."""
        read, write = os.pipe()
        try:
            pid = self.start(args, {1: write})
        finally:
            os.close(write)
        return Child(self, pid, os.fdopen(read, "r" if text else "rb"))

    def start(
        self,
        args: Sequence[str],
        stdio: Mapping[int, int],
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        umask: int | None = None,
    ) -> int:
        """Fork a child running the target with ``args``; its pid. ``stdio`` maps some of
        0, 1, 2 to the descriptors the child gets there (the others are the zygote's);
        ``cwd``, ``env`` and ``umask`` default to the zygote's. :meth:`reply` then gives its
        exit code."""
        _ = self.imported_env  # the zygote's first message, before any answer
        request = {"argv": list(args), "stdio": list(stdio), "cwd": cwd, "env": env, "umask": umask}
        socket.send_fds(self._sock, [json.dumps(request).encode()], list(stdio.values()))
        return self.reply()

    def run(
        self,
        args: Sequence[str],
        *,
        stdin: int | None = None,
        input: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        umask: int | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``subprocess.run(args, stdin=, input=, capture_output=True, text=True, cwd=, env=,
        timeout=)`` for a child: the same streams, text, exit code and timeout behaviour. As
        with ``subprocess``, ``cwd`` and ``umask`` default to this process's current ones."""
        if input is not None and stdin is not None:
            raise ValueError("stdin and input arguments may not both be used.")
        cwd = os.getcwd() if cwd is None else cwd
        umask = current_umask() if umask is None else umask
        ends: list[int] = []  # the child's ends of its pipes, closed here once it has them
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        ends += [out_write, err_write]
        feed = None
        try:
            child_in, feed = _stdin_for(stdin, input, ends)
            stdio = {0: child_in, 1: out_write, 2: err_write}
            pid = self.start(args, stdio, cwd, env, umask)
        except BaseException:
            for fd in (out_read, err_read, *([feed] if feed is not None else [])):
                os.close(fd)
            raise
        finally:
            for fd in ends:
                os.close(fd)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            out, err, late = _exchange(feed, input, out_read, err_read, deadline)
        except BaseException:  # interrupted: leave no child behind
            os.kill(pid, signal.SIGKILL)
            self.reply()
            raise
        if late:
            os.kill(pid, signal.SIGKILL)  # not reaped before reply(): the pid is still its own
            self.reply()
            raise subprocess.TimeoutExpired(list(args), timeout or 0.0, out, err)
        code = self.reply()
        return subprocess.CompletedProcess(list(args), code, _text(out), _text(err))

    def reply(self) -> int:
        """The zygote's next answer (a pid or an exit code)."""
        return int(self._receive())

    def _receive(self) -> bytes:
        answer = self._sock.recv(1 << 20)
        assert answer, f"the zygote died (exit {self.proc.poll()})"
        return answer

    def close(self) -> None:
        """End the zygote (it ends when its socket closes) and wait for it."""
        self._sock.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def current_umask() -> int:
    """This process's umask, read without changing it where ``/proc`` tells it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _stdin_for(stdin: int | None, input: str | None, ends: list[int]) -> tuple[int, int | None]:
    """The descriptor the child reads as stdin, and the one ``input`` is written to."""
    if input is not None:
        read, write = os.pipe()
        ends.append(read)
        return read, write
    if stdin == subprocess.DEVNULL:
        ends.append(os.open(os.devnull, os.O_RDONLY))
        return ends[-1], None
    return (0 if stdin is None else stdin), None


def _exchange(
    feed: int | None, input: str | None, out: int, err: int, deadline: float | None
) -> tuple[bytes, bytes, bool]:
    """Write ``input`` to ``feed`` and read ``out`` and ``err`` to their ends; what was read,
    and whether the deadline passed first. Closes the three descriptors."""
    pipes = _Pipes(feed, input.encode(_encoding()) if input else b"", out, err)
    try:
        finished = pipes.run(deadline)
    finally:
        pipes.close()
    return pipes.read(out), pipes.read(err), not finished


class _Pipes:
    """Feeds a child's stdin and drains its stdout and stderr, as ``Popen.communicate`` does."""

    def __init__(self, feed: int | None, data: bytes, out: int, err: int) -> None:
        self.feed, self.data = feed, memoryview(data)
        self.got: dict[int, list[bytes]] = {out: [], err: []}
        self.selector = selectors.DefaultSelector()
        for fd in self.got:
            self.selector.register(fd, selectors.EVENT_READ)
        if feed is not None and data:
            self.selector.register(feed, selectors.EVENT_WRITE)
        elif feed is not None:
            os.close(feed)  # empty input: the child reads EOF at once

    def run(self, deadline: float | None) -> bool:
        """Exchange until every pipe is done (True) or the deadline passes (False)."""
        while self.selector.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            for key, _ in self.selector.select(left):
                self._write() if key.fd == self.feed else self._read(key.fd)
        return True

    def read(self, fd: int) -> bytes:
        """Everything read from ``fd``."""
        return b"".join(self.got[fd])

    def close(self) -> None:
        """Close the descriptors still open."""
        for key in list(self.selector.get_map().values()):
            self._done(key.fd)
        self.selector.close()

    def _write(self) -> None:
        assert self.feed is not None
        try:  # select said writable: up to PIPE_BUF bytes go in without blocking
            written = os.write(self.feed, self.data[: select.PIPE_BUF])
        except BrokenPipeError:  # the child closed its stdin: the rest is dropped
            written = len(self.data)
        self.data = self.data[written:]
        if not self.data:
            self._done(self.feed)

    def _read(self, fd: int) -> None:
        chunk = os.read(fd, 32768)
        self.got[fd].append(chunk)
        if not chunk:
            self._done(fd)

    def _done(self, fd: int) -> None:
        self.selector.unregister(fd)
        os.close(fd)


def _encoding() -> str:
    """The encoding ``subprocess`` uses for text (``text=True``)."""
    return locale.getpreferredencoding(False)


def _text(data: bytes) -> str:
    """Output as ``subprocess`` gives it with ``text=True``: decoded, newlines translated."""
    return data.decode(_encoding()).replace("\r\n", "\n").replace("\r", "\n")


# --- the zygote's side ---------------------------------------------------------------------


def preload(modules: Sequence[str]) -> set[str]:
    """Import ``modules`` (those not installed are left to the children, which fail as a
    fresh process would); the environment variables the imports read."""
    read: set[str] = set()
    plain = type(os.environ)

    class Recording(plain):  # type: ignore[misc,valid-type]
        def __getitem__(self, key: Any) -> Any:
            read.add(key if isinstance(key, str) else os.fsdecode(key))
            return plain.__getitem__(self, key)

        def __iter__(self) -> Any:
            keys = list(plain.__iter__(self))
            read.update(k if isinstance(k, str) else os.fsdecode(k) for k in keys)
            return iter(keys)

    watched = [os.environ, *([os.environb] if os.supports_bytes_environ else [])]
    for mapping in watched:
        mapping.__class__ = Recording
    try:
        for module in modules:
            with contextlib.suppress(ImportError):
                importlib.import_module(module)
    finally:
        for mapping in watched:
            mapping.__class__ = plain
    return read


def serve(sock: socket.socket) -> dict[str, Any] | None:
    """Fork a child per request; answer its pid, then its exit code. Returns the request in
    the child (set up as asked), None in the zygote once the socket is closed."""
    child = 0
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if child:
            os.waitpid(child, 0)  # reaped only now: the test may SIGKILL it until it knows
        if not message:
            return None
        request: dict[str, Any] = json.loads(message)
        sys.stdout.flush()
        sys.stderr.flush()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child
            _become_child(sock, request, fds)
            return request
        for fd in fds:
            os.close(fd)
        try:
            sock.send(str(child).encode())
            sock.send(str(_exit_code(child)).encode())
        except OSError:  # the test is gone
            os.waitpid(child, 0)
            return None


def _exit_code(pid: int) -> int:
    """Wait for ``pid`` to end without reaping it; its exit code, ``-N`` for signal N."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert info is not None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _become_child(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: take the descriptors, directory and environment asked for."""
    sock.close()
    for target, fd in zip(request["stdio"], fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    if request["cwd"] is not None:
        os.chdir(request["cwd"])
    if request["umask"] is not None:
        os.umask(request["umask"])
    if request["env"] is not None:
        os.environ.clear()
        os.environ.update(request["env"])
    for target in request["stdio"]:
        _reopen(target)


def _reopen(fd: int) -> None:
    """Make ``sys.std*`` of ``fd`` again over its new descriptor, as start-up makes it."""
    name = _STDIO[fd]
    old = getattr(sys, f"__{name}__")
    writing, unbuffered = fd > 0, bool(old.write_through)
    mode, buffering = ("wb", 0 if unbuffered else -1) if writing else ("rb", -1)
    binary = open(fd, mode, buffering, closefd=False)  # noqa: SIM115 - it is the new sys.std*
    raw: Any = binary if buffering == 0 else binary.raw  # type: ignore[attr-defined]
    raw.name = f"<{name}>"
    stream = io.TextIOWrapper(
        binary,
        encoding=old.encoding,
        errors=old.errors,
        newline="\n",
        line_buffering=not unbuffered and (os.isatty(fd) or fd == 2),
        write_through=unbuffered,
    )
    stream.mode = "w" if writing else "r"  # type: ignore[misc]
    setattr(sys, name, stream)
    setattr(sys, f"__{name}__", stream)


def _run_as_main(kind: str, target: str, argv: list[str]) -> None:
    """Run the target as ``python TARGET ARGV`` or ``python -m TARGET ARGV`` would."""
    if kind == "module":
        if not getattr(sys.flags, "safe_path", False):  # -P, 3.11+
            sys.path[0] = os.getcwd()
        sys.argv = ["-m", *argv]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        if not getattr(sys.flags, "safe_path", False):  # -P, 3.11+
            sys.path[0] = os.path.dirname(os.path.abspath(target))
        sys.argv = [target, *argv]
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    _fd, _kind, _target, *_modules = sys.argv[1:]
    _sock = socket.socket(fileno=int(_fd))
    _sock.send(json.dumps(sorted(preload(_modules))).encode())
    gc.collect()
    gc.freeze()  # the children's collections skip what the zygote made: no copy-on-write
    _request = serve(_sock)
    if _request is not None:  # the child: exits the way a fresh interpreter does
        _run_as_main(_kind, _target, _request["argv"])
