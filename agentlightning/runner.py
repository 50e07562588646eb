"""``agl.run``: run an agent over tasks with capture on, no training, and return the rollouts.

Sync agents run in daemon threads (a hung agent is abandoned at its timeout and cannot block interpreter exit);
async agents run as asyncio tasks on one event loop. Every task yields exactly one :class:`~agentlightning.Rollout`,
in task order: crashes become 'failed' rollouts with their traceback, hangs become 'timeout' rollouts that keep
the calls captured so far, and a bad task (not JSON-serialisable) fails alone, naming its index.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agentlightning.context import RolloutRecorder, recording
from agentlightning.decorator import RolloutAgent, preview
from agentlightning.protocol import task_id_for
from agentlightning.roles import unmatched_patterns
from agentlightning.types import LLM, ErrorInfo, Rollout, new_id

logger = logging.getLogger(__name__)


def run(
    agent: RolloutAgent | Callable[..., Any],
    tasks: Iterable[Any],
    llm: LLM | Mapping[str, Any],
    *,
    n_workers: int = 4,
    timeout: float | None = None,
) -> list[Rollout]:
    """Run ``agent`` once per task with capture and return the finished rollouts in task order.

    - ``agent``: an ``@agl.rollout`` function, or a plain ``(task, llm[, rollout])`` function (wrapped as if
      decorated bare);
    - ``tasks``: a list (or other iterable) of JSON-serialisable tasks;
    - ``llm``: the OpenAI-compatible endpoint the agent should call (``agl.LLM`` or a dict of its fields);
    - ``n_workers``: rollouts running at the same time;
    - ``timeout``: seconds per rollout; a rollout still running then is marked 'timeout' and abandoned.

    Never raises for a failing agent or task; raises ``TypeError`` / ``ValueError`` for bad arguments.
    """
    agent, task_list, llm, n_workers, timeout = _check_arguments(agent, tasks, llm, n_workers, timeout)
    started = time.perf_counter()
    if agent.is_async:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            rollouts = asyncio.run(_run_async(agent, task_list, llm, n_workers, timeout))
        else:  # called from inside an event loop (e.g. a notebook): use a loop of our own in a helper thread
            rollouts = _in_helper_thread(lambda: asyncio.run(_run_async(agent, task_list, llm, n_workers, timeout)))
    else:
        rollouts = _run_threads(agent, task_list, llm, n_workers, timeout)
    _log_summary(agent, rollouts, time.perf_counter() - started)
    return rollouts


async def arun(
    agent: RolloutAgent | Callable[..., Any],
    tasks: Iterable[Any],
    llm: LLM | Mapping[str, Any],
    *,
    n_workers: int = 4,
    timeout: float | None = None,
) -> list[Rollout]:
    """Async :func:`run`, for callers already inside an event loop. Sync agents run in worker threads."""
    agent, task_list, llm, n_workers, timeout = _check_arguments(agent, tasks, llm, n_workers, timeout)
    started = time.perf_counter()
    if agent.is_async:
        rollouts = await _run_async(agent, task_list, llm, n_workers, timeout)
    else:
        rollouts = await asyncio.to_thread(_run_threads, agent, task_list, llm, n_workers, timeout)
    _log_summary(agent, rollouts, time.perf_counter() - started)
    return rollouts


# -- arguments -----------------------------------------------------------------------------------------------------


def _check_arguments(
    agent: Any, tasks: Any, llm: Any, n_workers: Any, timeout: Any
) -> tuple[RolloutAgent, list[Any], LLM, int, float | None]:
    if not isinstance(agent, RolloutAgent):
        if not callable(agent):
            raise TypeError(f"agl.run(agent=...) must be an @agl.rollout function or a callable, got {agent!r}")
        agent = RolloutAgent(agent)
    if isinstance(tasks, (str, bytes, Mapping)) or not isinstance(tasks, Iterable):
        raise TypeError(
            f"agl.run(tasks=...) must be a list of tasks, got {type(tasks).__name__} {preview(tasks)}"
            + (" (wrap a single task in a list)" if isinstance(tasks, (str, Mapping)) else "")
        )
    if isinstance(llm, Mapping):
        try:
            llm = LLM.model_validate(dict(llm))
        except ValueError as exc:
            raise ValueError(f"agl.run(llm=...) is not a valid agl.LLM: {exc}") from None
    if not isinstance(llm, LLM):
        raise TypeError(f"agl.run(llm=...) must be an agl.LLM (base_url, model), got {type(llm).__name__} {llm!r}")
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise ValueError(f"agl.run(n_workers=...) must be an integer >= 1, got {n_workers!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"agl.run(timeout=...) must be a positive number of seconds or None, got {timeout!r}")
    return agent, list(tasks), llm, n_workers, None if timeout is None else float(timeout)


def _bad_task_rollout(agent: RolloutAgent, task: Any, index: int, llm: LLM) -> Rollout | None:
    """A failed rollout for task ``index`` when it cannot be given to the agent, else None."""
    try:
        json.dumps(task)
    except (TypeError, ValueError) as exc:
        message = f"task #{index} for agent {agent.name!r} is not JSON-serialisable ({exc}): {preview(task)}"
        return _unstarted_rollout(agent, preview(task, 200), llm, "ValueError", message)  # keep the record JSON
    return None


def _failed_before_start(agent: RolloutAgent, task: Any, index: int, llm: LLM, exc: Exception) -> Rollout:
    message = f"task #{index} for agent {agent.name!r} could not be started: {type(exc).__name__}: {exc}"
    return _unstarted_rollout(agent, task, llm, type(exc).__name__, message)


def _unstarted_rollout(agent: RolloutAgent, task: Any, llm: LLM, error_type: str, message: str) -> Rollout:
    """A 'failed' rollout for a task the agent never ran, saying why (logged too)."""
    logger.warning("agl.run: %s", message)
    now = time.time()
    return Rollout(
        rollout_id=new_id("ro"), task=task, status="failed", model_version=llm.model_version,
        trainable_roles=agent.roles, error=ErrorInfo(type=error_type, message=message),
        diagnostics=[message], timings={"start": now, "end": now, "duration": 0.0},
    )


# -- sync agents: daemon threads -----------------------------------------------------------------------------------


class _ThreadRollout:
    """One rollout of a sync agent running in its own daemon thread; finished exactly once (by it or by timeout)."""

    def __init__(self, agent: RolloutAgent, task: Any, index: int, llm: LLM, timeout: float | None) -> None:
        self.agent, self.task, self.index, self.llm = agent, task, index, llm
        self.rollout = agent.new_rollout(task, task_id=task_id_for(task), model_version=llm.model_version)
        self.recorder: RolloutRecorder = agent.start_recorder(self.rollout, llm)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._claimed = False
        self._claim_lock = threading.Lock()

    @property
    def claimed(self) -> bool:
        """Whether the agent thread or the timeout has taken over finishing this rollout."""
        return self._claimed

    def claim(self) -> bool:
        """Whether the caller is the one to finish this rollout (the agent thread or the timeout, not both)."""
        with self._claim_lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def run(self, finished: queue.Queue[int]) -> None:
        agent, rollout, recorder = self.agent, self.rollout, self.recorder
        try:
            with recording(recorder):
                output = agent.result(self.task, self.llm, rollout)
        except BaseException as exc:  # noqa: BLE001 - agent failures are data
            if self.claim():
                agent.finish_failed(rollout, recorder, exc)
                finished.put(self.index)
            return
        if self.claim():
            try:
                agent.finish(rollout, recorder, output)
            except Exception as exc:  # noqa: BLE001 - e.g. a reward function that crashes
                agent.finish_failed(rollout, recorder, exc)
            finished.put(self.index)


def _run_threads(
    agent: RolloutAgent, tasks: list[Any], llm: LLM, n_workers: int, timeout: float | None
) -> list[Rollout]:
    results: list[Rollout | None] = [None] * len(tasks)
    waiting: deque[int] = deque()
    for index, task in enumerate(tasks):
        bad = _bad_task_rollout(agent, task, index, llm)
        if bad is None:
            waiting.append(index)
        else:
            results[index] = bad
    finished: queue.Queue[int] = queue.Queue()
    running: dict[int, _ThreadRollout] = {}
    while waiting or running:
        while waiting and len(running) < n_workers:
            index = waiting.popleft()
            try:
                job = _ThreadRollout(agent, tasks[index], index, llm, timeout)
            except Exception as exc:  # noqa: BLE001 - one unusable task never loses the others
                results[index] = _failed_before_start(agent, tasks[index], index, llm, exc)
                continue
            running[index] = job
            context = contextvars.copy_context()
            threading.Thread(
                target=context.run, args=(job.run, finished), name=f"agl-rollout-{index}", daemon=True
            ).start()
        # A job its own thread has claimed is being finished (reward function running): wait for it, no deadline.
        deadlines = [job.deadline for job in running.values() if job.deadline is not None and not job.claimed]
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        try:
            index = finished.get(timeout=wait)
            results[index] = running.pop(index).rollout
        except queue.Empty:
            pass
        now = time.monotonic()
        for index, job in list(running.items()):
            if job.deadline is not None and now >= job.deadline and job.claim():
                logger.warning("agl.run: task #%d timed out after %s s; its thread is abandoned", index, timeout)
                results[index] = agent.finish_timeout(job.rollout, job.recorder, timeout)
                del running[index]
    return [rollout for rollout in results if rollout is not None]


# -- async agents: one event loop --------------------------------------------------------------------------------


async def _run_async(
    agent: RolloutAgent, tasks: list[Any], llm: LLM, n_workers: int, timeout: float | None
) -> list[Rollout]:
    semaphore = asyncio.Semaphore(n_workers)

    async def one(index: int, task: Any) -> Rollout:
        bad = _bad_task_rollout(agent, task, index, llm)
        if bad is not None:
            return bad
        async with semaphore:
            try:
                return await agent.aexecute(task, llm, timeout=timeout, task_id=task_id_for(task))
            except Exception as exc:  # noqa: BLE001 - agent errors are caught inside; this is a failed start
                return _failed_before_start(agent, task, index, llm, exc)

    return list(await asyncio.gather(*(one(index, task) for index, task in enumerate(tasks))))


# -- helpers -------------------------------------------------------------------------------------------------------


def _in_helper_thread(function: Callable[[], list[Rollout]]) -> list[Rollout]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = function()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="agl-run-loop", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def _log_summary(agent: RolloutAgent, rollouts: list[Rollout], seconds: float) -> None:
    """One info line per run, plus warnings for problems shared by every rollout (empty capture, unused roles)."""
    counts: dict[str, int] = {}
    for rollout in rollouts:
        counts[rollout.status] = counts.get(rollout.status, 0) + 1
    summary = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
    logger.info("agl.run: %d rollouts of %r in %.2f s (%s)", len(rollouts), agent.name, seconds, summary or "none")
    ran = [rollout for rollout in rollouts if rollout.timings.get("duration", 0.0) > 0 or rollout.calls]
    empty = [rollout for rollout in ran if not rollout.llm_calls]
    if ran and len(empty) == len(ran):
        logger.warning("agl.run: none of the %d rollouts of %r captured an LLM call: %s", len(ran), agent.name,
                       empty[0].diagnostics[0] if empty[0].diagnostics else "see rollout.diagnostics")
    if agent.roles is not None:
        seen = {call.role for rollout in rollouts for call in rollout.llm_calls}
        unused = unmatched_patterns(agent.roles, seen)
        if unused and any(rollout.llm_calls for rollout in rollouts):
            logger.warning("agl.run: roles %s of agent %r matched no LLM call in any of the %d rollouts; role names "
                           "seen: %s", unused, agent.name, len(rollouts), sorted(r for r in seen if r) or "none")
