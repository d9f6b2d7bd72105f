"""PostgreSQL storage over asyncpg, with group commit (docs/postgres-storage.md).

asyncpg is an optional dependency (``pip install aiocheckpoint[postgres]``): it is imported
the first time a storage is used, never when this package is imported.

The parts, each a module:

* :mod:`.store`: :class:`PostgresCheckpointStorage`, its options and argument checks;
* :mod:`.connection`: the lazy asyncpg import, the pool (opened, and the schema migrated, on
  first use), driver errors and retries; :mod:`.dsn`: the DSN and options, checked up front;
* :mod:`.schema`: the tables and their migrations; :mod:`.sql`: every statement;
* :mod:`.batching`: group commit, concurrent saves sharing one statement and one commit;
* :mod:`.records`: reads and deletes of checkpoint records;
* :mod:`.blobs`: the blobs of incremental checkpoints and their reference counts;
* :mod:`.leases`: workflow records and leases, judged by the server's clock.
"""

from .stats import WriteStats
from .store import PostgresCheckpointStorage

__all__ = ["PostgresCheckpointStorage", "WriteStats"]
