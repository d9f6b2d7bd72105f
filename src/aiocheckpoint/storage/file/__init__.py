"""The file store: checkpoints as files under one directory (docs/file-storage.md).

:class:`FileCheckpointStorage` is the public class. Its parts, one job each:

* :mod:`.store`: the public class, its argument checks and its one hop per call;
* :mod:`.format`: names and small files on disk (directory names, step names, the marker,
  the latest-step hint); :mod:`.packs`: the bytes of pack files and their combined index;
* :mod:`.io`: the OS calls (the ``FileOps`` seam) and the file helpers built on them;
* :mod:`.layout`: the store's own directory and its format marker;
* :mod:`.dirs`: workflow directories, their lock and hint; :mod:`.records`: reading and
  writing records one save at a time; :mod:`.groupcommit`: concurrent saves queued for one
  worker-thread hop; :mod:`.batch`: writing one such group; :mod:`.durability`: whether
  ``syncfs`` is durable on this filesystem, else the fsyncs issued together;
* :mod:`.blobs`: content-addressed blobs in pack files; :mod:`.gc`: their garbage collection.
"""

from __future__ import annotations

from .dirs import ForeignEntry
from .names import FORMAT_VERSION
from .store import FileCheckpointStorage

__all__ = ["FORMAT_VERSION", "FileCheckpointStorage", "ForeignEntry"]
