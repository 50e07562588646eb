"""The durable store: datasets, tasks, rollouts, attempts, calls, rewards, model versions and workers. :class:`Store`
is what the server depends on; :class:`SQLiteStore` the embedded default (one SQLite file: nothing is lost on restart,
memory stays bounded)."""

from agentlightning.server.store._interface import Conflict, NotFound, Store, StoreError
from agentlightning.server.store._sqlite import SQLiteStore

__all__ = ["Conflict", "NotFound", "SQLiteStore", "Store", "StoreError"]
