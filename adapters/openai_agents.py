"""OpenAI Agents SDK adapter: a tracing processor that names the speaking agent and records function tools.

While a generation or response span is open, the name of the nearest agent span above it is the current role (so
handoffs and ``agent.as_tool`` are attributed to the agent that made the request); each function span becomes a
``kind="tool"`` call, ``status="error"`` when the SDK recorded an error on it. The processor stays registered when
the user replaces the SDK's processors with ``agents.set_trace_processors([...])``. It sees nothing while tracing is
disabled (``set_tracing_disabled``, ``OPENAI_AGENTS_DISABLE_TRACING=1``, ``RunConfig(tracing_disabled=True)``): LLM
calls are then recorded without agent names.
"""

from __future__ import annotations

import logging
import os
import threading
from contextvars import Token
from dataclasses import dataclass
from typing import Any

import wrapt
from agentlightning.adapters._tools import PendingTool, parse_arguments
from agents import add_trace_processor
from agents.tracing import (
    AgentSpanData,
    FunctionSpanData,
    GenerationSpanData,
    ResponseSpanData,
    Span,
    Trace,
    TracingProcessor,
    get_trace_provider,
)
from agents.tracing.provider import SynchronousMultiTracingProcessor

from agentlightning.capture import current_recorder, current_role, reset_role, set_role

logger = logging.getLogger(__name__)


@dataclass
class _OpenSpan:
    parent_id: str | None
    trace_id: str
    agent: str | None = None
    role_token: Token[str | None] | None = None
    tool: PendingTool | None = None


class AgentLightningTracingProcessor(TracingProcessor):
    """Attributes model requests to agents and records function tools into the current rollout."""

    def __init__(self) -> None:
        self._spans: dict[str, _OpenSpan] = {}

    def _agent_above(self, span_id: str | None) -> str | None:
        open_span = self._spans.get(span_id) if span_id is not None else None
        while open_span is not None and open_span.agent is None:
            open_span = self._spans.get(open_span.parent_id) if open_span.parent_id is not None else None
        return open_span.agent if open_span is not None else None

    def on_trace_start(self, trace: Trace) -> None:
        return None

    def on_trace_end(self, trace: Trace) -> None:
        # Spans of a finished trace that never ended (a cancelled run) are dropped.
        for span_id, open_span in list(self._spans.items()):  # a C-level copy: safe while other threads add spans
            if open_span.trace_id == trace.trace_id:
                self._spans.pop(span_id, None)

    def on_span_start(self, span: Span[Any]) -> None:
        data = span.span_data
        open_span = _OpenSpan(parent_id=span.parent_id, trace_id=span.trace_id)
        if isinstance(data, AgentSpanData):
            open_span.agent = data.name
        self._spans[span.span_id] = open_span
        if isinstance(data, (GenerationSpanData, ResponseSpanData)):
            agent = self._agent_above(span.parent_id)
            if agent is not None and agent != current_role():
                open_span.role_token = set_role(agent)
        elif isinstance(data, FunctionSpanData):
            recorder = current_recorder()
            if recorder is not None:
                open_span.tool = PendingTool(
                    recorder,
                    name=data.name,
                    arguments=None,  # the SDK fills the span's input after it starts
                    role=self._agent_above(span.parent_id),
                    adapter="openai_agents",
                )

    def on_span_end(self, span: Span[Any]) -> None:
        open_span = self._spans.pop(span.span_id, None)
        if open_span is None:
            return
        if open_span.role_token is not None:
            reset_role(open_span.role_token)
        if open_span.tool is not None:
            data = span.span_data
            open_span.tool.arguments = parse_arguments(data.input)
            error = span.error
            message = None
            if error is not None:
                detail = (error.get("data") or {}).get("error")
                message = f"{error.get('message')}: {detail}" if detail else str(error.get("message"))
            open_span.tool.finish(data.output, error=message)

    def shutdown(self) -> None:
        self._spans.clear()

    def force_flush(self) -> None:
        return None


_lock = threading.Lock()
_processor: AgentLightningTracingProcessor | None = None
_original_set_processors: Any = None


def _keep_ours(wrapped: Any, instance: SynchronousMultiTracingProcessor, args: Any, kwargs: Any) -> Any:
    """``set_trace_processors([...])`` replaces the SDK's processors (users do it to stop the export to OpenAI);
    the capture processor stays until :func:`uninstall`."""
    result = wrapped(*args, **kwargs)
    processor = _processor
    if processor is not None and processor not in instance._processors:  # noqa: SLF001
        instance.add_tracing_processor(processor)
    return result


def install() -> None:
    """Add the processor to the SDK's trace provider, and keep it there across ``set_trace_processors``.
    Idempotent."""
    global _processor, _original_set_processors
    with _lock:
        if _processor is not None:
            return
        _original_set_processors = SynchronousMultiTracingProcessor.__dict__["set_processors"]
        wrapt.wrap_function_wrapper(SynchronousMultiTracingProcessor, "set_processors", _keep_ours)
        _processor = AgentLightningTracingProcessor()
        add_trace_processor(_processor)
        if os.environ.get("OPENAI_AGENTS_DISABLE_TRACING", "").lower() in ("1", "true"):
            logger.warning(
                "OPENAI_AGENTS_DISABLE_TRACING is set: the Agents SDK creates no spans, so LLM calls are captured "
                "without agent names and function tools are not recorded. To stop the export of traces to OpenAI "
                "instead, call agents.set_trace_processors([])."
            )
        logger.debug("OpenAI Agents SDK capture adapter installed")


def uninstall() -> None:
    """Remove the processor, keeping every other processor. Idempotent."""
    global _processor, _original_set_processors
    with _lock:
        if _processor is None:
            return
        processor, _processor = _processor, None
        SynchronousMultiTracingProcessor.set_processors = _original_set_processors
        _original_set_processors = None
        get_trace_provider().set_processors([p for p in _registered() if p is not processor])


def is_installed() -> bool:
    """Whether the capture processor is registered now."""
    return _processor is not None


def _registered() -> list[TracingProcessor]:
    """The processors the SDK's provider calls now."""
    multi = getattr(get_trace_provider(), "_multi_processor", None)
    return list(getattr(multi, "_processors", ()))
