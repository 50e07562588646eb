"""OpenTelemetry spans for captured calls, with the GenAI semantic-convention attributes.

Spans are emitted only when an OTel SDK ``TracerProvider`` is configured (``trace.set_tracer_provider(...)``);
otherwise :func:`emit_call_span` returns after one cheap check. Traces then show up in any OTel backend.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from agentlightning import __version__
from agentlightning.types import Call

_OPERATIONS = {
    "chat.completions": "chat",
    "chat.completions.parse": "chat",
    "responses": "chat",
    "responses.parse": "chat",
    "completions": "text_completion",
}
_REQUEST_ATTRIBUTES = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",
    "n": "gen_ai.request.choice.count",
    **{
        name: f"gen_ai.request.{name}"
        for name in ("temperature", "top_p", "top_k", "seed", "frequency_penalty", "presence_penalty")
    },
}
_USAGE = {
    "prompt_tokens": "gen_ai.usage.input_tokens",
    "input_tokens": "gen_ai.usage.input_tokens",
    "completion_tokens": "gen_ai.usage.output_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
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
    optional = {
        "gen_ai.request.model": call.name,
        "agentlightning.rollout_id": call.rollout_id,
        "agentlightning.role": call.role,
        "gen_ai.response.model": metadata.get("response_model"),
        "gen_ai.response.id": call.response_id,
        "agentlightning.token_source": call.token_source,
    }
    attributes.update((name, value) for name, value in optional.items() if value)
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
    attributes.update((_USAGE[key], value) for key, value in usage.items() if key in _USAGE and isinstance(value, int))
    output = call.output if isinstance(call.output, dict) else {}
    if output.get("finish_reason"):
        attributes["gen_ai.response.finish_reasons"] = [str(output["finish_reason"])]
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
