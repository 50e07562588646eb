"""The Lightning Client: worker processes (or Ray actors) that lease rollouts from a server, run the agent and
report results."""

from agentlightning.client._api import ServerAPI
from agentlightning.client._client import Client, load_records
from agentlightning.client._pool import WorkerPool, start_workers
from agentlightning.client._ray import RayWorkers
from agentlightning.protocol import ServerError

__all__ = ["Client", "RayWorkers", "ServerAPI", "ServerError", "WorkerPool", "load_records", "start_workers"]
