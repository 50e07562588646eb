"""The durable store: :class:`Store` is what the server depends on, :class:`SQLiteStore` the embedded default."""

from agentlightning.server.store._interface import Conflict, NotFound, Store, StoreError, StoreUnavailable
from agentlightning.server.store._lock import StoreInUse
from agentlightning.server.store._sqlite import SQLiteStore

__all__ = ["Conflict", "NotFound", "SQLiteStore", "Store", "StoreError", "StoreInUse", "StoreUnavailable"]
