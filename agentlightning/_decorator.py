"""``@agl.rollout``: mark an existing agent function as trainable."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from agentlightning._attempt import Attempt, name_of, preview
from agentlightning.types import LLM, Rollout

RewardFunction = Callable[[Any, Any], float]


class RolloutAgent:
    """An agent function decorated with ``@agl.rollout``: calling it calls the function unchanged; :meth:`execute` /
    :meth:`aexecute` run it once on a task with capture on and return a finished :class:`~agentlightning.Rollout`."""

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

    @property
    def receives_llm(self) -> bool:
        """Whether the function takes the ``llm`` argument (the model to call: what training serves it)."""
        return "llm" in self._parameters

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<agl.rollout {self.name} roles={self.roles}>"

    def invoke(self, task: Any, llm: LLM, rollout: Rollout) -> Any:
        """Call the agent function with the arguments it takes (a coroutine for async agents); no capture set-up."""
        values = {"task": task, "llm": llm, "rollout": rollout}
        arguments = [values[kind] for kind in self._parameters]
        return self.func(*arguments, rollout=rollout) if self._rollout_keyword else self.func(*arguments)

    def execute(self, task: Any, llm: LLM, *, timeout: float | None = None, **rollout_fields: Any) -> Rollout:
        """Run the agent once on ``task`` with capture and return the finished rollout (agent errors are recorded in
        it, never raised; 'timeout' at ``timeout`` s). ``rollout_fields``: rollout_id, task_id, group_id, attempt."""
        return Attempt(self, task, llm, **rollout_fields).run(timeout)

    async def aexecute(self, task: Any, llm: LLM, *, timeout: float | None = None, **rollout_fields: Any) -> Rollout:
        """Async :meth:`execute`: async agents run on this loop (cancelled at ``timeout``), sync ones on a thread."""
        return await Attempt(self, task, llm, **rollout_fields).arun(timeout)


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
    decorate = functools.partial(RolloutAgent, roles=roles, reward=reward, name=name)
    return decorate if func is None else decorate(func)


def _agent_parameters(func: Callable[..., Any]) -> tuple[list[str], bool]:
    """Which of task / llm / rollout the function takes positionally, in order, and whether it takes ``rollout`` as a
    keyword; any other required parameter is a ``TypeError`` now rather than a failure of every rollout later."""
    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):  # no signature to read: call it as (task, llm)
        return ["task", "llm"], False
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return ["task", "llm"], False
    kinds: list[str] = []
    rollout_keyword = False
    for parameter in parameters:
        keyword_only = parameter.kind == parameter.KEYWORD_ONLY
        if parameter.kind == parameter.VAR_KEYWORD:
            continue
        if parameter.name == "rollout":
            rollout_keyword = keyword_only
            kinds += [] if keyword_only else ["rollout"]
        elif not keyword_only and len(kinds) < 2:
            kinds.append(("task", "llm")[len(kinds)])
        elif parameter.default is parameter.empty:
            raise TypeError(
                f"@agl.rollout: {name_of(func)} has a required {'keyword-only ' if keyword_only else ''}parameter "
                f"{parameter.name!r}; an agent takes (task, llm) and optionally rollout"
            )
    if not kinds:
        raise TypeError(f"@agl.rollout: {name_of(func)} must take at least the task as its first parameter")
    return kinds, rollout_keyword
