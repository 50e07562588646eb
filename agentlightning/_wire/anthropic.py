"""The Anthropic Messages API translated to and from OpenAI chat completions, for a backend that serves only chat
completions (the HF backend, vLLM): :func:`chat_request` turns a Messages request into a chat request,
:func:`message_from_chat` the chat answer back into a ``message``, and :class:`MessageStream` a streamed chat answer
into the server-sent events Anthropic streams, as it arrives. The backend's token ids stay on the chat answer,
which is what is recorded.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from agentlightning._wire.messages import anthropic_to_messages, reasoning_text

logger = logging.getLogger(__name__)

# Messages request fields with the same meaning in a chat request.
_SAME_FIELDS = ("max_tokens", "temperature", "top_p", "top_k")
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions request (not streamed) asking what the Messages request ``body`` asks: system blocks as
    a system message, ``tool_use`` / ``tool_result`` blocks as tool calls and tool messages, tools as functions.
    Raises ``ValueError`` when ``messages`` is not a list of message objects."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(message, dict) for message in messages):
        raise ValueError(f"messages must be a list of message objects, got {type(messages).__name__}")
    chat: dict[str, Any] = {
        "model": body.get("model"),
        "messages": anthropic_to_messages(body.get("messages"), body.get("system")),
    }
    chat.update({key: body[key] for key in _SAME_FIELDS if key in body})
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    tools = [_function(tool) for tool in body.get("tools") or [] if isinstance(tool, dict)]
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif kind in ("auto", "none"):
            chat["tool_choice"] = kind
        elif kind == "any":
            chat["tool_choice"] = "required"
        if choice.get("disable_parallel_tool_use") and tools:
            chat["parallel_tool_calls"] = False
    return chat


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic tool (``name``, ``description``, ``input_schema``) as a chat function tool."""
    function: dict[str, Any] = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def message_from_chat(chat: dict[str, Any], model: Any) -> dict[str, Any]:
    """The Anthropic ``message`` a chat completion (first choice) answers: its reasoning (``reasoning`` or
    ``reasoning_content``) as a thinking block, its text as a text block, its tool calls
    as ``tool_use`` blocks, its finish reason as ``stop_reason``, its token counts as ``usage``."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if reasoning_text(message):
        content.append({"type": "thinking", "thinking": reasoning_text(message), "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": _input(function)}
        )
    usage = chat.get("usage") or {}
    finish = choice.get("finish_reason")
    return {
        "id": f"msg_{chat.get('id') or 'agl'}",
        "type": "message",
        "role": "assistant",
        "model": model if isinstance(model, str) else chat.get("model"),
        "content": content,
        "stop_reason": "tool_use" if message.get("tool_calls") else _STOP_REASONS.get(str(finish), "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0),
        },
    }


def _input(function: dict[str, Any]) -> dict[str, Any]:
    """A tool call's arguments (JSON text) as the ``input`` object of a ``tool_use`` block; text that is not a JSON
    object is kept under ``"arguments"`` (and logged) so that nothing the model wrote is lost."""
    arguments = function.get("arguments") or "{}"
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    logger.warning("tool call %r has arguments that are not a JSON object: %.200s", function.get("name"), arguments)
    return {"arguments": arguments}


def count_tokens(chat: dict[str, Any]) -> int:
    """An estimate of the input tokens of a Messages request, from its :func:`chat_request` (about four characters
    a token, as Anthropic's own guidance puts it): the proxy cannot run the served model's tokenizer."""
    text = json.dumps(chat["messages"]) + json.dumps(chat.get("tools") or [])
    return max(1, len(text) // 4)


class MessageStream:
    """Anthropic stream events for a chat completion's stream, as its chunks arrive (:meth:`feed` each parsed chunk,
    then :meth:`close`): reasoning text (``reasoning``, as vLLM's reasoning parsers send it, or
    ``reasoning_content``) as a thinking block, text as a text block, each tool call as a ``tool_use`` block with its
    arguments as ``input_json_delta``."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.started = False
        self.blocks = 0  # content blocks opened so far
        self.open: tuple[str, int | None] | None = None  # the open block: its kind and, for a tool call, its index
        self.finish: str | None = None
        self.tool_use = False
        self.tool_id: Any = None  # the id of the last tool call opened
        self.usage: dict[str, Any] = {}

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events one chat chunk makes."""
        events: list[dict[str, Any]] = []
        if not self.started:
            self.started = True
            message: dict[str, Any] = {
                "id": f"msg_{chunk.get('id') or 'agl'}",
                "type": "message",
                "role": "assistant",
                "model": self.model if isinstance(self.model, str) else chunk.get("model"),
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            }
            events.append({"type": "message_start", "message": message})
        self.usage = chunk.get("usage") or self.usage
        choices = [choice for choice in chunk.get("choices") or [] if isinstance(choice, dict)]
        choice = next((choice for choice in choices if not choice.get("index")), None)
        if choice is None:
            return events
        self.finish = choice.get("finish_reason") or self.finish
        delta = choice.get("delta") or {}
        if reasoning_text(delta):
            events += self._into(("thinking", None), {"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._delta({"type": "thinking_delta", "thinking": reasoning_text(delta)}))
        if delta.get("content"):
            events += self._into(("text", None), {"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for entry in delta.get("tool_calls") or []:
            function = entry.get("function") or {}
            known = self.open == ("tool", entry.get("index")) and entry.get("id") in (None, self.tool_id)
            if not known:  # a new call (some servers repeat the id on every chunk of a call)
                self.tool_use, self.tool_id = True, entry.get("id")
                block = {"type": "tool_use", "id": entry.get("id"), "name": function.get("name"), "input": {}}
                events += self._into(("tool", entry.get("index")), block, new=True)
            if function.get("arguments"):
                events.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
        return events

    def close(self) -> list[dict[str, Any]]:
        """The events ending the message (after the upstream's last chunk)."""
        events = self._stop()
        stop = "tool_use" if self.tool_use else _STOP_REASONS.get(str(self.finish), "end_turn")
        usage = {
            "input_tokens": int(self.usage.get("prompt_tokens") or 0),
            "output_tokens": int(self.usage.get("completion_tokens") or 0),
        }
        events.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage})
        events.append({"type": "message_stop"})
        return events

    def _into(self, kind: tuple[str, int | None], block: dict[str, Any], new: bool = False) -> list[dict[str, Any]]:
        """Events that make ``kind`` the open block (closing the one open before), or none when it already is."""
        if self.open == kind and not new:
            return []
        events = self._stop()
        self.open = kind
        self.blocks += 1
        return [*events, {"type": "content_block_start", "index": self.blocks - 1, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}

    def _stop(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.blocks - 1}]
