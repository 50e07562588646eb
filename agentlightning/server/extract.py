"""Turning a proxied request and the upstream's answer (a JSON body or a server-sent event stream) into a call record.

A call record is a plain dict of :class:`~agentlightning.types.Call` fields, JSON-ready: the proxy builds one per
forwarded request and the store keeps it as JSON, validated as a ``Call`` only when it is read back (building
pydantic models on every proxied call cost more CPU than the rest of the recording).

Token ids are read where vLLM puts them with ``return_token_ids``: ``prompt_token_ids`` at the top level (chat,
Responses) or on the choice (legacy completions), ``choices[i].token_ids`` (chat, completions; per chunk when
streamed) and ``output_token_ids`` (Responses). Sampling logprobs come from ``choices[i].logprobs``.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic_core

from agentlightning.types import new_id

CallRecord = dict[str, Any]


def parse_json(raw: bytes) -> Any:
    """``raw`` parsed with pydantic-core's JSON parser (about twice as fast as ``json`` on the proxy's bodies); what
    it refuses (a BOM, UTF-16, lone surrogates, invalid JSON) goes to ``json``, which parses or raises as before."""
    try:
        return pydantic_core.from_json(raw)
    except ValueError:
        return json.loads(raw)


def json_text(value: Any) -> str:
    """``value`` (made of JSON types) as JSON text, with pydantic-core's serialiser (about three times as fast as
    ``json``); ``json`` writes what it refuses (strings with lone surrogates)."""
    try:
        return pydantic_core.to_json(value).decode()
    except ValueError:
        return json.dumps(value)

ENDPOINTS: dict[str, str] = {
    "chat/completions": "chat.completions",
    "completions": "completions",
    "responses": "responses",
}

_SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "stop",
    "seed", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs",
)


def call_input(endpoint: str, body: dict[str, Any]) -> Any:
    """What the model was given: chat messages, a completion prompt, or Responses input (with instructions)."""
    if endpoint == "chat.completions":
        return body.get("messages")
    if endpoint == "completions":
        return body.get("prompt")
    instructions = body.get("instructions")
    data = body.get("input")
    if instructions:
        prefix = [{"role": "system", "content": instructions}]
        return prefix + (data if isinstance(data, list) else [{"role": "user", "content": data}])
    return data


def new_call(
    rollout_id: str, endpoint: str, body: dict[str, Any], start: float, model_version: str | None
) -> CallRecord:
    """The call record for a request, before the answer is known."""
    metadata: dict[str, Any] = {
        "endpoint": endpoint,
        "stream": bool(body.get("stream")),
        "sampling": {key: body[key] for key in _SAMPLING_KEYS if key in body},
        "captured_by": "proxy",
    }
    if model_version is not None:
        metadata["model_version"] = model_version
    model = body.get("model")
    tools = body.get("tools")
    return {
        "call_id": new_id("call"),
        "rollout_id": rollout_id,
        "kind": "llm",
        "name": model if isinstance(model, str) else None,
        "input": call_input(endpoint, body),
        "tools": tools if isinstance(tools, list) and all(isinstance(t, dict) for t in tools) else None,
        "status": "ok",
        "start_time": start,
        "metadata": metadata,
    }


def fill_from_body(call: CallRecord, endpoint: str, body: Any) -> None:
    """Complete ``call`` from a non-streamed upstream answer."""
    if not isinstance(body, dict):
        return
    call["response_id"] = _str(body.get("id"))
    if body.get("usage"):
        call["metadata"]["usage"] = body["usage"]
    if endpoint == "responses":
        _fill_responses(call, body)
        return
    choices = body.get("choices") or [{}]
    choice = choices[0] if isinstance(choices, list) and isinstance(choices[0], dict) else {}
    prompt_ids = body.get("prompt_token_ids", choice.get("prompt_token_ids"))
    call["prompt_token_ids"] = _ints(prompt_ids)
    call["completion_token_ids"] = _ints(choice.get("token_ids"))
    call["completion_logprobs"] = _logprobs(choice.get("logprobs"))
    if endpoint == "chat.completions":
        message = choice.get("message") or {}
        call["output"] = {
            "content": message.get("content"),
            "tool_calls": message.get("tool_calls") or [],
            "finish_reason": choice.get("finish_reason"),
        }
    else:
        call["output"] = {"content": choice.get("text"), "tool_calls": [], "finish_reason": choice.get("finish_reason")}
    _mark_source(call)


def _fill_responses(call: CallRecord, body: dict[str, Any]) -> None:
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    logprobs: list[float] = []
    for item in body.get("output") or []:
        if item.get("type") == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    texts.append(part.get("text") or "")
                    logprobs.extend(
                        float(entry["logprob"]) for entry in part.get("logprobs") or [] if "logprob" in entry
                    )
        elif item.get("type") == "function_call":
            tool_calls.append(
                {"id": item.get("call_id"), "type": "function",
                 "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            )
    call["output"] = {"content": "".join(texts) if texts else None, "tool_calls": tool_calls,
                      "finish_reason": body.get("status")}
    call["prompt_token_ids"] = _ints(body.get("prompt_token_ids"))
    call["completion_token_ids"] = _ints(body.get("output_token_ids"))
    call["completion_logprobs"] = logprobs or None
    _mark_source(call)


class StreamAccumulator:
    """Feeds on the raw bytes of a server-sent event stream and rebuilds the answer it carried."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._pending = b""
        self.response_id: str | None = None
        self.prompt_ids: list[int] | None = None
        self.completion_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.text: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.final_response: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        """Consume bytes as they are passed through to the agent."""
        self._pending += chunk
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            line = line.strip()
            if line.startswith(b"data:"):
                self._event(line[5:].strip())

    def _event(self, data: bytes) -> None:
        if not data or data == b"[DONE]":
            return
        try:
            event = parse_json(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if self.endpoint == "responses":
            if event.get("type") in ("response.completed", "response.incomplete", "response.failed"):
                self.final_response = event.get("response")
            return
        self.response_id = self.response_id or event.get("id")
        if event.get("prompt_token_ids") is not None:
            self.prompt_ids = _ints(event["prompt_token_ids"])
        if event.get("usage"):
            self.usage = event["usage"]
        for choice in event.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        if choice.get("prompt_token_ids") is not None and self.prompt_ids is None:
            self.prompt_ids = _ints(choice["prompt_token_ids"])
        if choice.get("token_ids") is not None:
            self.completion_ids = (self.completion_ids or []) + (_ints(choice["token_ids"]) or [])
        logprobs = _logprobs(choice.get("logprobs"))
        if logprobs:
            self.logprobs = (self.logprobs or []) + logprobs
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if self.endpoint == "completions":
            self.text.append(choice.get("text") or "")
            return
        delta = choice.get("delta") or {}
        if delta.get("content"):
            self.text.append(delta["content"])
        for tool in delta.get("tool_calls") or []:
            slot = self.tool_calls.setdefault(
                tool.get("index", 0), {"id": None, "type": "function", "function": {"name": None, "arguments": ""}}
            )
            slot["id"] = tool.get("id") or slot["id"]
            function = tool.get("function") or {}
            slot["function"]["name"] = function.get("name") or slot["function"]["name"]
            slot["function"]["arguments"] += function.get("arguments") or ""

    def fill(self, call: CallRecord) -> None:
        """Complete ``call`` from what the stream carried."""
        if self.endpoint == "responses":
            if self.final_response is not None:
                fill_from_body(call, "responses", self.final_response)
            return
        call["response_id"] = _str(self.response_id)
        call["prompt_token_ids"] = self.prompt_ids
        call["completion_token_ids"] = self.completion_ids
        call["completion_logprobs"] = self.logprobs
        if self.usage:
            call["metadata"]["usage"] = self.usage
        call["output"] = {
            "content": "".join(self.text) if self.text else None,
            "tool_calls": [self.tool_calls[i] for i in sorted(self.tool_calls)],
            "finish_reason": self.finish_reason,
        }
        _mark_source(call)


def _mark_source(call: CallRecord) -> None:
    if call.get("prompt_token_ids") is not None or call.get("completion_token_ids") is not None:
        call["token_source"] = "server"


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _ints(value: Any) -> list[int] | None:
    """Token ids as the upstream sent them (checked to be ints when the record is read back as a ``Call``)."""
    return value if isinstance(value, list) else None


def _logprobs(value: Any) -> list[float] | None:
    """Sampled-token logprobs from a chat (``content``) or completions (``token_logprobs``) logprobs object."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("content"), list):
        return [float(entry["logprob"]) for entry in value["content"] if isinstance(entry, dict) and "logprob" in entry]
    if isinstance(value.get("token_logprobs"), list):
        return [float(v) for v in value["token_logprobs"] if v is not None]
    return None
