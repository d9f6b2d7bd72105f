"""How the tests run the ``aiocheckpoint`` command: one child process per call, forked from a
warmed-up interpreter.

Each command the tests run (``tests/test_cli.py::cli`` and everything that imports it) used to
start ``python -m aiocheckpoint``, and most of its time went on starting Python and importing
the package. :func:`run` forks the command instead from a :class:`tests._zygote.Zygote` that
has imported the CLI and the backends once: one zygote per test process (so one per xdist
worker), started at the first call and ended when the process exits. The child is a process
of its own running ``python -m aiocheckpoint ARGS`` with the caller's stdin, working
directory, umask and environment, its stdout and stderr captured; its exit code and output
are the command's. :class:`Forks` is that machinery for any target: the docs' examples
(tests/test_docs.py) run through one of their own.

A call the zygote cannot honour runs as a fresh ``python -m aiocheckpoint`` subprocess:

* its environment differs from the zygote's in a variable the command may read while being
  imported: only those of :func:`per_call` may differ (the command reads them when it runs),
  and not even those if the zygote's imports read them (the zygote reports what they read);
* the test process's resource limits changed since the zygote started;
* it asks for more than ``stdin``, ``input``, ``cwd``, ``env`` and ``timeout``;
* another call is under way (from another thread).

``AIOCHECKPOINT_TEST_CLI_SUBPROCESS=1`` runs every call as a fresh subprocess.
"""

from __future__ import annotations

import atexit
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests._zygote import Zygote

#: Set to 1: every command runs as a fresh ``python -m aiocheckpoint`` subprocess.
SWITCH = "AIOCHECKPOINT_TEST_CLI_SUBPROCESS"

#: What the commands import when they run, imported once in the zygote.
PRELOAD = (
    "aiocheckpoint.cli",
    "aiocheckpoint.storage.file",
    "aiocheckpoint.storage.sqlite",
    "aiocheckpoint.storage.postgres",
    "asyncpg",
    "anyio._backends._asyncio",
    "cryptography.hazmat.primitives.ciphers.aead",
    "zstandard",
)

#: The keyword arguments of ``subprocess.run`` the zygote honours.
HONOURED = frozenset({"stdin", "input", "cwd", "env", "timeout"})


def per_call(name: str) -> bool:
    """Whether the variable ``name`` may differ between the zygote and a call: the command
    reads ``NO_COLOR``, ``AIOCHECKPOINT_DEBUG`` and ``AIOCHECKPOINT_KEYS`` when it runs (the
    output, the error handler, the parser), and pytest's per-test marker never."""
    return name in ("NO_COLOR", "PYTEST_CURRENT_TEST") or name.startswith("AIOCHECKPOINT_")


def honours(
    zygote_env: Mapping[str, str], imported: frozenset[str], env: Mapping[str, str]
) -> bool:
    """Whether a child of a zygote started in ``zygote_env``, whose imports read the variables
    ``imported``, sees ``env`` as a fresh process would."""
    differing = {k for k in env.keys() | zygote_env.keys() if env.get(k) != zygote_env.get(k)}
    return all(per_call(name) and name not in imported for name in differing)


class Forks:
    """Children of one target forked from a zygote: one per test process, started at the
    first call, ended when the process exits; a call it cannot honour (the module's
    docstring) runs as ``fresh + args`` in a new subprocess instead."""

    def __init__(self, target: Path | str, preload: Sequence[str], fresh: Sequence[str]) -> None:
        self.target, self.preload, self.fresh = target, tuple(preload), list(fresh)
        self._lock = threading.Lock()
        self._zygote: Zygote | None = None
        self._limits: list[tuple[int, int]] = []  # the test process's, when it started

    @property
    def zygote(self) -> Zygote | None:
        """The zygote running now, if one was started."""
        return self._zygote

    def run(self, args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """``subprocess.run([*fresh, *args], capture_output=True, text=True, **kwargs)``,
        forked from the zygote when it can honour the call."""
        if not self._lock.acquire(blocking=False):
            return self._fresh(args, kwargs)
        try:
            env = dict(kwargs.get("env") or os.environ)
            zygote = self.zygote_for(env, kwargs)
            if zygote is None:
                return self._fresh(args, kwargs)
            return self._forked(zygote, args, {**kwargs, "env": env})
        finally:
            self._lock.release()

    def _fresh(
        self, args: Sequence[str], kwargs: dict[str, Any]
    ) -> subprocess.CompletedProcess[str]:
        command = [*self.fresh, *args]
        return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)

    def _forked(
        self, zygote: Zygote, args: Sequence[str], kwargs: dict[str, Any]
    ) -> subprocess.CompletedProcess[str]:
        """The call as a child of ``zygote``; a zygote in doubt after an error is ended."""
        try:
            return zygote.run(args, **kwargs)
        except subprocess.TimeoutExpired:
            raise  # the child was killed and reaped, as subprocess.run does: the zygote is fine
        except BaseException:
            self._zygote = None
            zygote.close()
            raise

    def zygote_for(self, env: Mapping[str, str], kwargs: Mapping[str, object]) -> Zygote | None:
        """The zygote, started on first use, if it can honour a call in ``env``; else None."""
        if os.environ.get(SWITCH) == "1" or not HONOURED.issuperset(kwargs):
            return None
        if self._zygote is not None and self._zygote.proc.poll() is not None:
            self._zygote = None  # it died: start another
        if self._zygote is None:
            self._limits[:] = _resource_limits()
            self._zygote = Zygote(
                self.target, *self.preload, env={k: v for k, v in env.items() if not per_call(k)}
            )
            atexit.register(self._zygote.close)
        zygote = self._zygote
        if _resource_limits() != self._limits or not honours(zygote.env, zygote.imported_env, env):
            return None
        return zygote


#: The ``aiocheckpoint`` command's children.
CLI = Forks("aiocheckpoint", PRELOAD, [sys.executable, "-m", "aiocheckpoint"])


def run(args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, -m, aiocheckpoint, *args], capture_output=True, text=True,
    **kwargs)``, forked from the zygote when it can honour the call."""
    return CLI.run(args, **kwargs)


def _resource_limits() -> list[tuple[int, int]]:
    """This process's resource limits (a child inherits them)."""
    names = sorted(name for name in dir(resource) if name.startswith("RLIMIT_"))
    return [resource.getrlimit(getattr(resource, name)) for name in names]
