"""PydanticAI adapter: the running agent's ``name`` is the role of its model calls, and each tool execution is
recorded with its status, ``ModelRetry`` included.

PydanticAI's hook system is the *capability* (``pydantic_ai.capabilities.AbstractCapability``): every run accepts
extra ones through its public ``capabilities=`` argument. The adapter wraps ``Agent.iter`` (which ``run``,
``run_sync``, ``run_stream`` and ``run_stream_events`` all go through) to add one capability, :class:`Capture`, to
each run inside a rollout; the agent's own capabilities and instrumentation are left as they are.

- ``wrap_run`` makes the agent's name the current role for the whole run (its model requests, its tools, and the
  runs of agents its tools delegate to, which set their own name in turn).
- ``wrap_tool_execute`` records each execution of a function tool as a ``kind="tool"`` call linked to the LLM call
  that asked for it (by tool-call id). A tool that raises ``ModelRetry`` is recorded with ``status="error"`` and
  ``error="ModelRetry: <message>"`` (PydanticAI then asks the model again); ``metadata["retry"]`` is the retry
  number of that tool (0 for a first attempt). Any other exception is recorded and re-raised as PydanticAI does.
- ``wrap_tool_validate`` records arguments that fail validation as a failed tool call too (the tool did not run).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from agentlightning.adapters._stainless import Patch
from agentlightning.adapters._tools import PendingTool, error_text, parse_arguments
from pydantic_ai.capabilities import (
    AbstractCapability,
    WrapRunHandler,
    WrapToolExecuteHandler,
    WrapToolValidateHandler,
)
from pydantic_ai.exceptions import ToolRetryError
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import RunContext, ToolDefinition

from agentlightning.capture import current_recorder, current_role, reset_role, set_role

logger = logging.getLogger(__name__)


def _retry_text(error: ToolRetryError) -> str:
    """What a ``ModelRetry`` said, as PydanticAI sends it back to the model."""
    content = getattr(error.tool_retry, "content", None)
    return content if isinstance(content, str) else str(content if content is not None else error)


def _start_tool(ctx: RunContext[Any], call: ToolCallPart) -> PendingTool | None:
    recorder = current_recorder()
    if recorder is None:
        return None
    try:
        pending = PendingTool(
            recorder,
            call.tool_name,
            parse_arguments(call.args),
            current_role(),
            "pydantic_ai",
            tool_call_id=call.tool_call_id,
        )
    except Exception:  # capture must never break the agent
        logger.exception("pydantic_ai adapter: could not start recording tool %r", call.tool_name)
        return None
    return pending


def _finish_failed(pending: PendingTool | None, ctx: RunContext[Any], exc: BaseException) -> None:
    if pending is None:
        return
    if isinstance(exc, ToolRetryError):
        pending.finish(None, error=f"ModelRetry: {_retry_text(exc)}", extra={"retry": ctx.retry})
    else:
        pending.finish(None, error=error_text(exc), extra={"retry": ctx.retry})


@dataclass
class Capture(AbstractCapability[Any]):
    """The capability the adapter adds to every run inside a rollout (see the module docstring)."""

    _: KW_ONLY
    id: str | None = "agentlightning_capture"

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # never part of a serialized agent spec

    async def wrap_run(self, ctx: RunContext[Any], *, handler: WrapRunHandler) -> Any:
        name = getattr(ctx.agent, "name", None)
        if not name:
            return await handler()
        token = set_role(name)
        try:
            return await handler()
        finally:
            reset_role(token)

    async def wrap_tool_validate(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: WrapToolValidateHandler,
    ) -> Any:
        try:
            return await handler(args)
        except Exception as exc:
            if tool_def.kind == "function":  # an output tool's validation is not a tool call
                _finish_failed(_start_tool(ctx, call), ctx, exc)
            raise

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        pending = _start_tool(ctx, call) if tool_def.kind == "function" else None
        try:
            result = await handler(args)
        except BaseException as exc:
            _finish_failed(pending, ctx, exc)
            raise
        if pending is not None:
            pending.finish(result, extra={"retry": ctx.retry})
        return result


def _iter_with_capture(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if current_recorder() is not None:
        kwargs["capabilities"] = [*(kwargs.get("capabilities") or ()), Capture()]
    return wrapped(*args, **kwargs)


_PATCH = Patch(extra=(("pydantic_ai.agent", "Agent", "iter", _iter_with_capture),))
install, uninstall, is_installed = _PATCH.install, _PATCH.uninstall, _PATCH.is_installed
