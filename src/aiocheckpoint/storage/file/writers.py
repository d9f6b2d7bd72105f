"""A cross-process lock per workflow for the integrations' writers (the file store's leases).

The file store keeps no leases, so an integration that appends to a workflow (read the latest
step, write the next) serializes its writers with :func:`holding`: an exclusive ``flock(2)``
on ``base_dir/locks/<encoded workflow id>``. ``flock`` locks belong to an open file
description, so two store objects in one process exclude each other as two processes do, and
the kernel releases the lock of a process that dies. The lock file lives outside the
workflow's directory, which ``delete(workflow)`` renames away: a writer waiting on a lock in
a deleted directory would not exclude one that made a new directory.

Opening (and creating) the file runs in a worker thread; taking the lock is a non-blocking
``flock`` retried with a short backoff, so a waiting writer never blocks the loop and a
cancelled one stops waiting; the lock is released on every exit by closing the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import time
from collections.abc import AsyncIterator
from typing import Final

import anyio
import anyio.to_thread

from ...errors import LeaseHeldError
from .io import OPEN_FLAGS
from .layout import StoreDir
from .names import LOCKS, encode_name

__all__ = ["holding"]

_FIRST_PAUSE: Final = 0.002
_LONGEST_PAUSE: Final = 0.05


def _open(layout: StoreDir, workflow_id: str) -> tuple[int, bool]:
    """Open (creating it as needed) the workflow's lock file; try the lock once."""
    layout.create()
    directory = os.path.join(layout.base, LOCKS)
    with contextlib.suppress(FileExistsError):
        layout.ops.mkdir(directory)
    path = os.path.join(directory, encode_name(workflow_id))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | OPEN_FLAGS, 0o600)
    try:
        return fd, _try_lock(fd)
    except BaseException:
        os.close(fd)
        raise


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock if it is free (never waits)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.asynccontextmanager
async def holding(layout: StoreDir, workflow_id: str, wait: float) -> AsyncIterator[None]:
    """Hold ``workflow_id``'s writer lock; :class:`LeaseHeldError` after ``wait`` seconds."""
    fd, locked = await anyio.to_thread.run_sync(_open, layout, workflow_id)
    try:
        deadline = time.monotonic() + wait
        pause = _FIRST_PAUSE
        while not locked:
            if time.monotonic() >= deadline:
                raise LeaseHeldError(
                    f"another writer has held workflow {workflow_id!r} for {wait:g} seconds"
                )
            await anyio.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, _LONGEST_PAUSE)
            locked = _try_lock(fd)  # LOCK_NB: a system call that returns at once
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(os.close, fd)  # releases the lock
