"""How the tests run the ``aiocheckpoint`` command: one child process per call, forked from a
warmed-up interpreter.

Each command the tests run (``tests/test_cli.py::cli`` and everything that imports it) used to
start ``python -m aiocheckpoint``, and most of its time went on starting Python and importing
the package. :func:`run` forks the command instead from a :class:`tests._zygote.Zygote` that
has imported the CLI and the backends once: one zygote per test process (so one per xdist
worker), started at the first call and ended when the process exits. The child is a process
of its own running ``python -m aiocheckpoint ARGS`` with the caller's stdin, cwd and
environment, its stdout and stderr captured; its exit code and output are the command's.

A call the zygote cannot honour runs as a fresh ``python -m aiocheckpoint`` subprocess:

* its environment differs from the zygote's in a variable the command may read while being
  imported: only those in :data:`PER_CALL` may differ (the command reads them when it runs),
  and not even those if the zygote's imports read them (the zygote reports what they read);
* it asks for more than ``stdin``, ``input``, ``cwd``, ``env`` and ``timeout``;
* another call is under way (from another thread).

``AIOCHECKPOINT_TEST_CLI_SUBPROCESS=1`` runs every call as a fresh subprocess.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

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

#: Variables a call may set differently from the zygote: the command reads them when it runs
#: (``NO_COLOR`` and ``AIOCHECKPOINT_DEBUG`` in the output, ``AIOCHECKPOINT_KEYS`` in the
#: parser) or never (pytest's per-test marker).
PER_CALL = frozenset({"NO_COLOR", "PYTEST_CURRENT_TEST"})
PER_CALL_PREFIX = "AIOCHECKPOINT_"

#: The keyword arguments of ``subprocess.run`` the zygote honours.
HONOURED = frozenset({"stdin", "input", "cwd", "env", "timeout"})

_lock = threading.Lock()
_zygote: Zygote | None = None


def run(args: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, -m, aiocheckpoint, *args], capture_output=True, text=True,
    **kwargs)``, forked from the zygote when it can honour the call."""
    if not _lock.acquire(blocking=False):
        return _fresh(args, kwargs)
    try:
        env = kwargs.get("env")
        env = dict(env if isinstance(env, Mapping) else os.environ)
        zygote = _zygote_for(env, kwargs)
        if zygote is None:
            return _fresh(args, kwargs)
        return _forked(zygote, args, {**kwargs, "env": env})
    finally:
        _lock.release()


def _fresh(args: Sequence[str], kwargs: dict[str, object]) -> subprocess.CompletedProcess[str]:
    """The call as a fresh subprocess."""
    command = [sys.executable, "-m", "aiocheckpoint", *args]
    return subprocess.run(command, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload,no-any-return]


def _forked(
    zygote: Zygote, args: Sequence[str], kwargs: dict[str, object]
) -> subprocess.CompletedProcess[str]:
    """The call as a child of ``zygote``; a zygote in doubt after an error is ended."""
    global _zygote
    try:
        return zygote.run(args, **kwargs)  # type: ignore[arg-type]
    except subprocess.TimeoutExpired:
        raise  # the child was killed and reaped as subprocess.run does: the zygote is fine
    except BaseException:
        _zygote = None
        zygote.close()
        raise


def _zygote_for(env: Mapping[str, str], kwargs: dict[str, object]) -> Zygote | None:
    """The zygote, started on first use, if it can honour a call in ``env``; else None."""
    global _zygote
    if os.environ.get(SWITCH) == "1" or not HONOURED.issuperset(kwargs):
        return None
    if _zygote is not None and _zygote.proc.poll() is not None:
        _zygote = None  # it died: start another
    if _zygote is None:
        _zygote = Zygote("aiocheckpoint", *PRELOAD, env=_without_per_call(env))
        atexit.register(_zygote.close)
    differing = {k for k in env.keys() | _zygote.env.keys() if env.get(k) != _zygote.env.get(k)}
    if all(_per_call(k) and k not in _zygote.imported_env for k in differing):
        return _zygote
    return None


def _per_call(name: str) -> bool:
    return name in PER_CALL or name.startswith(PER_CALL_PREFIX)


def _without_per_call(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not _per_call(k)}
