"""A pool of worker processes for one agent, supervised: a worker that dies mid-rollout has that attempt reported as
failed with its log lines (the server retries it); one that stops responding (holding the GIL) or outlives its
rollout's timeout is killed, the attempt reported as 'timeout'; either is replaced. Workers are spawned, so the agent
must be importable (:func:`._worker.agent_ref`)."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agentlightning.client._api import ServerAPI
from agentlightning.client._worker import (
    EXIT_ABANDONED,
    EXIT_AUTH,
    WorkerConfig,
    WorkerSlot,
    agent_ref,
    default_spool_dir,
    resend_every,
    resend_spooled,
    worker_main,
)
from agentlightning.protocol import ProtocolError
from agentlightning.types import ErrorInfo, Rollout, RolloutStatus, new_id

logger = logging.getLogger(__name__)

CRASH_LOOP_LIMIT = 5
LOG_TAIL_BYTES = 64 * 1024  # of a dead worker's attempt log kept with the attempt


@dataclasses.dataclass
class _Worker:
    process: Any  # named by its worker id
    slot: WorkerSlot
    started: float


class WorkerPool:
    """``nworkers`` processes (``-1``: one per core) serving rollouts of ``agent`` from the server at ``server_url``,
    started by :meth:`start` (or :func:`start_workers`, or ``with``). Results that cannot be uploaded are spooled to
    ``spool_dir`` (``$AGL_SPOOL_DIR``, else ``~/.cache/agentlightning/spool``), re-sent every ``spool_retry_seconds``.
    A worker silent for ``unresponsive_seconds`` (at most half its lease, at least 3) during a rollout is killed."""

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
        unresponsive_seconds: float = 10.0,
        spool_retry_seconds: float = 30.0,
    ) -> None:
        if nworkers != -1 and nworkers < 1:
            raise ValueError(f"nworkers must be >= 1 or -1 (one per core), got {nworkers}")
        self.nworkers = (os.cpu_count() or 1) if nworkers == -1 else nworkers
        self.kill_grace, self.unresponsive_seconds = kill_grace, unresponsive_seconds
        self.spool_retry_seconds = spool_retry_seconds
        self._log_dir = tempfile.mkdtemp(prefix="agl-workers-")
        self.client_id = f"{socket.gethostname()}-{os.getpid()}-{new_id('c')[2:8]}"
        self.error: str | None = None
        self._api = ServerAPI(server_url, token)
        self._config = WorkerConfig(
            agent_ref=agent_ref(agent),
            server_url=self._api.server_url,
            token=token,
            worker_id="",
            spool_dir=spool_dir or default_spool_dir(),
            log_dir=self._log_dir,
            timeout=timeout,
            upload_retry_seconds=upload_retry_seconds,
            reconnect_seconds=reconnect_seconds,
            log_level=log_level,
        )
        self._ctx = multiprocessing.get_context("spawn")
        self._drain = self._ctx.Event()
        self._workers: dict[int, _Worker] = {}
        self._generation = 0
        self._quick_crashes = 0
        self._done = threading.Event()

    def start(self) -> WorkerPool:
        """Send spooled results from earlier runs, then start the workers and their supervisor thread."""
        not_here: set[str] = set()
        if sent := resend_spooled(self._api, self._config.spool_dir, not_here=not_here):
            logger.info("re-sent %d spooled results", sent)
        if not_here:
            logger.info(
                "kept %d spooled results in %s for the servers that leased them (this one does not know them)",
                len(not_here),
                self._config.spool_dir,
            )
        for index in range(self.nworkers):
            self._spawn(index)
        threading.Thread(target=self._supervise, name="agl-worker-pool", daemon=True).start()
        threading.Thread(
            target=resend_every,
            name="agl-spool",
            daemon=True,
            args=(self._api, self._config.spool_dir, self.spool_retry_seconds, self._done, not_here),
        ).start()
        logger.info(
            "started %d workers for %s against %s", self.nworkers, self._config.agent_ref, self._config.server_url
        )
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
        shutil.rmtree(self._log_dir, ignore_errors=True)

    def kill(self) -> None:
        """Kill every worker now (their attempts are reported failed and retried by the server)."""
        self._drain.set()
        for worker in list(self._workers.values()):
            worker.process.kill()  # a no-op for a process that has exited

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [w.process.pid for w in self._workers.values() if w.process.is_alive()]

    def _spawn(self, index: int) -> None:
        self._generation += 1
        config = dataclasses.replace(self._config, worker_id=f"{self.client_id}-w{index}.{self._generation}")
        slot = WorkerSlot.create(self._ctx)
        process = self._ctx.Process(
            target=worker_main, args=(config, slot, self._drain), name=config.worker_id, daemon=True
        )
        process.start()
        self._workers[index] = _Worker(process, slot, time.monotonic())

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
        current, process, now = worker.slot.running(), worker.process, time.monotonic()
        if process.is_alive():
            silent = now - max(worker.slot.alive.value, worker.started)
            stuck = max(3.0, min(self.unresponsive_seconds, worker.slot.lease_seconds.value / 2 or float("inf")))
            if current is not None and (now > current[2] + self.kill_grace or silent > stuck):
                why = f"was silent for {silent:.0f} s (holding the GIL?)" if silent > stuck else "outlived its timeout"
                logger.error("worker %s %s on %s; killing it", process.name, why, current[0])
                process.kill()
                process.join(5)
                self._report(
                    worker,
                    current,
                    "timeout",
                    ErrorInfo(  # and replaced at the next check, as dead
                        type="Timeout",
                        message=f"the worker process (pid {process.pid}) running the agent {why}; killed",
                    ),
                )
            return
        process.join()
        code = process.exitcode
        if current is not None:
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
            logger.error("worker %s %s while running %s", process.name, how, current[0])
            self._report(
                worker,
                current,
                "failed",
                ErrorInfo(
                    type="WorkerDied", message=f"worker process pid {process.pid} {how} during attempt {current[1]}"
                ),
            )
        if code == EXIT_AUTH:
            self._fail("the server refused this client's token")
        elif current is None and code not in (0, EXIT_ABANDONED) and now - worker.started < 2.0:  # broken set-up
            self._quick_crashes += 1
            if self._quick_crashes >= CRASH_LOOP_LIMIT:
                self._fail(f"workers keep crashing at start (last exit code {code}); see their stderr")
        else:
            self._quick_crashes = 0
        if code == 0 or self._drain.is_set():
            del self._workers[index]
        else:
            self._spawn(index)

    def _attempt_log(self, worker: _Worker) -> list[str]:
        """The last lines the dead worker's attempt wrote (its logs, prints, a crash's traceback)."""
        try:
            with open(Path(self._log_dir) / f"{worker.process.name}.log", "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                return [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
        except OSError:
            return []

    def _fail(self, error: str) -> None:
        """Stop the whole pool: its workers cannot do their job (``error`` says why)."""
        self.error = error
        logger.error("%s; stopping the pool", error)
        self.kill()

    def _report(
        self, worker: _Worker, current: tuple[str, int, float], status: RolloutStatus, error: ErrorInfo
    ) -> None:
        worker.slot.clear()
        rollout_id, attempt, _ = current
        result = Rollout(
            rollout_id=rollout_id,
            attempt=attempt,
            status=status,
            error=error,
            logs=[
                f"reported by the worker pool of client {self.client_id}: {error.message}",
                *self._attempt_log(worker),
            ],
        )
        try:
            self._api.upload_result(result, attempt, worker.process.name, retry_for=5.0)  # else the lease expires
        except ProtocolError as exc:
            logger.warning("could not report %s of %s: %s (its lease will expire instead)", status, rollout_id, exc)


def start_workers(agent: Any, server_url: str, nworkers: int = -1, **options: Any) -> WorkerPool:
    """Start ``nworkers`` worker processes running ``agent`` against the server; returns the pool (``.stop()``)."""
    return WorkerPool(agent, server_url, nworkers, **options).start()
