"""OpenTelemetry spans for captured calls, with the GenAI semantic-convention attributes.

Spans are emitted only when an OTel SDK ``TracerProvider`` is configured (``trace.set_tracer_provider(...)``);
otherwise :func:`emit_call_span` returns after one cheap check. Traces then show up in any OTel backend.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from agentlightning import __version__
from agentlightning.types import Call

logger = logging.getLogger(__name__)

_OPERATIONS = {"chat.completions": "chat", "chat.completions.parse": "chat", "responses": "chat",
               "responses.parse": "chat", "completions": "text_completion"}
_REQUEST_ATTRIBUTES = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",
    "seed": "gen_ai.request.seed",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "n": "gen_ai.request.choice.count",
}

def _tracer() -> trace.Tracer | None:
    """A tracer when an SDK provider is configured, else None."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return provider.get_tracer("agentlightning", __version__)


def tracing_enabled() -> bool:
    """Whether an OTel SDK provider is configured (spans of calls are emitted)."""
    return _tracer() is not None


def call_attributes(call: Call) -> dict[str, Any]:
    """GenAI semantic-convention attributes (plus ``agentlightning.*`` ones) describing ``call``."""
    metadata = call.metadata
    api = metadata.get("api", "chat.completions")
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": _OPERATIONS.get(api, "chat"),
        "gen_ai.provider.name": "openai",
        "gen_ai.system": "openai",
        "agentlightning.api": api,
        "agentlightning.call_id": call.call_id,
        "agentlightning.sequence": call.sequence,
        "agentlightning.stream": bool(metadata.get("stream")),
    }
    if call.name:
        attributes["gen_ai.request.model"] = call.name
    if call.rollout_id:
        attributes["agentlightning.rollout_id"] = call.rollout_id
    if call.role:
        attributes["agentlightning.role"] = call.role
    endpoint = metadata.get("endpoint")
    if endpoint:
        parts = urlsplit(endpoint)
        if parts.hostname:
            attributes["server.address"] = parts.hostname
        if parts.port:
            attributes["server.port"] = parts.port
    for key, value in (metadata.get("sampling") or {}).items():
        name = _REQUEST_ATTRIBUTES.get(key)
        if name and isinstance(value, (int, float)) and not isinstance(value, bool):
            attributes[name] = value
    usage = metadata.get("usage") or {}
    for source, name in (("prompt_tokens", "gen_ai.usage.input_tokens"), ("input_tokens", "gen_ai.usage.input_tokens"),
                         ("completion_tokens", "gen_ai.usage.output_tokens"),
                         ("output_tokens", "gen_ai.usage.output_tokens")):
        if isinstance(usage.get(source), int):
            attributes[name] = usage[source]
    if metadata.get("response_model"):
        attributes["gen_ai.response.model"] = metadata["response_model"]
    if call.response_id:
        attributes["gen_ai.response.id"] = call.response_id
    output = call.output if isinstance(call.output, dict) else {}
    if output.get("finish_reason"):
        attributes["gen_ai.response.finish_reasons"] = [str(output["finish_reason"])]
    if call.token_source:
        attributes["agentlightning.token_source"] = call.token_source
    if call.status == "error":
        attributes["error.type"] = metadata.get("error_type") or "error"
    return attributes


def emit_call_span(call: Call) -> None:
    """Emit one CLIENT span for a finished LLM call, when an OTel SDK is configured."""
    tracer = _tracer()
    if tracer is None:
        return
    attributes = call_attributes(call)
    span = tracer.start_span(
        f"{attributes['gen_ai.operation.name']} {call.name or ''}".strip(),
        kind=SpanKind.CLIENT,
        start_time=int(call.start_time * 1e9),
        attributes=attributes,
    )
    if call.status == "error":
        span.set_status(Status(StatusCode.ERROR, call.error))
    span.end(end_time=int((call.end_time or call.start_time) * 1e9))
