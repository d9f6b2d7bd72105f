"""A warmed-up parent for the child processes a crash test SIGKILLs over and over.

Starting Python and importing aiocheckpoint costs about a second of CPU per child; a crash
test that kills thirty children spent most of its time there. :class:`Zygote` starts one
interpreter that imports the child script's modules once, then forks every child from it:
each child is still a process of its own, runs the script as ``__main__`` with its own
argv and its stdout on a pipe the test reads, and is SIGKILLed for real. What it does after
the fork (opening the store, recovering, writing) is what a freshly started one does.

The zygote is run as ``python _zygote.py SOCKET_FD SCRIPT MODULE...``; the test sends it
one request per child over a SOCK_SEQPACKET socket: the argv as JSON, with the write end of
the child's stdout pipe attached (SCM_RIGHTS). It answers ``<pid>``, then, once the child
has ended, ``<wait status>``. One child at a time.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from types import TracebackType
from typing import IO, Any


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
            self.returncode = os.waitstatus_to_exitcode(self._zygote.reply())
        return self.returncode


class Zygote:
    """One warmed-up interpreter that forks ``script`` children (see the module docstring)."""

    def __init__(self, script: Path, *preload: str) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        src = Path(importlib.import_module("aiocheckpoint").__file__ or "").parents[1]
        path = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno()), str(script), *preload],
            stdin=subprocess.DEVNULL,
            pass_fds=[theirs.fileno()],
            env={**os.environ, "PYTHONPATH": path},
        )
        theirs.close()

    def spawn(self, *args: str, text: bool = False) -> Child:
        """Fork a child running the script with ``args``; its stdout is ``Child.stdout``."""
        read, write = os.pipe()
        try:
            socket.send_fds(self._sock, [json.dumps(args).encode()], [write])
        finally:
            os.close(write)
        return Child(self, self.reply(), os.fdopen(read, "r" if text else "rb"))

    def reply(self) -> int:
        """The zygote's next answer (a pid or a wait status)."""
        answer = self._sock.recv(64)
        assert answer, f"the zygote died (exit {self.proc.poll()})"
        return int(answer)

    def __enter__(self) -> Zygote:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._sock.close()  # the zygote ends when its socket closes
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _run_child(sock: socket.socket, stdout: int, script: str, argv: list[str]) -> None:
    """In the forked child: stdout on the test's pipe, run the script, never return."""
    sock.close()
    os.dup2(stdout, 1)
    os.close(stdout)
    code = 0
    try:
        sys.argv = [script, *argv]
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        os._exit(code)


def serve(sock: socket.socket, script: str) -> None:
    """Fork a child per request, answer its pid and then its wait status; stop at EOF."""
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
        if not message:
            return
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            _run_child(sock, fds[0], script, json.loads(message))
        os.close(fds[0])
        sock.send(str(pid).encode())
        sock.send(str(os.waitpid(pid, 0)[1]).encode())


if __name__ == "__main__":
    fd, child_script, *modules = sys.argv[1:]
    for module in modules:
        importlib.import_module(module)
    serve(socket.socket(fileno=int(fd)), child_script)
