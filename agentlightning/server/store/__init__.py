"""The durable store: datasets, tasks, rollouts, attempts, calls, rewards, model versions and workers.

:class:`Store` is the small interface the server depends on; :class:`SQLiteStore` is the embedded default (SQLite
in WAL mode, one file, see :mod:`~agentlightning.server.store._schema`). Everything lives on disk, so nothing is
lost on restart and memory stays bounded.
"""

from agentlightning.server.store._interface import Conflict, NotFound, Store, StoreError
from agentlightning.server.store._sqlite import SQLiteStore

__all__ = ["Conflict", "NotFound", "SQLiteStore", "Store", "StoreError"]
