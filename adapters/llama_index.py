"""LlamaIndex adapter: the running agent's ``name`` is the role of its model calls, and each tool call of a
``FunctionAgent`` / ``ReActAgent`` / ``AgentWorkflow`` is recorded with its status and the LLM call that asked for it.

LlamaIndex's instrumentation (``llama_index.core.instrumentation``) calls span handlers around every workflow step,
in the step's own task, before and after it runs. The adapter adds one span handler, :class:`Capture`, to the root
dispatcher; it acts on two steps of the agent workflows:

- ``run_agent_step`` (its event is an ``AgentSetup`` naming the current agent): that agent's name is the current role
  while the step runs, which is when the agent's model is called (streamed or not). After a handoff the next step
  names the agent handed to.
- ``call_tool`` (its event is a ``ToolCall``): the tool call is recorded as a ``kind="tool"`` call linked by
  ``tool_id`` to the LLM call that asked for it. The agent workflows catch a tool's exception and give the model its
  text with ``ToolOutput.is_error``; the adapter records that as ``status="error"`` and ``error="<Type>:
  <message>"``. Handoffs are tool calls too (``handoff``).

Every other span (LLM calls, retrievers, query engines) is left to the user's own handlers; their model calls go
through the openai client and are captured there.
"""

from __future__ import annotations

import inspect
import logging
from contextvars import Token
from typing import Any

from agentlightning.adapters._tools import PendingTool, error_text
from llama_index.core.agent.workflow.workflow_events import AgentSetup, ToolCall, ToolCallResult
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.span import BaseSpan
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler

from agentlightning.capture import current_recorder, reset_role, set_role

logger = logging.getLogger(__name__)


class _StepSpan(BaseSpan):
    role_token: Token[str | None] | None = None
    tool: PendingTool | None = None


def _event(bound_args: inspect.BoundArguments) -> Any:
    return bound_args.arguments.get("ev")


class Capture(BaseSpanHandler[_StepSpan]):
    """The span handler the adapter adds to the root dispatcher (see the module docstring)."""

    @classmethod
    def class_name(cls) -> str:
        return "AgentLightningCapture"

    def new_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        parent_span_id: str | None = None,
        tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> _StepSpan | None:
        recorder = current_recorder()
        if recorder is None:
            return None
        event = _event(bound_args)
        if isinstance(event, AgentSetup) and event.current_agent_name:
            return _StepSpan(id_=id_, parent_id=parent_span_id, role_token=set_role(event.current_agent_name))
        if isinstance(event, ToolCall):
            # The role is the asking LLM call's (found by tool id): the tool step runs outside the agent's step.
            tool = PendingTool(recorder, event.tool_name, event.tool_kwargs, None, "llama_index", event.tool_id)
            return _StepSpan(id_=id_, parent_id=parent_span_id, tool=tool)
        return None

    def prepare_to_exit_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        result: Any | None = None,
        **kwargs: Any,
    ) -> _StepSpan | None:
        span = self.open_spans.get(id_)
        if span is None:
            return None
        if span.role_token is not None:
            reset_role(span.role_token)
        if span.tool is not None:
            output = result.tool_output if isinstance(result, ToolCallResult) else None
            if output is None:
                span.tool.finish(result)
            elif output.is_error:
                error = output.exception
                span.tool.finish(None, error=error_text(error) if error is not None else output.content)
            else:
                span.tool.finish(output.raw_output if output.raw_output is not None else output.content)
        return span

    def prepare_to_drop_span(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        err: BaseException | None = None,
        **kwargs: Any,
    ) -> _StepSpan | None:
        span = self.open_spans.get(id_)
        if span is None:
            return None
        if span.role_token is not None:
            reset_role(span.role_token)
        if span.tool is not None:
            span.tool.finish(None, error=error_text(err) if err is not None else "dropped")
        return span


_handler: Capture | None = None


def install() -> None:
    """Add the span handler to the root dispatcher (idempotent)."""
    global _handler
    if _handler is None:
        _handler = Capture()
        get_dispatcher().add_span_handler(_handler)


def uninstall() -> None:
    """Remove the span handler. Idempotent."""
    global _handler
    if _handler is not None:
        root = get_dispatcher()
        root.span_handlers = [handler for handler in root.span_handlers if handler is not _handler]
        _handler = None


def is_installed() -> bool:
    """Whether the span handler is on the root dispatcher now."""
    return _handler is not None
