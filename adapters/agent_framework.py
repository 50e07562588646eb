"""Microsoft Agent Framework adapter: the running agent's ``name`` is the role of its model calls, and each function
tool invocation is recorded with its status and the LLM call that asked for it.

Middleware is the framework's own hook for intercepting runs and tool invocations, and ``Agent.run`` accepts extra
middleware for one run (``middleware=[...]``). The adapter wraps ``AgentMiddlewareLayer.run`` (the layer every
``agent_framework.Agent`` runs through, whether called directly, streamed, from a workflow's executor or as another
agent's tool) to append two middleware to each run inside a rollout, after the agent's own:

- :class:`AgentRole` makes the agent's ``name`` the current role while it runs. A streamed run does its work while
  the caller pulls the stream, so the role is also set around each pull (``ResponseStream.with_pull_context_manager``,
  the mechanism the framework's own telemetry uses to keep its span current).
- :class:`ToolCapture` records each function tool invocation as a ``kind="tool"`` call, linked by the provider's
  tool-call id to the LLM call that asked for it. A tool that raises is recorded with ``status="error"`` and
  ``error="<Type>: <message>"``; the framework then sends the model its error result, as it always does.

The framework's OpenTelemetry instrumentation needs a tracer provider the user configures, so it is not relied on;
the user's middleware, telemetry and exporters are left as they are.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import pydantic
from agent_framework import (
    AgentContext,
    AgentMiddleware,
    Content,
    FunctionInvocationContext,
    FunctionMiddleware,
    ResponseStream,
)
from agentlightning.adapters._stainless import Patch
from agentlightning.adapters._tools import PendingTool, error_text, jsonable

from agentlightning.capture import current_recorder, current_role, reset_role, set_role

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _speaking(name: str) -> Iterator[None]:
    token = set_role(name)
    try:
        yield
    finally:
        reset_role(token)


class AgentRole(AgentMiddleware):
    """Makes the running agent's name the current role (see the module docstring)."""

    async def process(self, context: AgentContext, call_next: Callable[[], Awaitable[None]]) -> None:
        name = getattr(context.agent, "name", None)
        if not name:  # an unnamed agent keeps the role around it
            await call_next()
            return
        with _speaking(name):
            await call_next()
        if context.stream and isinstance(context.result, ResponseStream):
            context.result.with_pull_context_manager(lambda: _speaking(name))


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, pydantic.BaseModel):
        return arguments.model_dump(mode="json")
    return dict(arguments) if isinstance(arguments, Mapping) else arguments


def _output(result: Any) -> Any:
    """A tool result as data: the framework's ``list[Content]`` as its text (or its items' dicts), else as is."""
    if isinstance(result, Sequence) and not isinstance(result, str) and all(isinstance(c, Content) for c in result):
        if all(item.type == "text" for item in result):
            return "".join(item.text or "" for item in result)
        return [jsonable(item.to_dict()) for item in result]
    return jsonable(result)


class ToolCapture(FunctionMiddleware):
    """Records each function tool invocation inside a rollout (see the module docstring)."""

    async def process(self, context: FunctionInvocationContext, call_next: Callable[[], Awaitable[None]]) -> None:
        recorder = current_recorder()
        pending = None
        if recorder is not None:
            try:
                pending = PendingTool(
                    recorder,
                    context.function.name,
                    _arguments(context.arguments),
                    current_role(),
                    "agent_framework",
                    tool_call_id=context.metadata.get("call_id"),
                )
            except Exception:  # capture must never break the agent
                logger.exception("agent_framework adapter: could not start recording tool %r", context.function.name)
        try:
            await call_next()
        except BaseException as exc:
            if pending is not None:
                pending.finish(None, error=error_text(exc))
            raise
        if pending is not None:
            pending.arguments = _arguments(context.arguments)  # as validated by the innermost handler
            pending.finish(_output(context.result))


def _run_with_capture(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    middleware = kwargs.get("middleware")
    if current_recorder() is not None and (middleware is None or isinstance(middleware, (list, tuple))):
        # Anything else is the framework's to refuse, with its own error.
        kwargs["middleware"] = [*(middleware or ()), AgentRole(), ToolCapture()]
    return wrapped(*args, **kwargs)


_PATCH = Patch(extra=(("agent_framework", "AgentMiddlewareLayer", "run", _run_with_capture),))
install, uninstall, is_installed = _PATCH.install, _PATCH.uninstall, _PATCH.is_installed
