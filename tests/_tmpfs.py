"""A small real tmpfs for full-disk and read-only tests (root only: the ``root`` tier)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tiny_tmpfs(tmp_path: Path, size: str = "256k") -> Iterator[Path]:
    """A ``size`` tmpfs mounted at ``tmp_path/mnt``, unmounted afterwards.

    A mount that fails fails the test: a skipped fault test is not a passing one. It is tried
    a few times first, as a mount can fail transiently while other workers mount and unmount.
    """
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)]
    for attempt in range(5):
        done = subprocess.run(command, capture_output=True, check=False)
        if done.returncode == 0:
            break
        time.sleep(0.2 * (attempt + 1))
    else:
        pytest.fail(f"cannot mount a tmpfs (the suite needs root): {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
