"""``agl.run``: run an agent over tasks with capture on, no training, and return the rollouts."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agentlightning._attempt import Attempt, preview
from agentlightning._decorator import RolloutAgent
from agentlightning.capture import unmatched_patterns
from agentlightning.types import LLM, Rollout

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

    - ``agent``: an ``@agl.rollout`` function, or a plain ``(task, llm[, rollout])`` function (as if decorated);
    - ``tasks``: a list (or other iterable) of JSON-serialisable tasks;
    - ``llm``: the OpenAI-compatible endpoint the agent should call (``agl.LLM`` or a dict of its fields);
    - ``n_workers``: rollouts running at the same time;
    - ``timeout``: seconds per rollout; a rollout still running then is marked 'timeout' and abandoned.

    Never raises for a failing agent or task; raises ``TypeError`` / ``ValueError`` for bad arguments.
    """
    agent, task_list, llm, n_workers, timeout = _check_arguments(agent, tasks, llm, n_workers, timeout)
    started = time.perf_counter()
    main = _run_all(agent, task_list, llm, n_workers, timeout)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _summarised(agent, asyncio.run(main), started)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # inside an event loop (a notebook): a loop of our own
        return _summarised(agent, pool.submit(asyncio.run, main).result(), started)


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
    return _summarised(agent, await _run_all(agent, task_list, llm, n_workers, timeout), started)


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


async def _run_all(
    agent: RolloutAgent, tasks: list[Any], llm: LLM, n_workers: int, timeout: float | None
) -> list[Rollout]:
    """``n_workers`` attempts at a time: async agents as tasks of this loop, sync ones on daemon threads."""
    semaphore = asyncio.Semaphore(n_workers)

    async def one(index: int, task: Any) -> Rollout:
        attempt = Attempt(agent, task, llm)
        async with semaphore:
            try:
                return await attempt.arun(timeout)
            except Exception as exc:  # noqa: BLE001 - agent errors are caught inside; this is a failed start
                return attempt.refuse(f"task #{index} could not be started: {exc}", exc)

    return list(await asyncio.gather(*(one(index, task) for index, task in enumerate(tasks))))


def _summarised(agent: RolloutAgent, rollouts: list[Rollout], started: float) -> list[Rollout]:
    """``rollouts``, after logging a summary and the problems every rollout shares (empty capture, unused roles)."""
    seconds = time.perf_counter() - started
    counts = collections.Counter(rollout.status for rollout in rollouts)
    summary = ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
    logger.info("agl.run: %d rollouts of %r in %.2f s (%s)", len(rollouts), agent.name, seconds, summary or "none")
    ran = [rollout for rollout in rollouts if rollout.timings.get("duration", 0.0) > 0 or rollout.calls]
    empty = [rollout for rollout in ran if not rollout.llm_calls]
    if ran and len(empty) == len(ran):
        logger.warning(
            "agl.run: none of the %d rollouts of %r captured an LLM call: %s",
            len(ran),
            agent.name,
            empty[0].diagnostics[0] if empty[0].diagnostics else "see rollout.diagnostics",
        )
    if agent.roles is not None:
        seen = {call.role for rollout in rollouts for call in rollout.llm_calls}
        unused = unmatched_patterns(agent.roles, seen)
        if unused and any(rollout.llm_calls for rollout in rollouts):
            logger.warning(
                "agl.run: roles %s of agent %r matched no LLM call in any of the %d rollouts; role names seen: %s",
                unused,
                agent.name,
                len(rollouts),
                sorted(r for r in seen if r) or "none",
            )
    return rollouts
