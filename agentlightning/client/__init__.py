"""The Lightning Client: worker processes that lease rollouts from a server, run the agent, report results."""

from agentlightning.client._api import ServerAPI
from agentlightning.client._client import Client, load_records
from agentlightning.client._pool import WorkerPool, start_workers
from agentlightning.protocol import ServerError

__all__ = ["Client", "ServerAPI", "ServerError", "WorkerPool", "load_records", "start_workers"]
