"""The durable store: :class:`Store` is what the server depends on, :class:`SQLiteStore` the embedded default."""

from agentlightning.errors import Conflict, NotFound, StoreError, StoreInUse, StoreUnavailable
from agentlightning.server.store._interface import Store
from agentlightning.server.store._sqlite import SQLiteStore

__all__ = ["Conflict", "NotFound", "SQLiteStore", "Store", "StoreError", "StoreInUse", "StoreUnavailable"]
