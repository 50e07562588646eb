"""``@agl.rollout``: mark an existing agent function as trainable, and run it once with capture."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import json
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentlightning.context import RolloutRecorder, install_log_capture, recording
from agentlightning.diagnostics import explain_rollout
from agentlightning.protocol import own_task_id
from agentlightning.instrumentation import enable_auto_instrumentation
from agentlightning.types import LLM, ErrorInfo, Reward, Rollout, check_finite, new_id

logger = logging.getLogger(__name__)

RewardFunction = Callable[[Any, Any], float]


class AgentResultError(TypeError):
    """The agent (or its reward function) returned something that is not a usable reward."""


class RolloutAgent:
    """An agent function decorated with ``@agl.rollout``.

    Calling the object calls the original function unchanged. :meth:`execute` / :meth:`aexecute` run it once
    on a task with capture on and return a finished :class:`~agentlightning.Rollout`.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        roles: Sequence[str] | None = None,
        reward: RewardFunction | None = None,
        name: str | None = None,
    ) -> None:
        if not callable(func):
            raise TypeError(f"@agl.rollout must decorate a function, got {type(func).__name__} {preview(func)}")
        if roles is not None and (isinstance(roles, str) or not all(isinstance(r, str) and r for r in roles)):
            raise ValueError(f"@agl.rollout(roles=...) must be a list of role names or globs, got {roles!r}")
        self.func = func
        self.roles: list[str] | None = list(roles) if roles is not None else None
        self.reward = reward
        self.name = name or getattr(func, "__qualname__", None) or type(func).__qualname__
        # An `async def` function, a partial of one, or an object whose __call__ is `async def`.
        self.is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)
        self._parameters, self._rollout_keyword = _agent_parameters(func)
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<agl.rollout {self.name} roles={self.roles}>"

    # -- running once with capture ------------------------------------------------------------------------

    def new_rollout(
        self,
        task: Any,
        *,
        rollout_id: str | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
        attempt: int = 1,
        model_version: str | None = None,
    ) -> Rollout:
        """The record a run of this agent on ``task`` starts from (status 'running')."""
        return Rollout(
            rollout_id=rollout_id or new_id("ro"),
            task_id=task_id if task_id is not None else own_task_id(task),
            task=task,
            group_id=group_id,
            attempt=attempt,
            status="running",
            model_version=model_version,
            trainable_roles=self.roles,
            timings={"start": time.time()},
        )

    def execute(self, task: Any, llm: LLM, **rollout_fields: Any) -> Rollout:
        """Run the agent once on ``task`` with capture and return the finished rollout (never raises for
        agent errors: they are recorded in the rollout)."""
        rollout = self.new_rollout(task, model_version=llm.model_version, **rollout_fields)
        recorder = self.start_recorder(rollout, llm)
        try:
            with recording(recorder):
                output = self.result(task, llm, rollout)
        except BaseException as exc:  # noqa: BLE001 - agent failures are data, not crashes of ours
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return self.finish_failed(rollout, recorder, exc)
        return self.finish(rollout, recorder, output)

    async def aexecute(self, task: Any, llm: LLM, *, timeout: float | None = None, **rollout_fields: Any) -> Rollout:
        """Async :meth:`execute`. Sync agents run in a worker thread; ``timeout`` (seconds) cancels async agents
        and abandons sync ones, marking the rollout 'timeout'."""
        rollout = self.new_rollout(task, model_version=llm.model_version, **rollout_fields)
        recorder = self.start_recorder(rollout, llm)
        deadline = asyncio.timeout(timeout)
        try:
            with recording(recorder):
                async with deadline:
                    output = await self.aresult(task, llm, rollout)
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, TimeoutError) and deadline.expired():
                return self.finish_timeout(rollout, recorder, timeout)
            return self.finish_failed(rollout, recorder, exc)  # includes a TimeoutError the agent raised itself
        return self.finish(rollout, recorder, output)

    def finish_timeout(self, rollout: Rollout, recorder: RolloutRecorder, timeout: float | None) -> Rollout:
        """Complete ``rollout`` as timed out, keeping every call captured so far."""
        rollout.error = ErrorInfo(type="Timeout", message=f"agent {self.name!r} did not finish within {timeout} s")
        return self._close(rollout, recorder, "timeout")

    def start_recorder(self, rollout: Rollout, llm: LLM | None = None) -> RolloutRecorder:
        """Prepare capture for ``rollout``: adapters installed, a recorder to make current while the agent runs.

        ``llm`` (the endpoint given to the agent) lets diagnostics compare it with the endpoints actually called.
        """
        _check_json_task(rollout.task, self.name)
        enable_auto_instrumentation()
        install_log_capture()
        recorder = RolloutRecorder(rollout.rollout_id, model_version=rollout.model_version)
        if llm is not None:
            recorder.llm_base_url = llm.base_url
        return recorder

    def invoke(self, task: Any, llm: LLM, rollout: Rollout) -> Any:
        """Call the agent function with the arguments it takes (a coroutine for async agents); no capture set-up."""
        values = {"task": task, "llm": llm, "rollout": rollout}
        arguments = [values[kind] for kind in self._parameters]
        return self.func(*arguments, rollout=rollout) if self._rollout_keyword else self.func(*arguments)

    def result(self, task: Any, llm: LLM, rollout: Rollout) -> Any:
        """Call the agent and wait for what it returns, on this thread: an awaitable (async agent, or a plain
        function returning a coroutine) runs to completion on an event loop of its own. No capture set-up."""
        output = self.invoke(task, llm, rollout)
        return _run_to_completion(output) if inspect.isawaitable(output) else output

    async def aresult(self, task: Any, llm: LLM, rollout: Rollout) -> Any:
        """Async :meth:`result`: async agents run on this loop, sync ones on a worker thread (with this context);
        an awaitable a sync agent returns is awaited here. No capture set-up."""
        if self.is_async:
            return await self.invoke(task, llm, rollout)
        output = await asyncio.to_thread(self.invoke, task, llm, rollout)
        return await output if inspect.isawaitable(output) else output

    # -- internals ------------------------------------------------------------------------------------------

    def finish(self, rollout: Rollout, recorder: RolloutRecorder, output: Any) -> Rollout:
        """Complete ``rollout`` from the agent's return value (applies ``reward=``, validates the reward)."""
        try:
            value = self._reward_value(rollout, output)
        except Exception as exc:  # noqa: BLE001 - a bad reward fails this rollout only
            return self.finish_failed(rollout, recorder, exc)
        if self.reward is not None or value is None:
            rollout.output = _jsonable(output)
        if value is not None:
            recorder.add_reward(Reward(value=value, source="final"))
        return self._close(rollout, recorder, "succeeded")

    def _reward_value(self, rollout: Rollout, output: Any) -> float | None:
        where = f"agent {self.name!r} on task {rollout.task_id!r}"
        if self.reward is not None:
            value = self.reward(rollout.task, output)
            if value is None:
                return None
            try:
                return check_finite(value, f"reward function {_name(self.reward)!r} for {where}")
            except ValueError as exc:
                raise AgentResultError(str(exc)) from None
        if output is None:
            return None
        if isinstance(output, bool) or not isinstance(output, (int, float)):
            raise AgentResultError(
                f"{where} returned {type(output).__name__} {preview(output)}; expected a float reward or None. "
                "To keep returning the answer, name a scorer: @agl.rollout(reward=score) with score(task, output)."
            )
        try:
            return check_finite(output, where)
        except ValueError as exc:
            raise AgentResultError(str(exc)) from None

    def finish_failed(self, rollout: Rollout, recorder: RolloutRecorder, exc: BaseException) -> Rollout:
        """Complete ``rollout`` as failed by ``exc``, keeping every call captured so far."""
        rollout.error = ErrorInfo(
            type=type(exc).__name__,
            message=str(exc),
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )
        logger.warning("rollout %s of agent %r failed: %s: %s", rollout.rollout_id, self.name, type(exc).__name__, exc)
        return self._close(rollout, recorder, "failed")

    def _close(self, rollout: Rollout, recorder: RolloutRecorder, status: str) -> Rollout:
        rollout.status = status  # type: ignore[assignment]
        rollout.calls = recorder.ordered_calls()
        rollout.rewards = list(recorder.rewards)
        rollout.logs.extend(recorder.logs)
        finals = [reward.value for reward in rollout.rewards if reward.source == "final"]
        rollout.final_reward = finals[-1] if finals else None
        end = time.time()
        rollout.timings["end"] = end
        rollout.timings["duration"] = end - rollout.timings.get("start", end)
        rollout.diagnostics = explain_rollout(rollout, recorder)
        return rollout


def rollout(
    func: Callable[..., Any] | None = None,
    *,
    roles: Sequence[str] | None = None,
    reward: RewardFunction | None = None,
    name: str | None = None,
) -> Any:
    """Mark an agent function ``(task, llm[, rollout]) -> reward`` as trainable.

    Use bare (``@agl.rollout``: every role trainable) or with options:

    - ``roles``: role names or globs whose LLM calls become training transitions;
    - ``reward``: ``reward(task, output) -> float`` when the function returns its answer instead of a reward;
    - ``name``: a display name (defaults to the function's name).

    The result is a :class:`RolloutAgent`, still callable exactly like the original function.
    """
    if func is not None:
        return RolloutAgent(func, roles=roles, reward=reward, name=name)
    return lambda f: RolloutAgent(f, roles=roles, reward=reward, name=name)


def _run_to_completion(awaitable: Awaitable[Any]) -> Any:
    """Await from sync code: on this thread, or on a helper thread when a loop already runs here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(awaitable))
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="agl-execute") as pool:
        return pool.submit(context.run, asyncio.run, _awaited(awaitable)).result()


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _agent_parameters(func: Callable[..., Any]) -> tuple[list[str], bool]:
    """Which of task / llm / rollout the function takes, in its positional order, and whether it takes
    ``rollout`` as a keyword-only parameter. A required parameter beyond those is a ``TypeError`` now, naming it,
    rather than a failure of every rollout later."""
    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return ["task", "llm"], False
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return ["task", "llm"], False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kinds: list[str] = []
    for index, parameter in enumerate(positional):
        if parameter.name == "rollout":
            kinds.append("rollout")
        elif index == 0:
            kinds.append("task")
        elif index == 1:
            kinds.append("llm")
        elif parameter.default is parameter.empty:
            raise TypeError(
                f"@agl.rollout: {_name(func)} has a required parameter {parameter.name!r}; an agent takes "
                "(task, llm) and optionally rollout"
            )
    rollout_keyword = False
    for parameter in parameters:
        if parameter.kind != parameter.KEYWORD_ONLY:
            continue
        if parameter.name == "rollout" and "rollout" not in kinds:
            rollout_keyword = True
        elif parameter.default is parameter.empty:
            raise TypeError(
                f"@agl.rollout: {_name(func)} has a required keyword-only parameter {parameter.name!r}; an agent "
                "takes (task, llm) and optionally rollout"
            )
    if not kinds:
        raise TypeError(f"@agl.rollout: {_name(func)} must take at least the task as its first parameter")
    return kinds, rollout_keyword


def _check_json_task(task: Any, agent_name: str) -> None:
    try:
        json.dumps(task)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"task for agent {agent_name!r} is not JSON-serialisable ({exc}): {preview(task)}") from None


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def preview(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages that name a bad value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
