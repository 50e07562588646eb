"""Rollout workers as Ray actors (``pip install 'agentlightning-rl[ray]'``; Ray is imported here only, on use): each
actor runs the worker loop of :mod:`._worker` against a Lightning Server over HTTP. Ray restarts an actor that dies;
the rollout it held comes back through the server's lease expiry. See ``docs/scaling.md``."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import shutil
import socket
import tempfile
import threading
from typing import Any

from agentlightning.client._api import ServerAPI, resolve_server_url
from agentlightning.client._worker import (
    EXIT_AUTH,
    WorkerConfig,
    WorkerSlot,
    agent_ref,
    default_spool_dir,
    resend_every,
    resend_spooled,
    worker_main,
)
from agentlightning.types import new_id

logger = logging.getLogger(__name__)


class RayWorkers:
    """``num_workers`` Ray actors serving rollouts one at a time each, like worker processes: for
    ``agl.train(..., workers=...)``, ``agl.Client().train(..., workers=...)`` and ``agl client --ray [ADDRESS]``.

    ``address``: the cluster (``"auto"``, ``"ray://head:10001"``; None: ``$RAY_ADDRESS``, else one on this machine,
    else a new local one), unless Ray is initialised already. ``num_workers=-1``: as many as the CPUs allow.
    ``num_cpus_per_worker`` (fractions pack I/O-bound agents) and ``resources`` place the actors; ``runtime_env``
    ships code to them (local directories only at the job level: when Ray is initialised already, give those to
    ``ray.init``); ``max_restarts``: Ray's restarts of a dead actor (-1: always)."""

    def __init__(
        self,
        address: str | None = None,
        num_workers: int = 4,
        num_cpus_per_worker: float = 1.0,
        resources: dict[str, float] | None = None,
        runtime_env: dict[str, Any] | None = None,
        max_restarts: int = -1,
    ) -> None:
        if num_workers != -1 and num_workers < 1:
            raise ValueError(f"RayWorkers(num_workers={num_workers}): must be >= 1 or -1 (as many as the CPUs allow)")
        if not num_cpus_per_worker > 0:
            raise ValueError(f"RayWorkers(num_cpus_per_worker={num_cpus_per_worker}): must be > 0")
        self.address, self.num_workers, self.num_cpus_per_worker = address, num_workers, num_cpus_per_worker
        self.resources, self.runtime_env, self.max_restarts = resources, runtime_env, max_restarts
        self.error: str | None = None
        self._actors: list[Any] = []
        self._done = threading.Event()
        self._killed = False
        self._owns_ray = False

    def start(
        self,
        agent: Any,
        server_url: str,
        *,
        token: str | None = None,
        timeout: float | None = None,
        spool_dir: str | None = None,
        log_level: int = logging.INFO,
        upload_retry_seconds: float = 600.0,
        reconnect_seconds: float = 600.0,
        spool_retry_seconds: float = 30.0,
    ) -> RayWorkers:
        """Start the actors serving ``agent`` from the server at ``server_url`` (which the cluster's nodes must reach);
        the options are those of :class:`~agentlightning.client.WorkerPool`. Returns self (``.stop()``)."""
        if self._actors:
            raise RuntimeError("RayWorkers.start: already started (make one RayWorkers per pool)")
        ref = agent_ref(agent)
        if ref.startswith(("__main__:", "__mp_main__:")):
            raise ValueError(
                f"agent {ref!r} is defined in the script being run, which Ray actors cannot import: move "
                "it into a module (shipped with runtime_env={'working_dir': ...} if not installed)"
            )
        self.connect()
        ray = _import_ray()
        count = self.num_workers
        if count == -1:
            count = max(1, int(ray.cluster_resources().get("CPU", 1) // self.num_cpus_per_worker))
        config = WorkerConfig(
            agent_ref=ref,
            server_url=resolve_server_url(server_url),
            token=token,
            worker_id=f"{socket.gethostname()}-ray-{new_id('c')[2:8]}",
            spool_dir=spool_dir or "",
            log_dir="",
            timeout=timeout,
            upload_retry_seconds=upload_retry_seconds,
            reconnect_seconds=reconnect_seconds,
            log_level=log_level,
        )
        actor = ray.remote(_Actor).options(
            num_cpus=self.num_cpus_per_worker,
            resources=self.resources or {},
            runtime_env=None if self._owns_ray else self.runtime_env,  # else the job's, given to ray.init
            max_restarts=self.max_restarts,
            max_task_retries=-1,
            max_concurrency=2,
        )  # run() again after a restart
        self._actors = [actor.remote(config, index, spool_retry_seconds) for index in range(count)]
        runs = {handle.run.remote(): index for index, handle in enumerate(self._actors)}
        threading.Thread(target=self._watch, args=(ray, runs), name="agl-ray-workers", daemon=True).start()
        logger.info("started %d Ray workers for %s against %s", count, ref, config.server_url)
        return self

    def connect(self) -> str:
        """Join the cluster (unless Ray is initialised already); returns this machine's address as its nodes see it."""
        ray = _import_ray()
        if not ray.is_initialized():
            ray.init(address=self.address, runtime_env=self.runtime_env, logging_level=logging.WARNING)
            self._owns_ray = True
        return str(ray.util.get_node_ip_address())

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every actor's worker loop ended; False if ``timeout`` passed first."""
        return self._done.wait(timeout)

    def drain(self, timeout: float | None = None) -> bool:
        """Stop taking rollouts; running ones finish and are reported. True if all loops ended in time."""
        for handle in self._actors:
            handle.drain.remote()
        return self.wait(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Drain for up to ``timeout`` seconds, kill what is left, free the actors' resources (and disconnect from a
        cluster this object joined)."""
        if self._actors:
            if not self._done.is_set() and not self.drain(timeout):
                logger.warning("Ray workers still running after %.0f s; killing them", timeout)
            self.kill()
            self.wait(10)
        if self._owns_ray:
            _import_ray().shutdown()
            self._owns_ray = False

    def kill(self) -> None:
        """Kill every actor now, for good (their rollouts come back through the server's lease expiry)."""
        self._killed = True
        ray = _import_ray()
        for handle in self._actors:
            ray.kill(handle, no_restart=True)

    def _watch(self, ray: Any, runs: dict[Any, int]) -> None:
        pending = list(runs)
        try:
            while pending:
                (finished,), pending = ray.wait(pending, num_returns=1)
                try:
                    code = ray.get(finished)
                except Exception as exc:  # noqa: BLE001 - the loop raised (the agent did not import...), Ray gave up
                    if not self._killed:
                        self._fail(f"Ray worker {runs[finished]} failed: {getattr(exc, 'cause', None) or exc}")
                    continue
                if code == EXIT_AUTH:
                    self._fail("the server refused this client's token")
        finally:
            self._done.set()

    def _fail(self, error: str) -> None:
        self.error = error
        logger.error("%s; stopping the Ray workers", error)
        self.kill()


class _Actor:
    """One Ray actor: a worker loop on a thread of its own, so that ``drain`` can reach it."""

    def __init__(self, config: WorkerConfig, index: int, spool_retry_seconds: float) -> None:
        self.config = dataclasses.replace(  # a new worker id per incarnation: a restarted actor holds no old lease
            config,
            worker_id=f"{config.worker_id}-r{index}.{new_id('w')[2:8]}",
            spool_dir=config.spool_dir or default_spool_dir(),
            log_dir=tempfile.mkdtemp(prefix="agl-ray-worker-"),
        )
        self.spool_retry_seconds = spool_retry_seconds
        self.stop = threading.Event()

    def run(self) -> int:
        """Re-send what an earlier incarnation spooled on this node, then run the worker loop; its exit code."""
        api = ServerAPI(self.config.server_url, self.config.token)
        not_here: set[str] = set()
        resend_spooled(api, self.config.spool_dir, not_here=not_here)
        threading.Thread(
            target=resend_every,
            args=(api, self.config.spool_dir, self.spool_retry_seconds, self.stop, not_here),
            name="agl-spool",
            daemon=True,
        ).start()
        try:
            worker_main(self.config, WorkerSlot.create(multiprocessing), self.stop)
        except SystemExit as exc:  # the server refused the token
            return int(exc.code or 0)
        finally:
            self.stop.set()
            shutil.rmtree(self.config.log_dir, ignore_errors=True)
        return 0

    def drain(self) -> None:
        self.stop.set()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("Ray workers need Ray: pip install 'agentlightning-rl[ray]'") from exc
    return ray
