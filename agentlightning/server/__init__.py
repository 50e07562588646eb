"""The Lightning Server: durable store, rollout queue with leases, per-rollout OpenAI-compatible proxy, HTTP API.

Names are imported on first use, so clients importing the shared records do not load FastAPI and uvicorn.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "LightningServer": "agentlightning.server.lightning",
    "Settings": "agentlightning.server.runtime",
    "Upstream": "agentlightning.server.runtime",
    "Store": "agentlightning.server.store",
    "SQLiteStore": "agentlightning.server.store",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from agentlightning.server.lightning import LightningServer
    from agentlightning.server.runtime import Settings, Upstream
    from agentlightning.server.store import SQLiteStore, Store


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentlightning.server' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
