"""Where a training step's rollouts run: through the Lightning Server and worker processes, or in-process.

- :class:`ServerRollouts` (the default of ``agl.train``): a :class:`~agentlightning.server.LightningServer` whose
  proxy forwards to the model backend and records exact token ids per call (``token_source='server'``), and a
  pool of worker processes running the agent (``agentlightning.client.start_workers``).
- :class:`LocalRollouts`: the agent runs in threads of this process with ``agl.run`` against the backend directly
  (token ids from the responses, ``token_source='response'``); no server, no extra processes. Only the HF backend
  can be served this way: it returns token ids and applies the sampling overrides unasked, which vLLM does only
  when the request says so (the proxy's job).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from agentlightning._decorator import RolloutAgent
from agentlightning.types import LLM, Rollout

logger = logging.getLogger(__name__)


class RolloutSource(Protocol):
    """Runs ``group_size`` rollouts of each task on the model version currently served."""

    def run(self, tasks: Sequence[Any], group_size: int, group_prefix: str, timeout: float | None) -> list[Rollout]:
        ...

    def set_model(
        self, base_url: str, model_name: str, model_version: str, sampling_overrides: dict[str, Any] | None = None
    ) -> None:
        """Serve ``model_name`` at ``base_url`` as ``model_version``, forcing ``sampling_overrides`` on requests."""
        ...

    def close(self) -> None:
        ...


class ServerRollouts:
    """Rollouts through an in-process Lightning Server (proxy + SQLite store) and worker processes."""

    def __init__(
        self,
        agent: RolloutAgent,
        store_path: Path,
        nworkers: int,
        *,
        rollout_timeout: float | None,
        logprobs: bool = True,
    ) -> None:
        from agentlightning.client._pool import start_workers
        from agentlightning.server import LightningServer, Settings

        settings = Settings(rollout_timeout=rollout_timeout) if rollout_timeout is not None else Settings()
        self.server = LightningServer(store_path=store_path, settings=settings, logprobs=logprobs).start()
        self._logprobs = logprobs
        try:
            self.pool = start_workers(
                agent, self.server.url, nworkers, timeout=rollout_timeout, log_level=logging.WARNING
            )
        except Exception:
            self.server.stop()
            raise

    def set_model(
        self, base_url: str, model_name: str, model_version: str, sampling_overrides: dict[str, Any] | None = None
    ) -> None:
        self.server.set_upstream(base_url, model_name, model_version, logprobs=self._logprobs,
                                 sampling_overrides=sampling_overrides or {})

    def run(self, tasks: Sequence[Any], group_size: int, group_prefix: str, timeout: float | None) -> list[Rollout]:
        ids = self.server.enqueue(list(tasks), group_size=group_size, group_id=group_prefix)
        if self.pool.error:
            raise RuntimeError(f"the worker pool failed: {self.pool.error}")
        return self.server.wait(ids, timeout=timeout)

    def close(self) -> None:
        self.server.request_stop()
        try:
            self.pool.stop(timeout=15)
        finally:
            self.server.stop()


class RemoteRollouts(ServerRollouts):
    """Rollouts run by remote clients (``agl client`` / ``agl.Client().train``) of a server started elsewhere."""

    def __init__(self, server: Any, *, logprobs: bool = True) -> None:  # noqa: D107 - no workers of our own
        self.server = server
        self._logprobs = logprobs
        self.pool = None

    def run(self, tasks: Sequence[Any], group_size: int, group_prefix: str, timeout: float | None) -> list[Rollout]:
        ids = self.server.enqueue(list(tasks), group_size=group_size, group_id=group_prefix)
        return self.server.wait(ids, timeout=timeout)

    def close(self) -> None:
        self.server.request_stop()


class LocalRollouts:
    """Rollouts in threads of this process (``agl.run``) against the backend's own URL."""

    def __init__(self, agent: RolloutAgent, nworkers: int) -> None:
        self.agent = agent
        self.nworkers = max(1, nworkers)
        self.llm: LLM | None = None

    def set_model(
        self, base_url: str, model_name: str, model_version: str, sampling_overrides: dict[str, Any] | None = None
    ) -> None:
        # Only the HF backend is served this way (TrainConfig refuses another): it applies the overrides itself.
        self.llm = LLM(base_url=base_url, model=model_name, model_version=model_version)

    def run(self, tasks: Sequence[Any], group_size: int, group_prefix: str, timeout: float | None) -> list[Rollout]:
        from agentlightning._run import run

        if self.llm is None:
            raise RuntimeError("LocalRollouts.set_model() must be called before run()")
        expanded = [task for task in tasks for _ in range(group_size)]
        rollouts = run(self.agent, expanded, self.llm, n_workers=self.nworkers, timeout=timeout)
        for rollout in rollouts:  # every attempt has a task id (the task's own, else its content hash)
            rollout.group_id = f"{group_prefix}:{rollout.task_id}"
        return rollouts

    def close(self) -> None:
        return None
