"""``agl.Client``: connect to a Lightning Server, upload a dataset, serve its rollouts with worker processes."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentlightning._decorator import RolloutAgent
from agentlightning.client._api import ServerAPI, resolve_token
from agentlightning.client._pool import WorkerPool
from agentlightning.client._ray import RayWorkers
from agentlightning.protocol import ServerError, Unreachable, dataset_id_for

logger = logging.getLogger(__name__)

SERVER_START_WAIT = 20.0
"""Seconds ``Client.train`` waits for a Lightning Server that is still starting (``agl server ... &`` just before)."""


def load_records(path: str | Path) -> list[Any]:
    """Tasks from a JSONL file (one JSON value per line) or a JSON file holding a list."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json dataset must hold a list of tasks, got {type(data).__name__}")
        return data
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc}): {line[:80]!r}") from None
    if not records:
        raise ValueError(f"{path}: no tasks in the file")
    return records


class Client:
    """A Lightning Client, e.g. ``agl.Client().train(agent_run, dataset="data/train.jsonl")``. The server URL comes
    from ``server_url``, else ``$AGL_SERVER_URL`` (or ``$AgentLightningServerUrl``); the token from ``token``, else
    ``$AGL_SERVER_TOKEN``."""

    def __init__(self, server_url: str | None = None, token: str | None = None) -> None:
        self.token = resolve_token(token)
        self.api = ServerAPI(server_url, self.token)
        self.server_url = self.api.server_url

    def upload_dataset(
        self, dataset: str | Path | Sequence[Any], dataset_id: str | None = None, name: str | None = None
    ) -> str:
        """Upload tasks (a JSONL/JSON file or a list) unless the server already has them; returns the dataset id."""
        if isinstance(dataset, (str, Path)):
            name = name or Path(dataset).name
            records = load_records(dataset)
        else:
            records = list(dataset)
        if dataset_id is None:
            wanted = dataset_id_for(records)
            try:
                self.api.request("GET", f"/datasets/{wanted}")
            except ServerError as exc:
                if exc.status != 404:
                    raise
            else:
                logger.info("server already has dataset %s (%d tasks); not uploading", wanted, len(records))
                return wanted
        info = self.api.request("POST", "/datasets", json={"records": records, "dataset_id": dataset_id, "name": name})
        logger.info("uploaded dataset %s (%d tasks)", info["dataset_id"], info["size"])
        return str(info["dataset_id"])

    def _check_server(self) -> None:
        """Wait up to :data:`SERVER_START_WAIT` seconds for a Lightning Server at ``server_url``; a URL nothing answers
        at, or that answers as another kind of server, is refused with what to check."""
        try:
            self.api.health(retry_for=SERVER_START_WAIT)
        except Unreachable as exc:
            raise Unreachable(
                f"no Lightning Server answers at {self.server_url} after {SERVER_START_WAIT:.0f} s ({exc}); check the "
                "URL (agl client --server-url, AGL_SERVER_URL) and that `agl server` runs there"
            ) from None
        except ServerError as exc:
            hint = (
                f"; the Lightning Server URL has no /v1 (that is the agents' OpenAI path): use {self.server_url[:-3]}"
                if self.server_url.endswith("/v1")
                else ""
            )
            raise ValueError(
                f"{self.server_url} is not a Lightning Server: GET /health answered {exc.status}{hint}"
            ) from None

    def train(
        self,
        agent: RolloutAgent | Callable[..., Any] | str,
        dataset: str | Path | Sequence[Any] | None = None,
        *,
        dataset_id: str | None = None,
        nworkers: int = -1,
        timeout: float | None = None,
        workers: RayWorkers | None = None,
        **pool_options: Any,
    ) -> str:
        """Serve rollouts of ``agent`` until the server says stop; returns the dataset id.

        Give ``dataset`` (a JSONL/JSON path or a list of tasks; uploaded if the server lacks it) or ``dataset_id``
        (already uploaded). ``nworkers=-1`` runs one worker process per core; ``workers=RayWorkers(...)`` runs Ray
        actors instead. ``timeout`` overrides the server's per-rollout timeout. Ctrl-C drains (running rollouts
        finish and are reported); a second Ctrl-C kills.
        """
        if (dataset is None) == (dataset_id is None):
            raise ValueError("Client.train: give exactly one of dataset=... (path or list) or dataset_id=...")
        self._check_server()
        dataset_id = dataset_id or self.upload_dataset(dataset)  # type: ignore[arg-type]
        try:
            self.api.request("POST", f"/datasets/{dataset_id}/attach")  # this client serves its rollouts
        except ServerError as exc:
            if exc.status != 404:
                raise
            raise ValueError(
                f"the server at {self.server_url} has no dataset {dataset_id!r}; upload it with dataset=... first"
            ) from None
        options = {"token": self.token, "timeout": timeout, **pool_options}
        pool: WorkerPool | RayWorkers = (
            workers.start(agent, self.server_url, **options)
            if workers is not None
            else WorkerPool(agent, self.server_url, nworkers, **options).start()
        )
        try:
            pool.wait()
        except KeyboardInterrupt:
            logger.warning("Ctrl-C or SIGTERM: letting running rollouts finish (a second one kills them)")
            try:
                pool.drain()
            except KeyboardInterrupt:
                pool.kill()
        finally:
            pool.stop()
        if pool.error:
            raise RuntimeError(f"Client.train stopped: {pool.error}")
        return dataset_id
