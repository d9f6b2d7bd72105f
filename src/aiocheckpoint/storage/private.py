"""Whether a local store's file or directory is private to this process's user.

The file store checks its directories, the SQLite store its database files, with the one
test here: owned by the process's effective user, and writable by no one else. Another
user's entry, or one group or others may write, may have been planted to feed the store
forged records. What a backend does beyond that (SQLite makes its own readable database
owner-only) stays with the backend.
"""

from __future__ import annotations

import os
import stat
from typing import Final

from ..errors import StoragePermissionError

__all__ = ["SHARED_HINT", "refuse_unless_private"]

#: How a store shared on purpose is opened: said by every refusal.
SHARED_HINT: Final = (
    "a store shared on purpose is opened with allow_shared=True "
    "(on the command line: aiocheckpoint --allow-shared)"
)


def refuse_unless_private(path: str, info: os.stat_result, what: str) -> None:
    """Raise :class:`StoragePermissionError` unless ``info`` is private to this user.

    ``info`` is the stat of ``path``, a ``what`` ("file store directory", "SQLite
    file"): it must belong to the process's effective user and grant group and others no
    write permission (the sticky bit does not help: a planted file is the danger).
    """
    uid = os.geteuid()
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != uid:
        reason = f"the {what} belongs to uid {info.st_uid}, not to this process's uid {uid}"
    elif mode & 0o022:
        reason = f"the {what}'s mode {mode:04o} lets group or others write it (chmod go-w it)"
    else:
        return
    raise StoragePermissionError(path, f"{reason}; {SHARED_HINT}")
