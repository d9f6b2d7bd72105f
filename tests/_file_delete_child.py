"""A child that deletes from a file store and SIGKILLs itself part way.

Run by tests/test_file_effect_deletes.py.
``python _file_delete_child.py BASE step N``: delete step 1 of ``wf``, killed at the N-th
unlink that delete makes (through the store's OS-call seam). ``... workflow N``: delete
``wf`` whole, killed once N files of the renamed-away directory are removed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from aiocheckpoint.storage.file import FileCheckpointStorage
from aiocheckpoint.storage.file.dirs import WorkflowDirs
from aiocheckpoint.storage.file.io import FileOps


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillAtUnlink(FileOps):
    """The real OS calls, but the process dies instead of making the N-th unlink."""

    def __init__(self, at: int) -> None:
        self.left = at

    def unlink(self, path: str, *, dir_fd: int | None = None) -> None:
        self.left -= 1
        if self.left == 0:
            die()
        super().unlink(path, dir_fd=dir_fd)


def kill_while_removing(removed: int) -> None:
    """Make the removal of a renamed-away directory die after ``removed`` files."""

    def remove_tree(self: WorkflowDirs, path: str) -> None:
        files = [os.path.join(d, f) for d, _, fs in sorted(os.walk(path)) for f in sorted(fs)]
        for file in files[:removed]:
            os.unlink(file)
        die()

    WorkflowDirs.remove_tree = remove_tree  # type: ignore[method-assign]


async def main(base: str, mode: str, at: int) -> None:
    store = FileCheckpointStorage(base)
    if mode == "step":
        store._os = KillAtUnlink(at)
        await store.delete("wf", 1)
    else:
        kill_while_removing(at)
        await store.delete("wf")
    print("not killed", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
