"""Reading a call off the wire into ``Call`` fields: :func:`request_fields` from the request as sent,
:func:`fill_answer` with what :func:`read_response` (parsed ``openai`` objects or JSON dicts) or a :class:`StreamFold`
read, then :func:`build_call`. Token ids are read where vLLM puts them with ``return_token_ids``; the Anthropic
Messages API (``api="messages"``) has no field for them, nor for logprobs: they are read from top-level
``prompt_token_ids`` / ``token_ids`` of the message (and of its stream events) where a server sends them so.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pydantic
import pydantic_core

from agentlightning._wire.messages import (
    anthropic_to_messages,
    as_plain,
    reasoning_text,
    responses_input_to_messages,
    tool_call,
)
from agentlightning.types import Call, TokenSource

logger = logging.getLogger(__name__)

# The endpoints of the API (path under /v1) by the name recorded for them; ``*.parse`` calls read as ``create``.
ENDPOINTS: dict[str, str] = {
    "chat/completions": "chat.completions",
    "completions": "completions",
    "responses": "responses",
}
# Request fields that are not sampling parameters (all others are recorded in metadata["sampling"]).
_NOT_SAMPLING = frozenset({"model", "messages", "prompt", "input", "instructions", "system", "tools", "stream"})
_TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")
_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def json_text(value: Any) -> str:
    """``value`` (made of JSON types) as JSON text; strings with lone surrogates, which pydantic-core refuses, are
    written by ``json``."""
    try:
        return pydantic_core.to_json(value).decode()
    except ValueError:
        return json.dumps(value)


def request_fields(api: str, request: dict[str, Any]) -> dict[str, Any]:
    """The ``Call`` fields a request body (plain JSON data, as sent) gives: model name, input, tools offered, and
    ``metadata`` with ``stream`` and ``sampling`` (every field but the input, model, tools and stream flag)."""
    model, tools = request.get("model"), request.get("tools")
    if api.startswith("chat"):
        input_ = request.get("messages")
    elif api.startswith("responses"):
        input_ = responses_input_to_messages(request.get("input"), request.get("instructions"))
    elif api.startswith("messages"):
        input_ = anthropic_to_messages(request.get("messages"), request.get("system"))
    else:
        input_ = request.get("prompt")
    return {
        "name": model if isinstance(model, str) else None,
        "input": input_,
        "tools": tools if isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools) else None,
        "metadata": {
            "stream": bool(request.get("stream")),
            "sampling": {key: value for key, value in request.items() if key not in _NOT_SAMPLING},
        },
    }


def fill_answer(fields: dict[str, Any], answer: dict[str, Any], token_source: TokenSource) -> None:
    """Add what :func:`read_response` (or :meth:`StreamFold.answer`) read to the ``Call`` fields of a request;
    token ids mark the call's ``token_source``."""
    response_id = answer.get("response_id")
    fields["output"] = answer["output"]
    fields["response_id"] = response_id if isinstance(response_id, str) else None
    for key in _TOKEN_FIELDS:
        fields[key] = answer.get(key)
    if answer.get("prompt_token_ids") is not None or answer.get("completion_token_ids") is not None:
        fields["token_source"] = token_source
    metadata = fields["metadata"]
    usage = _view(answer.get("usage"))
    if usage:  # the token counts (nested details left out)
        metadata["usage"] = {key: value for key, value in usage.items() if type(value) is int}
    if isinstance(answer.get("model"), str):
        metadata["response_model"] = answer["model"]
    for key in ("model_version", "policy"):  # the weights (and policy) that produced it, when the backend says (HF)
        if isinstance(answer.get(key), str):
            metadata[key] = answer[key]
    if answer.get("choices", 1) > 1:
        metadata["choices"] = answer["choices"]


def build_call(fields: dict[str, Any]) -> Call:
    """The ``Call`` of ``fields``, validated strictly; token fields the backend sent malformed are left out (and
    named in ``metadata["invalid_token_fields"]``) rather than losing the call."""
    try:
        return Call.model_validate(fields, strict=True)
    except pydantic.ValidationError as exc:
        bad = sorted({str(error["loc"][0]) for error in exc.errors()}.intersection(_TOKEN_FIELDS))
        if not bad:
            raise
        logger.warning("the backend sent malformed %s; the call is recorded without token ids: %s", ", ".join(bad), exc)
        fields = {**fields, "token_source": None, "metadata": {**fields["metadata"], "invalid_token_fields": bad}}
        fields.update(dict.fromkeys(_TOKEN_FIELDS))
        return Call.model_validate(fields, strict=True)


def _view(obj: Any) -> dict[str, Any]:
    """The fields of a response object (declared ones and extras such as vLLM's ``token_ids``) or its JSON dict."""
    if isinstance(obj, dict):
        return obj
    if isinstance(obj, pydantic.BaseModel):
        extra = obj.model_extra
        return {**vars(obj), **extra} if extra else vars(obj)
    return {}


def _logprob(entry: Any) -> Any:
    return entry.get("logprob") if isinstance(entry, dict) else getattr(entry, "logprob", None)


def _logprobs(value: Any) -> list[Any] | None:
    """The sampled tokens' logprobs of a chat (``content``) or legacy completions (``token_logprobs``) choice."""
    view = _view(value)
    if view.get("content") is not None:
        return [_logprob(entry) for entry in view["content"]]
    if view.get("token_logprobs") is not None:
        return list(view["token_logprobs"])
    return None


def _prompt_ids(body: dict[str, Any], choice: dict[str, Any]) -> Any:
    """Prompt token ids at the top level, or on the choice (vLLM's legacy completions)."""
    return body["prompt_token_ids"] if body.get("prompt_token_ids") is not None else choice.get("prompt_token_ids")


def _tool_call(entry: Any) -> dict[str, Any]:
    view = _view(entry)
    function = _view(view.get("function"))
    return {
        **tool_call(view.get("id"), function.get("name"), function.get("arguments")),
        "type": view.get("type") or "function",
    }


def _answer(
    output: dict[str, Any], body: dict[str, Any], prompt_ids: Any, completion_ids: Any, logprobs: Any, **more: Any
) -> dict[str, Any]:
    """What a response answered, as :func:`read_response` gives it."""
    return {
        "output": output,
        "response_id": body.get("id"),
        "model": body.get("model"),
        "usage": body.get("usage"),
        "prompt_token_ids": prompt_ids,
        "completion_token_ids": completion_ids,
        "completion_logprobs": logprobs,
        **more,
    }


def read_response(api: str, response: Any) -> dict[str, Any]:
    """What a finished response (parsed object or JSON dict) answered: ``output`` (content, tool calls, finish
    reason of the first choice, with its ``reasoning_content`` when the server sent reasoning), ``response_id``,
    token ids and logprobs as the backend sent them, ``usage``, ``model`` and the number of ``choices``."""
    body = _view(response)
    if api.startswith("responses"):
        return _read_responses(body)
    if api.startswith("messages"):
        return _read_message(body)
    choices = body.get("choices") or []
    choice = _view(choices[0]) if choices else {}
    output: dict[str, Any]
    if api == "completions":
        output = {"content": choice.get("text"), "tool_calls": [], "finish_reason": choice.get("finish_reason")}
    else:
        message = _view(choice.get("message"))
        output = {
            "content": message.get("content"),
            "tool_calls": [_tool_call(entry) for entry in message.get("tool_calls") or []],
            "finish_reason": choice.get("finish_reason"),
        }
        if message.get("refusal"):
            output["refusal"] = message["refusal"]
        if reasoning_text(message):
            output["reasoning_content"] = reasoning_text(message)
    return _answer(
        output,
        body,
        _prompt_ids(body, choice),
        choice.get("token_ids"),
        _logprobs(choice.get("logprobs")),
        choices=len(choices),
        model_version=body.get("model_version"),
        policy=body.get("policy"),
    )


def _read_responses(body: dict[str, Any]) -> dict[str, Any]:
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    logprobs: list[Any] = []
    for item in map(_view, body.get("output") or []):
        if item.get("type") == "message":
            for part in map(_view, item.get("content") or []):
                if part.get("type") == "output_text":
                    texts.append(part.get("text") or "")
                    logprobs.extend(_logprob(entry) for entry in part.get("logprobs") or [])
        elif item.get("type") == "function_call":
            tool_calls.append(tool_call(item.get("call_id"), item.get("name"), item.get("arguments")))
    finish_reason = "tool_calls" if tool_calls else "stop"
    if body.get("status") == "incomplete":  # as a chat finish reason: 'length', or the reason given
        reason = _view(body.get("incomplete_details")).get("reason") or "incomplete"
        finish_reason = "length" if reason == "max_output_tokens" else reason
    output = {"content": "".join(texts) if texts else None, "tool_calls": tool_calls, "finish_reason": finish_reason}
    return _answer(output, body, body.get("prompt_token_ids"), body.get("output_token_ids"), logprobs or None)


def _read_message(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic ``message``: text blocks as content, ``tool_use`` blocks as tool calls, its ``stop_reason``."""
    blocks = list(map(_view, body.get("content") or []))
    texts = [block.get("text") or "" for block in blocks if block.get("type") == "text"]
    calls = [
        tool_call(block.get("id"), block.get("name"), json.dumps(as_plain(block.get("input") or {})))
        for block in blocks
        if block.get("type") == "tool_use"
    ]
    output = {
        "content": "".join(texts) if texts else None,
        "finish_reason": body.get("stop_reason"),
        "tool_calls": calls,
    }
    return _answer(output, body, body.get("prompt_token_ids"), body.get("token_ids"), None)


class StreamFold:
    """Folds the chunks (chat, completions) or events (Responses) of a stream, objects or dicts, into what
    :func:`read_response` gives for a finished response. Only the first choice is kept."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.response_id: str | None = None
        self.model: str | None = None
        self.usage: Any = None
        self.prompt_ids: list[int] | None = None
        self.completion_ids: list[Any] | None = None
        self.logprobs: list[Any] | None = None
        self.final_response: Any = None  # the Responses API's last event carries the whole response
        self._pending = b""

    def feed(self, data: bytes) -> list[Any]:
        """Add the server-sent events in ``data``, raw bytes of the stream as they arrive (a malformed event is
        logged and skipped); returns the events read, parsed."""
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        read = []
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                try:
                    event = json.loads(line[5:])
                    self.add(event)
                except Exception:  # noqa: BLE001 - a malformed event is skipped, the stream goes on
                    logger.warning("could not read a stream event: %.200r", line, exc_info=True)
                else:
                    read.append(event)
        return read

    def add(self, chunk: Any) -> None:
        """Add one parsed chunk or event."""
        body = _view(chunk)
        if self.api.startswith("messages"):
            self._add_message_event(body)
            return
        if self.api.startswith("responses"):
            if body.get("type") in _FINAL_EVENTS:
                self.final_response = body.get("response")
            elif body.get("type") == "response.output_text.delta":
                self.texts.append(body.get("delta") or "")
            return
        self.response_id = self.response_id or body.get("id")
        self.model = self.model or body.get("model")
        self.usage = body.get("usage") or self.usage
        choice = next((choice for choice in map(_view, body.get("choices") or []) if not choice.get("index")), None)
        if choice is None:
            return
        if self.prompt_ids is None:
            self.prompt_ids = _prompt_ids(body, choice)
        if choice.get("token_ids") is not None:
            self.completion_ids = (self.completion_ids or []) + list(choice["token_ids"])
        logprobs = _logprobs(choice.get("logprobs"))
        if logprobs:
            self.logprobs = (self.logprobs or []) + logprobs
        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        if self.api == "completions":
            self.texts.append(choice.get("text") or "")
            return
        delta = _view(choice.get("delta"))
        if reasoning_text(delta):
            self.reasoning.append(reasoning_text(delta))
        if delta.get("content"):
            self.texts.append(delta["content"])
        for entry in map(_view, delta.get("tool_calls") or []):
            slot = self.tool_calls.setdefault(entry.get("index") or 0, tool_call(None, None, ""))
            function = _view(entry.get("function"))
            slot["id"] = entry.get("id") or slot["id"]
            slot["function"]["name"] = function.get("name") or slot["function"]["name"]
            slot["function"]["arguments"] += function.get("arguments") or ""

    def _add_message_event(self, body: dict[str, Any]) -> None:
        """One event of an Anthropic Messages stream."""
        kind, index = body.get("type"), body.get("index") or 0
        if body.get("token_ids") is not None:
            self.completion_ids = (self.completion_ids or []) + list(body["token_ids"])
        if kind == "message_start":
            message = _view(body.get("message"))
            self.response_id, self.model, self.usage = message.get("id"), message.get("model"), message.get("usage")
            self.prompt_ids = message.get("prompt_token_ids")
        elif kind == "content_block_start" and (block := _view(body.get("content_block"))).get("type") == "tool_use":
            self.tool_calls[index] = tool_call(block.get("id"), block.get("name"), "")
        elif kind == "content_block_delta":
            delta = _view(body.get("delta"))
            if delta.get("type") == "text_delta":
                self.texts.append(delta.get("text") or "")
            elif delta.get("type") == "input_json_delta" and index in self.tool_calls:
                self.tool_calls[index]["function"]["arguments"] += delta.get("partial_json") or ""
        elif kind == "message_delta":
            self.finish_reason = _view(body.get("delta")).get("stop_reason") or self.finish_reason
            counts = {key: value for key, value in _view(body.get("usage")).items() if value is not None}
            self.usage = {**_view(self.usage), **counts}

    def answer(self, complete: bool = True) -> dict[str, Any]:
        """What the stream answered, as :func:`read_response` gives it; ``complete=False`` for a stream left before
        its end (finish reason 'incomplete_stream' unless one was seen)."""
        if self.final_response is not None:
            return read_response("responses", self.final_response)
        text = "".join(self.texts)
        output = {
            "content": text if text or not self.tool_calls else None,
            "tool_calls": [self.tool_calls[index] for index in sorted(self.tool_calls)],
            "finish_reason": self.finish_reason or (None if complete else "incomplete_stream"),
        }
        if self.reasoning:
            output["reasoning_content"] = "".join(self.reasoning)
        return _answer(
            output,
            {"id": self.response_id, "model": self.model, "usage": self.usage},
            self.prompt_ids,
            self.completion_ids,
            self.logprobs,
        )
