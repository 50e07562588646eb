"""OpenAI Agents SDK adapter: the speaking agent names the role and function tools are recorded, whether or not the
SDK's tracing is enabled.

The SDK opens a span around each agent's turns and each function tool. With tracing disabled
(``set_tracing_disabled(True)``, which every custom-provider example of the SDK calls, ``RunConfig(tracing_disabled=
True)``, ``OPENAI_AGENTS_DISABLE_TRACING=1``) those spans are ``NoOpSpan`` objects that reach no tracing processor,
so the adapter wraps ``start`` / ``finish`` / ``set_error`` of both span classes rather than registering a processor:
while an agent span is open its agent's name is the current role (handoffs and ``agent.as_tool`` included), and each
function span becomes a ``kind="tool"`` call, ``status="error"`` when the SDK recorded an error on it or an MCP tool
answered ``isError`` (``mcp.ClientSession.call_tool`` is wrapped to see it). The user's trace processors and exporters
are left as they are.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from contextvars import Token
from dataclasses import dataclass
from typing import Any

from agentlightning.adapters._stainless import Patch
from agentlightning.adapters._tools import PendingTool, parse_arguments
from agents.tracing import AgentSpanData, FunctionSpanData, SpanError, get_current_span

from agentlightning.capture import current_recorder, current_role, reset_role, set_role

logger = logging.getLogger(__name__)


@dataclass
class _OpenSpan:
    role_token: Token[str | None] | None = None
    tool: PendingTool | None = None
    error: SpanError | None = None


# span -> what an open agent or function span started; a span that never finishes (a cancelled run) leaves with it
_open: weakref.WeakKeyDictionary[Any, _OpenSpan] = weakref.WeakKeyDictionary()


def _on_start(span: Any, mark_as_current: bool = False) -> None:
    data = span.span_data
    if span in _open or not isinstance(data, (AgentSpanData, FunctionSpanData)):
        return
    opened = _open[span] = _OpenSpan()
    if isinstance(data, AgentSpanData):
        opened.role_token = set_role(data.name)
    elif (recorder := current_recorder()) is not None:  # the SDK fills the input after the span starts
        opened.tool = PendingTool(recorder, data.name, None, current_role(), "openai_agents")


def _on_finish(span: Any, reset_current: bool = False) -> None:
    opened = _open.pop(span, None)
    if opened is None:
        return
    if opened.role_token is not None:
        reset_role(opened.role_token)
    if opened.tool is not None:
        data, error = span.span_data, opened.error or span.error
        message = None
        if error is not None:
            detail = (error.get("data") or {}).get("error")
            message = f"{error.get('message')}: {detail}" if detail else str(error.get("message"))
        opened.tool.arguments = parse_arguments(data.input)
        opened.tool.finish(data.output, error=message)


def _on_error(span: Any, error: SpanError) -> None:
    if (opened := _open.get(span)) is not None:
        opened.error = error  # a NoOpSpan does not keep it


async def _mcp_call(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = await wrapped(*args, **kwargs)
    try:
        failed = getattr(result, "is_error", None) or getattr(result, "isError", False)  # mcp 2.x, 1.x
        span = get_current_span()
        if failed and span is not None and (opened := _open.get(span)) is not None:
            text = " ".join(str(getattr(item, "text", "")) for item in result.content)
            opened.error = {"message": "MCP tool error", "data": {"error": text}}
    except Exception:  # capture must never break the agent
        logger.exception("openai_agents adapter: could not read an MCP tool result")
    return result


def _observer(hook: Callable[..., None]) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        try:
            hook(instance, *args, **kwargs)
        except Exception:  # capture must never break the agent
            logger.exception("openai_agents adapter: could not follow span %r", instance)
        return result

    return wrapper


_SPANS = "agents.tracing.spans"
_PATCH = Patch(
    extra=(
        *(
            (_SPANS, cls, method, _observer(hook))
            for cls in ("SpanImpl", "NoOpSpan")
            for method, hook in (("start", _on_start), ("finish", _on_finish), ("set_error", _on_error))
        ),
        ("mcp.client.session", "ClientSession", "call_tool", _mcp_call),
    )
)
install, is_installed = _PATCH.install, _PATCH.is_installed


def uninstall() -> None:
    """Restore the SDK's span methods. Idempotent."""
    _PATCH.uninstall()
    _open.clear()
