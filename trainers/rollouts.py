"""Where a training step's rollouts run: through the Lightning Server and worker processes, or in-process.

- :class:`ServerRollouts` (the default of ``agl.train``): a :class:`~agentlightning.server.LightningServer` whose
  proxy forwards to the model backend and records exact token ids per call (``token_source='server'``), and a
  pool of worker processes running the agent (``agentlightning.client.start_workers``).
- :class:`LocalRollouts`: the agent runs in threads of this process with ``agl.run`` against the backend directly
  (token ids from the responses, ``token_source='response'``); no server, no extra processes. Only the HF backend
  can be served this way: it returns token ids and applies the sampling overrides unasked, which vLLM does only
  when the request says so (the proxy's job).

:meth:`RolloutSource.submit` starts groups and returns one future per task, so the asynchronous loop
(``max_staleness > 0``) can train on the groups that finished while others still run; ``run`` waits for all.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from agentlightning._decorator import RolloutAgent
from agentlightning.types import LLM, Rollout

logger = logging.getLogger(__name__)

_WAIT_POLL = 2.0
"""Seconds between looks at whether a waited-for group still has rollouts in the queue."""
_WAIT_GRACE = 10.0
"""Seconds a group may run past ``rollout_timeout`` before its wait gives up (the server's own timeout comes first)."""


class RolloutSource(Protocol):
    """Runs ``group_size`` rollouts of each task on the model version currently served."""

    def submit(
        self, tasks: Sequence[Any], group_size: int, group_prefix: str, timeout: float | None
    ) -> list[Future[list[Rollout]]]:
        """Start the rollouts; one future per task resolves to its group (``group_id`` ``f"{group_prefix}:..."``)."""
        ...

    def run(self, tasks: Sequence[Any], group_size: int, group_prefix: str, timeout: float | None) -> list[Rollout]:
        """:meth:`submit`, then every group's rollouts in task order."""
        ...

    def set_model(
        self,
        base_url: str,
        model_name: str,
        model_version: str,
        sampling_overrides: dict[str, Any] | None = None,
        max_tokens_limit: int | None = None,
        routes: Sequence[Any] = (),
    ) -> None:
        """Serve ``model_name`` at ``base_url`` as ``model_version``, forcing ``sampling_overrides`` on requests and
        capping the tokens they ask for at ``max_tokens_limit``; ``routes`` (``agentlightning.server.Route``) serve
        some roles by other models (one policy per role)."""
        ...

    def close(self) -> None: ...


class ServerRollouts:
    """Rollouts through an in-process Lightning Server (proxy + SQLite store) and worker processes (or Ray actors:
    ``workers="ray"`` or an ``agl.RayWorkers``)."""

    def __init__(
        self,
        agent: RolloutAgent,
        store_path: Path,
        nworkers: int,
        *,
        rollout_timeout: float | None,
        logprobs: bool = True,
        workers: Any = "local",
    ) -> None:
        from agentlightning.client import RayWorkers, start_workers
        from agentlightning.server import LightningServer, Settings

        settings = Settings(rollout_timeout=rollout_timeout) if rollout_timeout is not None else Settings()
        ray_workers = RayWorkers(num_workers=nworkers) if workers == "ray" else None if workers == "local" else workers
        token = secrets.token_urlsafe(16) if ray_workers else None  # Ray nodes reach it beyond loopback
        self.server = LightningServer(
            store_path=store_path,
            settings=settings,
            logprobs=logprobs,
            token=token,
            host=ray_workers.connect() if ray_workers else "127.0.0.1",
        ).start()
        self._logprobs = logprobs
        self._waiting = _waiters()
        self._open: set[str] = set()  # rollouts submitted and not yet waited for
        try:
            options: dict[str, Any] = {"timeout": rollout_timeout, "log_level": logging.WARNING}
            self.pool = (
                ray_workers.start(agent, self.server.url, token=token, **options)
                if ray_workers
                else start_workers(agent, self.server.url, nworkers, **options)
            )
        except Exception:
            self.server.stop()
            raise

    def set_model(
        self,
        base_url: str,
        model_name: str,
        model_version: str,
        sampling_overrides: dict[str, Any] | None = None,
        max_tokens_limit: int | None = None,
        routes: Sequence[Any] = (),
    ) -> None:
        self.server.set_upstream(
            base_url,
            model_name,
            model_version,
            logprobs=self._logprobs,
            sampling_overrides=sampling_overrides or {},
            max_tokens_limit=max_tokens_limit,
            routes=routes,
        )

    def submit(
        self, tasks: Sequence[Any], group_size: int, group_prefix: str, timeout: float | None
    ) -> list[Future[list[Rollout]]]:
        if self.pool is not None and self.pool.error:
            raise RuntimeError(f"the worker pool failed: {self.pool.error}")
        groups = [self.server.enqueue([task], group_size=group_size, group_id=group_prefix) for task in tasks]
        self._open.update(rollout_id for ids in groups for rollout_id in ids)
        return [self._waiting.submit(self._wait, ids, timeout) for ids in groups]

    def _wait(self, ids: list[str], timeout: float | None) -> list[Rollout]:
        """The group once all its rollouts finished. ``timeout`` counts from the moment the last of them left the
        queue: a rollout waiting for a free worker (behind other groups, or for its retry) is not hung. The server
        times each attempt out itself; this wait is the backstop if it never answers."""
        try:
            if timeout is None:
                return self.server.wait(ids)
            limit = timeout + _WAIT_GRACE
            deadline = time.monotonic() + limit
            while True:
                try:
                    return self.server.wait(ids, timeout=max(0.0, min(_WAIT_POLL, deadline - time.monotonic())))
                except TimeoutError:
                    if any(self._queued(rollout_id) for rollout_id in ids):
                        deadline = time.monotonic() + limit
                    elif time.monotonic() >= deadline:
                        raise TimeoutError(
                            f"rollouts of group {ids[0]}... still running {limit:.0f} s after the last one started "
                            f"(rollout_timeout {timeout} s); counts: {self.server.store.counts()}"
                        ) from None
        finally:
            self._open.difference_update(ids)

    def _queued(self, rollout_id: str) -> bool:
        state = self.server.store.rollout_state(rollout_id)
        return state is not None and state[0] == "queued"

    def _cancel_open(self) -> None:
        """Cancel the rollouts submitted and not waited for (groups ahead of the last step), so that a resumed
        run's workers do not pick them up."""
        for rollout_id in list(self._open):
            try:
                self.server.store.cancel(rollout_id)
            except Exception:  # noqa: BLE001 - finished meanwhile, or the store is closing: nothing to cancel
                logger.debug("could not cancel rollout %s", rollout_id, exc_info=True)
        self._open.clear()

    def run(self, tasks: Sequence[Any], group_size: int, group_prefix: str, timeout: float | None) -> list[Rollout]:
        return _results(self.submit(tasks, group_size, group_prefix, timeout))

    def close(self) -> None:
        self._cancel_open()
        self.server.request_stop()
        try:
            if self.pool is not None:
                self.pool.stop(timeout=15)
        finally:
            self.server.stop()
            self._waiting.shutdown(wait=False, cancel_futures=True)


class RemoteRollouts(ServerRollouts):
    """Rollouts run by remote clients (``agl client`` / ``agl.Client().train``) of a server started elsewhere."""

    def __init__(self, server: Any, *, logprobs: bool = True) -> None:  # noqa: D107 - no workers of our own
        self.server = server
        self._logprobs = logprobs
        self.pool = None
        self._waiting = _waiters()
        self._open: set[str] = set()  # rollouts submitted and not yet waited for

    def close(self) -> None:
        self._cancel_open()
        self.server.request_stop()
        self._waiting.shutdown(wait=False, cancel_futures=True)


class LocalRollouts:
    """Rollouts in threads of this process (``agl.run``) against the backend's own URL."""

    def __init__(self, agent: RolloutAgent, nworkers: int) -> None:
        self.agent = agent
        self.nworkers = max(1, nworkers)
        self.llm: LLM | None = None
        self._pool = ThreadPoolExecutor(max_workers=self.nworkers, thread_name_prefix="agl-local-rollout")

    def set_model(
        self,
        base_url: str,
        model_name: str,
        model_version: str,
        sampling_overrides: dict[str, Any] | None = None,
        max_tokens_limit: int | None = None,
        routes: Sequence[Any] = (),
    ) -> None:
        # Only the HF backend is served this way (TrainConfig refuses another): it applies the overrides and the
        # length cap itself and routes each role to its policy (the X-AGL-Role header).
        self.llm = LLM(base_url=base_url, model=model_name, model_version=model_version)

    def submit(
        self, tasks: Sequence[Any], group_size: int, group_prefix: str, timeout: float | None
    ) -> list[Future[list[Rollout]]]:
        if self.llm is None:
            raise RuntimeError("LocalRollouts.set_model() must be called before run()")
        return [
            _gathered([self._pool.submit(self._one, task, group_prefix, timeout) for _ in range(group_size)])
            for task in tasks
        ]

    def run(self, tasks: Sequence[Any], group_size: int, group_prefix: str, timeout: float | None) -> list[Rollout]:
        return _results(self.submit(tasks, group_size, group_prefix, timeout))

    def _one(self, task: Any, group_prefix: str, timeout: float | None) -> Rollout:
        from agentlightning._run import run

        assert self.llm is not None
        (rollout,) = run(self.agent, [task], self.llm, n_workers=1, timeout=timeout)  # the version served now
        rollout.group_id = f"{group_prefix}:{rollout.task_id}"  # every attempt has a task id (own or content hash)
        return rollout

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _results(groups: list[Future[list[Rollout]]]) -> list[Rollout]:
    """The rollouts of ``groups``, in order, once all finished."""
    return [rollout for group in groups for rollout in group.result()]


def _waiters() -> ThreadPoolExecutor:
    """Threads that wait for submitted groups (a wait polls the store; it does not hold a worker)."""
    return ThreadPoolExecutor(max_workers=64, thread_name_prefix="agl-group-wait")


def _gathered(futures: list[Future[Rollout]]) -> Future[list[Rollout]]:
    """One future for the results of ``futures``, in order (the first failure fails it)."""
    group: Future[list[Rollout]] = Future()
    remaining = [len(futures)]
    lock = threading.Lock()

    def settle(_: Future[Rollout]) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        if any(future.cancelled() for future in futures):  # the source closed before they ran
            group.cancel()
            return
        failed = next((future.exception() for future in futures if future.exception() is not None), None)
        if failed is not None:
            group.set_exception(failed)
        else:
            group.set_result([future.result() for future in futures])

    for future in futures:
        future.add_done_callback(settle)
    return group
