"""The Lightning Client: worker processes that lease rollouts from a server, run the agent, report results."""

from agentlightning.client.api import ServerAPI
from agentlightning.client.client import Client, load_records
from agentlightning.client.pool import WorkerPool, start_workers
from agentlightning.protocol import ServerError

__all__ = ["Client", "ServerAPI", "ServerError", "WorkerPool", "load_records", "start_workers"]
