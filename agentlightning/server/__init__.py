"""The Lightning Server: durable store, rollout queue with leases, per-rollout OpenAI-compatible proxy, HTTP API."""

from agentlightning.server._lightning import LightningServer
from agentlightning.server._runtime import Route, Settings, Upstream
from agentlightning.server.store import SQLiteStore, Store

__all__ = ["LightningServer", "Route", "SQLiteStore", "Settings", "Store", "Upstream"]
