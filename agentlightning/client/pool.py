"""A pool of worker processes for one agent, supervised: crashed or hung workers are reported and replaced.

Workers are started with ``multiprocessing``'s ``spawn`` method, so the agent must be importable by reference
(see :mod:`agentlightning.client.agentref`). The pool watches every worker through shared memory: a worker that
dies mid-rollout has that attempt reported as failed right away (the server retries it); a worker that stops
responding past its rollout's timeout is killed, the attempt reported as 'timeout', and a fresh worker started.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentlightning.client.agentref import agent_ref
from agentlightning.client.api import ServerAPI, ServerError, Unreachable
from agentlightning.client.worker import EXIT_ABANDONED, WorkerConfig, WorkerSlot, resend_spooled, worker_main
from agentlightning.types import ErrorInfo, Rollout, new_id

logger = logging.getLogger(__name__)

EXIT_AUTH = 2
CRASH_LOOP_LIMIT = 5


def default_spool_dir() -> str:
    """Where results that could not be uploaded are kept: ``$AGL_SPOOL_DIR`` or ``~/.cache/agentlightning/spool``."""
    return os.environ.get("AGL_SPOOL_DIR") or str(Path.home() / ".cache" / "agentlightning" / "spool")


def resolve_nworkers(nworkers: int) -> int:
    """``-1`` means one worker per CPU core."""
    if nworkers == -1:
        return os.cpu_count() or 1
    if nworkers < 1:
        raise ValueError(f"nworkers must be >= 1 or -1 (one per core), got {nworkers}")
    return nworkers


@dataclass
class _Worker:
    index: int
    worker_id: str
    process: Any
    slot: WorkerSlot
    started: float


class WorkerPool:
    """``nworkers`` processes serving rollouts of ``agent`` from the server at ``server_url``.

    Use :func:`start_workers` (or ``with WorkerPool(...) as pool``); :meth:`wait` returns when every worker has
    exited (the server said stop), :meth:`drain` lets running rollouts finish and stops, :meth:`stop` drains
    with a deadline and then kills.
    """

    def __init__(
        self,
        agent: Any,
        server_url: str,
        nworkers: int = -1,
        *,
        token: str | None = None,
        timeout: float | None = None,
        kill_grace: float = 5.0,
        spool_dir: str | None = None,
        log_level: int = logging.INFO,
        upload_retry_seconds: float = 600.0,
        reconnect_seconds: float = 600.0,
    ) -> None:
        self.ref = agent_ref(agent)
        self.server_url = server_url.rstrip("/")
        self.nworkers = resolve_nworkers(nworkers)
        self.token = token
        self.timeout = timeout
        self.kill_grace = kill_grace
        self.spool_dir = spool_dir or default_spool_dir()
        self.log_level = log_level
        self.upload_retry_seconds = upload_retry_seconds
        self.reconnect_seconds = reconnect_seconds
        self.client_id = f"{socket.gethostname()}-{os.getpid()}-{new_id('c')[2:8]}"
        self.error: str | None = None
        self._ctx = multiprocessing.get_context("spawn")
        self._drain = self._ctx.Event()
        self._workers: dict[int, _Worker] = {}
        self._generation = 0
        self._quick_crashes = 0
        self._done = threading.Event()
        self._monitor: threading.Thread | None = None
        self._api = ServerAPI(self.server_url, token)

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> WorkerPool:
        """Send spooled results from earlier runs, then start the workers and their supervisor thread."""
        sent = resend_spooled(self._api, self.spool_dir)
        if sent:
            logger.info("re-sent %d spooled results", sent)
        for index in range(self.nworkers):
            self._spawn(index)
        self._monitor = threading.Thread(target=self._supervise, name="agl-worker-pool", daemon=True)
        self._monitor.start()
        logger.info("started %d workers for %s against %s", self.nworkers, self.ref, self.server_url)
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Block until all workers exited; False if ``timeout`` passed first."""
        return self._done.wait(timeout)

    def drain(self, timeout: float | None = None) -> bool:
        """Stop taking rollouts; running ones finish and are reported. True if all workers exited in time."""
        self._drain.set()
        return self.wait(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Drain for up to ``timeout`` seconds, then kill what is left."""
        if not self.drain(timeout):
            logger.warning("workers still running after %.0f s; killing them", timeout)
            self.kill()
            self.wait(10)
        self._api.close()

    def kill(self) -> None:
        """Kill every worker now (their attempts are reported failed and retried by the server)."""
        self._drain.set()
        for worker in list(self._workers.values()):
            if worker.process.is_alive():
                worker.process.kill()

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [w.process.pid for w in self._workers.values() if w.process.is_alive()]

    def running(self) -> dict[int, tuple[str, int, float]]:
        """pid -> (rollout id, attempt, deadline) of the rollouts running now."""
        busy = {}
        for worker in self._workers.values():
            current = worker.slot.running()
            if current is not None and worker.process.is_alive():
                busy[worker.process.pid] = current
        return busy

    # -- supervision -------------------------------------------------------------------------------------------

    def _spawn(self, index: int) -> None:
        self._generation += 1
        worker_id = f"{self.client_id}-w{index}.{self._generation}"
        slot = WorkerSlot(
            deadline=self._ctx.RawValue("d", 0.0),  # type: ignore[arg-type]
            attempt=self._ctx.RawValue("i", 0),  # type: ignore[arg-type]
            rollout_id=self._ctx.RawArray("c", 64),  # type: ignore[arg-type]
        )
        config = WorkerConfig(
            agent_ref=self.ref, server_url=self.server_url, token=self.token, worker_id=worker_id,
            spool_dir=self.spool_dir, timeout=self.timeout, upload_retry_seconds=self.upload_retry_seconds,
            reconnect_seconds=self.reconnect_seconds, log_level=self.log_level,
        )
        process = self._ctx.Process(target=worker_main, args=(config, slot, self._drain), name=worker_id, daemon=True)
        process.start()
        self._workers[index] = _Worker(index, worker_id, process, slot, time.monotonic())

    def _supervise(self) -> None:
        try:
            while self._workers:
                for index, worker in list(self._workers.items()):
                    self._check(index, worker)
                time.sleep(0.05)
        except Exception:
            logger.exception("worker pool supervisor failed")
            self.error = "supervisor failed"
            self.kill()
        finally:
            self._done.set()

    def _check(self, index: int, worker: _Worker) -> None:
        current = worker.slot.running()
        process = worker.process
        if process.is_alive():
            if current is not None and time.monotonic() > current[2] + self.kill_grace:
                rollout_id, attempt, _ = current
                logger.error("worker %s stopped responding on %s; killing it", worker.worker_id, rollout_id)
                process.kill()
                process.join(5)
                self._report(worker, rollout_id, attempt, "timeout", ErrorInfo(
                    type="Timeout", message=f"agent did not finish within its timeout and its worker process "
                    f"(pid {process.pid}) stopped responding; the client killed it"))
                self._replace(index)
            return
        process.join()
        code = process.exitcode
        if current is not None:
            rollout_id, attempt, _ = current
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
            logger.error("worker %s %s while running %s", worker.worker_id, how, rollout_id)
            self._report(worker, rollout_id, attempt, "failed", ErrorInfo(
                type="WorkerDied", message=f"worker process pid {process.pid} {how} during attempt {attempt}"))
        if code == 0 or self._drain.is_set():
            del self._workers[index]
            return
        if code == EXIT_AUTH:
            self.error = "the server refused this client's token"
            logger.error("%s; stopping the pool", self.error)
            del self._workers[index]
            self.kill()
            return
        if code != EXIT_ABANDONED and time.monotonic() - worker.started < 2.0:
            self._quick_crashes += 1
            if self._quick_crashes >= CRASH_LOOP_LIMIT:
                self.error = f"workers keep crashing at start (last exit code {code}); see their stderr"
                logger.error("%s; stopping the pool", self.error)
                del self._workers[index]
                self.kill()
                return
        else:
            self._quick_crashes = 0
        self._replace(index)

    def _replace(self, index: int) -> None:
        if self._drain.is_set():
            self._workers.pop(index, None)
            return
        self._spawn(index)

    def _report(self, worker: _Worker, rollout_id: str, attempt: int, status: str, error: ErrorInfo) -> None:
        worker.slot.clear()
        result = Rollout(rollout_id=rollout_id, attempt=attempt, status=status, error=error,  # type: ignore[arg-type]
                         logs=[f"reported by the worker pool of client {self.client_id}: {error.message}"])
        try:
            self._api.upload_result(result, attempt, worker.worker_id, retry_for=30.0)
        except (ServerError, Unreachable) as exc:
            logger.warning("could not report %s of %s: %s (its lease will expire instead)", status, rollout_id, exc)


def start_workers(agent: Any, server_url: str, nworkers: int = -1, **options: Any) -> WorkerPool:
    """Start ``nworkers`` worker processes running ``agent`` against the server; returns the pool (``.stop()``)."""
    return WorkerPool(agent, server_url, nworkers, **options).start()

