"""A worker process: lease a rollout, run the agent on it heart-beating, report the result (taking the next lease
with the report); repeat until told to stop. A worker that leaves a hung agent behind exits after reporting it and
is replaced by the pool; results the server did not take for good are spooled to disk and re-sent later. An attempt's
log lines (and a crash's traceback) also go to a file the pool reads if the process dies. The agent travels by name,
``"package.module:attribute"``, defined at module level of an importable module (or of the script run as
``__main__``, guarded by ``if __name__ == "__main__":``), so that spawned worker processes can import it."""

from __future__ import annotations

import faulthandler
import gc
import importlib
import io
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from agentlightning import _json
from agentlightning._attempt import Attempt
from agentlightning._decorator import RolloutAgent
from agentlightning.capture import current_recorder, enable_auto_instrumentation
from agentlightning.client._api import ServerAPI, StopSignal
from agentlightning.protocol import Lease, ServerError, Unreachable, proxy_path
from agentlightning.types import Rollout

logger = logging.getLogger(__name__)

EXIT_ABANDONED = 75  # the worker left a stuck agent thread behind and must be replaced
EXIT_AUTH = 2  # the server refused the token
EXIT_SERVER_GONE = 3  # the server stayed unreachable for reconnect_seconds
EXIT_ORPHANED = 76  # the process that started the worker died, and the worker did not stop within ORPHAN_GRACE
PARENT_POLL = 0.5
"""Seconds between a worker's looks at whether the process that started it is still its parent."""
ORPHAN_GRACE = 30.0
"""Seconds an orphaned worker may take to stop by itself (an upload in flight) before it exits regardless."""
DEQUEUE_WAIT = 2.0
DEFINITIVE = frozenset({409, 422})  # refusals of a result that re-sending cannot change (stale, not ours, invalid)
UNKNOWN_ROLLOUT = 404  # definitive from the server that leased the rollout; another server may know it
COLLECT_EVERY = 10
"""Rollouts between a worker's collections of reference cycles (:func:`collect_garbage`)."""


def agent_ref(agent: RolloutAgent | Callable[..., Any] | str) -> str:
    """The import reference of ``agent`` (checked to resolve back to it)."""
    if isinstance(agent, str):
        load_agent(agent)
        return agent
    func = agent.func if isinstance(agent, RolloutAgent) else agent
    # A RolloutAgent carries its function's module and name (update_wrapper); a CommandAgent, where it was made
    where = agent if isinstance(agent, RolloutAgent) else func
    module, qualname = getattr(where, "__module__", None), getattr(where, "__qualname__", "")
    if not module or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"agent {qualname or agent!r} cannot be imported by worker processes: define it at module "
            "level (not inside a function or as a lambda), or pass 'module:attribute'"
        )
    named = None
    if isinstance(agent, RolloutAgent):  # ``my_agent = agl.rollout(run, roles=[...])``: its options travel by name
        named = next((name for name, value in vars(_resolve(module, "")).items() if value is agent), None)
    ref = f"{module}:{named or qualname}"
    loaded = load_agent(ref)
    if loaded.func is not func:
        raise ValueError(f"agent reference {ref!r} resolves to a different object than the agent given")
    if isinstance(agent, RolloutAgent) and loaded is not agent and (agent.roles is not None or agent.reward):
        raise ValueError(
            f"agent {agent.name!r} (with roles/reward options) is not a module-level name of {module}, so worker "
            "processes could not rebuild it: assign it at module level (my_agent = agl.rollout(...)) and pass that"
        )
    return ref


def load_agent(ref: str) -> RolloutAgent:
    """Import the agent named by ``ref``; a plain function is wrapped as if decorated with bare ``@agl.rollout``."""
    module, sep, qualname = ref.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"agent reference must look like 'package.module:attribute', got {ref!r}")
    target = _resolve(module, qualname)
    if isinstance(target, RolloutAgent):
        return target
    if callable(target):
        return RolloutAgent(target)
    raise TypeError(f"agent reference {ref!r} names a {type(target).__name__}, not an agent function")


def _resolve(module_name: str, qualname: str) -> Any:
    if module_name in ("__main__", "__mp_main__"):  # a spawned worker runs the parent's script as __mp_main__
        target: Any = sys.modules.get("__mp_main__") or sys.modules["__main__"]
    else:
        try:
            target = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(
                f"cannot import module {module_name!r} of the agent: {exc} (sys.path={sys.path[:4]}...)"
            ) from None
    for part in filter(None, qualname.split(".")):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"agent {module_name}:{qualname}: {module_name} has no attribute {qualname!r}") from None
    return target


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker process needs (picklable)."""

    agent_ref: str
    server_url: str
    token: str | None
    worker_id: str
    spool_dir: str
    log_dir: str  # where the attempt log file <worker_id>.log goes (the pool reads it after a crash)
    timeout: float | None = None
    upload_retry_seconds: float = 600.0
    reconnect_seconds: float = 600.0
    log_level: int = logging.INFO


@dataclass
class WorkerSlot:
    """Shared memory (ctypes values) the pool reads to know what a worker is doing: one writer, one reader."""

    deadline: Any  # monotonic-clock deadline of the running rollout, 0.0 when idle
    attempt: Any
    rollout_id: Any
    lease_seconds: Any
    alive: Any  # monotonic clock, stamped twice a second by a thread of the worker (stops when the process is stuck)

    @classmethod
    def create(cls, ctx: Any = multiprocessing) -> WorkerSlot:
        """A slot in shared memory of ``ctx`` (a multiprocessing context, or the module for one process)."""
        raw = ctx.RawValue
        return cls(raw("d", 0.0), raw("i", 0), ctx.RawArray("c", 64), raw("d", 0.0), raw("d", 0.0))

    def running(self) -> tuple[str, int, float] | None:
        """(rollout id, attempt, deadline) of the rollout being run, or None."""
        deadline = self.deadline.value
        return None if deadline == 0.0 else (self.rollout_id.value.decode(), self.attempt.value, deadline)

    def set(self, rollout_id: str, attempt: int, deadline: float, lease_seconds: float) -> None:
        self.rollout_id.value = rollout_id.encode()[:63]
        self.attempt.value = attempt
        self.lease_seconds.value = lease_seconds
        self.deadline.value = deadline

    def clear(self) -> None:
        self.deadline.value = 0.0


def worker_main(config: WorkerConfig, slot: WorkerSlot, drain: StopSignal) -> None:
    """Entry point of a worker process (or of a Ray actor's thread, :mod:`._ray`)."""
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C and a SIGTERM to the group reach us too: the pool drains us (and ends us with SIGKILL if it must)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        parent = multiprocessing.parent_process()  # its pid as the pool saw it (getppid() may already be init's)
        parent_pid = parent.pid if parent is not None and parent.pid is not None else os.getppid()
        threading.Thread(target=_watch_parent, args=(parent_pid, drain), name="agl-parent-watch", daemon=True).start()
        # The agent runs in this process: it gets its rollout's own LLM key (lease.llm), not the server's token.
        os.environ.pop("AGL_SERVER_TOKEN", None)
    for stream in (sys.stdout, sys.stderr):  # an agent's lone surrogate must not fail its logging
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    logging.basicConfig(
        level=config.log_level, format=f"%(asctime)s {config.worker_id} %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "httpx2", "httpcore"):  # a line per request would flood the logs and every rollout's logs
        logging.getLogger(noisy).setLevel(max(config.log_level, logging.WARNING))
    attempt_log = open(Path(config.log_dir) / f"{config.worker_id}.log", "w", buffering=1)
    faulthandler.enable(attempt_log)  # a segfault's traceback lands with the attempt's log lines
    in_rollout = logging.StreamHandler(attempt_log)
    in_rollout.addFilter(lambda _record: current_recorder() is not None)
    in_rollout.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    logging.getLogger().addHandler(in_rollout)
    sys.stdout = _TeeToRollout(sys.stdout, "stdout", attempt_log)
    sys.stderr = _TeeToRollout(sys.stderr, "stderr", attempt_log)
    threading.Thread(target=_stamp, args=(slot,), name="agl-alive", daemon=True).start()
    agent = load_agent(config.agent_ref)
    enable_auto_instrumentation()  # pay adapter set-up now, not inside the first lease
    api = ServerAPI(config.server_url, config.token)
    lease, server_stop = None, False  # a lease handed with the last result runs even when draining: it is ours
    finished = 0
    while not server_stop and (lease is not None or not drain.is_set()):
        if lease is not None:
            attempt_log.seek(0)
            attempt_log.truncate()  # the file holds the running attempt's lines only
            abandoned, lease, server_stop = run_lease(agent, lease, api, config, slot, drain)
            if abandoned:
                os._exit(EXIT_ABANDONED)
            finished += 1
            collect_garbage(finished)
            continue
        try:
            lease, server_stop = api.dequeue(
                config.worker_id, DEQUEUE_WAIT, stop=drain, retry_for=config.reconnect_seconds
            )
        except Unreachable as exc:
            if drain.is_set():
                break
            logger.error("giving up on the server after %.0f s: %s", config.reconnect_seconds, exc)
            api.close()
            sys.exit(EXIT_SERVER_GONE)
        except ServerError as exc:
            logger.error("the server refused to hand out work: %s", exc.message)
            if exc.status in (401, 403):
                sys.exit(EXIT_AUTH)
            time.sleep(1.0)
    if server_stop:
        logger.info("server says stop; worker exits")
    api.close()


def run_lease(
    agent: RolloutAgent, lease: Lease, api: ServerAPI, config: WorkerConfig, slot: WorkerSlot, drain: StopSignal
) -> tuple[bool, Lease | None, bool]:
    """Run one leased rollout, heart-beating, and report it, taking the next lease with the report unless ``drain``
    is set. Returns (the agent's thread was left running (hung), the next lease, the server says stop)."""
    timeout = config.timeout if config.timeout is not None else lease.timeout
    slot.set(
        lease.rollout_id, lease.attempt, time.monotonic() + timeout if timeout else float("inf"), lease.lease_seconds
    )
    assert lease.llm is not None  # the server fills it in; addressed through the URL this client reaches it with
    base_url = f"{config.server_url.rstrip('/')}{proxy_path(lease.rollout_id, lease.attempt)}"
    llm = lease.llm.model_copy(update={"base_url": base_url})
    attempt = Attempt(
        agent,
        lease.task,
        llm,
        rollout_id=lease.rollout_id,
        task_id=lease.task_id,
        group_id=lease.group_id,
        attempt=lease.attempt,
    )

    def heartbeat() -> bool:
        if _orphaned.is_set():
            return False  # nobody supervises this attempt any more: give it up (the server re-leases it)
        try:
            return api.heartbeat(lease.rollout_id, lease.attempt, config.worker_id).get("ok", True)
        except (Unreachable, ServerError) as exc:
            logger.info("heartbeat for %s failed: %s", lease.rollout_id, exc)
            return True

    try:
        result = attempt.run(timeout, on_tick=heartbeat, tick=max(0.05, lease.lease_seconds / 3))
    except Exception as exc:  # noqa: BLE001 - e.g. a task the agent cannot take: fail this rollout only
        result = attempt.refuse(f"the attempt could not start: {type(exc).__name__}: {exc}", exc)
    abandoned = attempt.abandoned  # read once: a late agent may return while the result is reported
    following: tuple[Lease | None, bool] = (None, False)
    if result.status == "cancelled" and _orphaned.is_set():
        logger.warning(
            "attempt %d of %s: the process that started this worker is gone; dropping it",
            lease.attempt,
            lease.rollout_id,
        )
    elif result.status == "cancelled":
        logger.warning("attempt %d of %s was taken away by the server; dropping it", lease.attempt, lease.rollout_id)
    else:
        if abandoned:
            logger.warning(
                "rollout %s left its agent running; reporting it, then this worker is replaced", lease.rollout_id
            )
        result.logs.insert(0, f"worker {config.worker_id} on {socket.gethostname()} pid {os.getpid()}")
        following = upload(api, result, lease.attempt, config, take_next=not abandoned and not drain.is_set())
    slot.clear()
    return (abandoned, *following)


def collect_garbage(finished: int) -> None:
    """Collect reference cycles after every :data:`COLLECT_EVERY` rollouts run (``finished``, counting from 1).

    Garbage in cycles that reached the oldest generation otherwise waits for Python's full collection, which runs
    only once the objects promoted there since the last one number a quarter of those already there: in a worker
    holding ~135,000 objects after its imports, once in 500-1,000 rollouts. The README's agent leaves its
    ``openai.OpenAI`` client in a cycle every rollout, with its httpx pool and an SSL context holding the CA bundle
    (~0.8 MB outside Python's heap, unseen by the collector's thresholds); a few in a hundred reach the oldest
    generation, and without these collections a worker's RSS rose by ~30 MB over 2,000 rollouts (flat with them).

    After the first rollout (its lazy imports done) the collected heap is frozen (``gc.freeze``: never walked or
    collected again), so that each collection walks only what came later: ~4 ms rather than ~80 ms."""
    if finished == 1:
        gc.collect()
        gc.freeze()
    elif finished % COLLECT_EVERY == 0:
        gc.collect()


def upload(
    api: ServerAPI, result: Rollout, attempt: int, config: WorkerConfig, take_next: bool = False
) -> tuple[Lease | None, bool]:
    """Report ``result``. If the server does not take it within 5 s, it is spooled to disk first (safe from a killed
    client) while the upload is retried; unless the server refuses it for good, it stays there to be re-sent. With
    ``take_next``, the worker's next lease comes with the answer. Returns (that lease or None, the server says stop)."""
    spooled: Path | None = None
    for retry_for in (min(5.0, config.upload_retry_seconds), config.upload_retry_seconds):
        try:
            if take_next:
                outcome, lease, stop = api.upload_result_and_lease(result, attempt, config.worker_id, retry_for)
            else:
                outcome, lease, stop = api.upload_result(result, attempt, config.worker_id, retry_for), None, False
        except (ServerError, Unreachable) as exc:
            if isinstance(exc, ServerError) and exc.status in DEFINITIVE | {UNKNOWN_ROLLOUT}:
                logger.warning("server refused rollout %s attempt %d: %s", result.rollout_id, attempt, exc.message)
                lease, stop = None, False
                break
            if spooled is None:
                spooled = spool(result, attempt, config)
                logger.error(
                    "could not upload rollout %s (%s); saved to %s, still trying", result.rollout_id, exc, spooled
                )
            continue
        if outcome.duplicate or not outcome.accepted:
            logger.info("rollout %s attempt %d: %s", result.rollout_id, attempt, outcome.message or "not stored")
        break
    else:
        return None, False  # kept in the spool, re-sent while a client runs
    if spooled is not None:
        spooled.unlink(missing_ok=True)
    return lease, stop


def spool(result: Rollout, attempt: int, config: WorkerConfig) -> Path:
    """Write a result that could not be uploaded."""
    directory = Path(config.spool_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{result.rollout_id}-{attempt}.json"
    tmp = path.with_suffix(".tmp")
    entry = {
        "attempt": attempt,
        "worker_id": config.worker_id,
        "server_url": config.server_url,
        "rollout": result.model_dump(mode="json"),
    }
    tmp.write_text(json.dumps(entry))
    tmp.replace(path)
    return path


def default_spool_dir() -> str:
    """``$AGL_SPOOL_DIR``, else ``~/.cache/agentlightning/spool`` (of the machine the worker runs on)."""
    return os.environ.get("AGL_SPOOL_DIR") or str(Path.home() / ".cache/agentlightning/spool")


def resend_spooled(api: ServerAPI, spool_dir: str, retry_for: float = 10.0, not_here: set[str] | None = None) -> int:
    """Upload spooled results; returns how many the server took. One it refused for good is removed; others stay.

    The spool directory is shared by every client on the machine: a result whose rollout this server does not know
    (404) stays for the server that leased it (a resumed run's server on a new port takes it), unless this server is
    that one. Those names are added to ``not_here`` and skipped when it is passed again."""
    not_here = set() if not_here is None else not_here
    sent = 0
    for path in sorted(Path(spool_dir).glob("*.json")):  # none when the directory does not exist
        if path.name in not_here:
            continue
        try:
            entry = json.loads(path.read_text())
            api.upload_result(
                Rollout.model_validate(entry["rollout"]), entry["attempt"], entry["worker_id"], retry_for=retry_for
            )
        except (FileNotFoundError, ServerError) as exc:
            if isinstance(exc, ServerError) and exc.status == UNKNOWN_ROLLOUT:
                if entry.get("server_url") != api.server_url:
                    not_here.add(path.name)
                    continue
            elif not isinstance(exc, ServerError) or exc.status not in DEFINITIVE:
                continue  # sent by another client meanwhile, or not taken yet (kept)
            logger.warning("spooled result %s refused (%s); removing it", path.name, exc.message)
        except Unreachable:
            return sent
        else:
            sent += 1
        path.unlink(missing_ok=True)
    return sent


def resend_every(
    api: ServerAPI, spool_dir: str, seconds: float, done: StopSignal, not_here: set[str] | None = None
) -> None:
    """Re-send spooled results every ``seconds`` until ``done`` (a server that had refused them may take them now);
    ``not_here`` as in :func:`resend_spooled`."""
    not_here = set() if not_here is None else not_here
    while not done.wait(seconds):
        try:
            resend_spooled(api, spool_dir, retry_for=0.0, not_here=not_here)
        except Exception:  # noqa: BLE001 - a broken spool file must not stop the workers
            logger.exception("re-sending spooled results failed")


_orphaned = threading.Event()
"""Set in a worker process whose parent (the pool's process: ``agl client``, ``agl.train``) has died."""


def _watch_parent(parent_pid: int, drain: StopSignal) -> None:
    """A worker's thread: once the process that started it is gone (SIGKILL, OOM; the worker then has another
    parent), the worker stops by itself: no new lease, the running attempt given up at its next heartbeat, and after
    :data:`ORPHAN_GRACE` seconds it exits whatever still runs. Polls ``os.getppid()``, which changes on POSIX when
    a parent dies (the process is re-parented); on Windows it never does, and workers wait for the server instead."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL)
    logger.warning("the process that started this worker (pid %d) is gone; stopping", parent_pid)
    _orphaned.set()
    drain.set()  # shared with the sibling workers, orphaned too
    time.sleep(ORPHAN_GRACE)
    logger.error("still running %.0f s after the parent died; exiting", ORPHAN_GRACE)
    os._exit(EXIT_ORPHANED)


def _stamp(slot: WorkerSlot) -> None:
    while True:
        slot.alive.value = time.monotonic()
        time.sleep(0.25)


class _TeeToRollout:
    """Passes writes through and copies complete lines into the logs of the rollout running in this context."""

    def __init__(self, stream: TextIO, name: str, copy: TextIO) -> None:
        self._stream, self._name, self._copy, self._partial = stream, name, copy, threading.local()

    def write(self, text: str) -> int:
        written = len(text)
        text = _json.scrub_text(text)  # an agent's lone surrogate must not fail its print or its logging
        self._stream.write(text)
        recorder = current_recorder()
        if recorder is not None:
            *lines, self._partial.text = (getattr(self._partial, "text", "") + text).split("\n")
            kept = [f"{time.strftime('%H:%M:%S')} {self._name}: {line}" for line in lines if line]
            recorder.logs.extend(kept)
            self._copy.writelines(f"{line}\n" for line in kept)
        return written

    def __getattr__(self, name: str) -> Any:  # flush, fileno, encoding, isatty...: the wrapped stream's
        return getattr(self._stream, name)
