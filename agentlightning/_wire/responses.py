"""The OpenAI Responses API translated to and from chat completions, for a backend whose token ids come on chat
completions only (the HF backend serves nothing else): :func:`chat_request` turns a Responses request, after the
conversation of its ``previous_response_id``, into a chat request; :func:`response_from_chat` turns the chat answer
back into a ``response``, and :class:`ResponseStream` a streamed chat answer into Responses events as it arrives;
:func:`conversation`
is what a later request continuing that response starts from. The chat answer, with its token ids, is what is
recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from agentlightning._wire.messages import reasoning_text, responses_input_to_messages
from agentlightning.types import new_id

logger = logging.getLogger(__name__)

# Responses request fields with the same meaning in a chat request.
_SAME_FIELDS = ("temperature", "top_p", "parallel_tool_calls", "user")
_TOOL_CHOICES = frozenset({"auto", "none", "required"})


def chat_request(body: dict[str, Any], history: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The chat completions request (not streamed) asking what the Responses request ``body`` asks, after the chat
    messages ``history`` (the conversation of its ``previous_response_id``): ``instructions`` as a system message
    after the history, ``developer`` messages as system messages (chat
    templates know no developer role), function-call items as tool calls, their outputs as tool messages, function
    tools as chat functions; other tools (web search, namespaces, custom tools) are not offered to a chat backend.
    Raises ``ValueError`` when ``input`` is neither a string nor a list of items."""
    input_ = body.get("input")
    if not isinstance(input_, (str, list)):
        raise ValueError(f"input must be a string or a list of input items, got {type(input_).__name__}")
    messages = [
        {**message, "role": "system"} if message.get("role") == "developer" else message
        for message in [*history, *responses_input_to_messages(input_, body.get("instructions"))]
    ]
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    chat.update({key: body[key] for key in _SAME_FIELDS if body.get(key) is not None})
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    tools = [_function(tool) for tool in body.get("tools") or [] if isinstance(tool, dict) and _is_function(tool)]
    skipped = [
        str(tool.get("type")) for tool in body.get("tools") or [] if isinstance(tool, dict) and not _is_function(tool)
    ]
    if skipped:
        logger.debug("Responses tools not offered to the chat backend: %s", ", ".join(skipped))
    if tools:
        chat["tools"] = tools
        choice = body.get("tool_choice")
        if isinstance(choice, str) and choice in _TOOL_CHOICES:
            chat["tool_choice"] = choice
        elif isinstance(choice, dict) and choice.get("type") == "function":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        chat.pop("parallel_tool_calls", None)  # chat APIs refuse it without tools
    return chat


def _is_function(tool: dict[str, Any]) -> bool:
    return tool.get("type") == "function" and isinstance(tool.get("name"), str)


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses function tool (``name``, ``description``, ``parameters`` at the top) as a chat function tool."""
    function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def response_from_chat(chat: dict[str, Any], model: Any, response_id: str) -> dict[str, Any]:
    """The Responses ``response`` (id ``response_id``) a chat completion (first choice) answers: its reasoning
    (``reasoning`` or ``reasoning_content``) as a ``reasoning`` item with the text as ``reasoning_text`` content, its
    text as an output message, its tool calls as ``function_call`` items, ``incomplete`` when it stopped at its token
    limit."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if reasoning_text(message):
        output.append(
            {
                "type": "reasoning",
                "id": new_id("rs"),
                "status": "completed",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning_text(message)}],
            }
        )
    if message.get("content"):
        output.append(
            {
                "type": "message",
                "id": new_id("msg"),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
            }
        )
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append(
            {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments") or "{}",
                "status": "completed",
            }
        )
    created = int(chat.get("created") or time.time())
    name = model if isinstance(model, str) else chat.get("model")
    return _response(response_id, name, created, output, chat.get("usage") or {}, choice.get("finish_reason"))


def _response(
    response_id: str, model: Any, created: int, output: list[dict[str, Any]], usage: dict[str, Any], finish: Any
) -> dict[str, Any]:
    """A ``response`` object: ``output`` items, chat ``usage`` counts, ``incomplete`` for a ``length`` finish."""
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    incomplete = finish == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": prompt + completion,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


class ResponseStream:
    """Responses API stream events for a chat completion's stream, as its chunks arrive (:meth:`feed` each parsed
    chunk, then :meth:`close`): reasoning text (``reasoning``, as vLLM's reasoning parsers send it, or
    ``reasoning_content``) as a ``reasoning`` item with ``response.reasoning_text.delta`` events, text as an output
    message with ``response.output_text.delta`` events, each tool call
    as a ``function_call`` item with ``response.function_call_arguments.delta`` events, then ``response.completed``
    (``response.incomplete`` at the token limit) carrying the whole response."""

    def __init__(self, model: Any, response_id: str) -> None:
        self.model = model if isinstance(model, str) else None
        self.response_id = response_id
        self.created = int(time.time())
        self.sequence = 0
        self.started = False
        self.output: list[dict[str, Any]] = []  # output items, the last one open while ``self.open``
        self.open = False
        self.tool_index: Any = None  # the chat index of the open function call
        self.finish: Any = None
        self.usage: dict[str, Any] = {}

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events one chat chunk makes. The proxy sends them after feeding the other chunks of the same read, so
        they carry copies, not the items and parts that later deltas fill in."""
        events: list[dict[str, Any]] = []
        if not self.started:
            self.started = True
            self.model = self.model or chunk.get("model")
            pending = {**self._final(), "status": "in_progress", "output": [], "usage": None}
            events += [self._event("response.created", response=pending)]
            events += [self._event("response.in_progress", response=pending)]
        self.usage = chunk.get("usage") or self.usage
        choices = [choice for choice in chunk.get("choices") or [] if isinstance(choice, dict)]
        choice = next((choice for choice in choices if not choice.get("index")), None)
        if choice is None:
            return events
        self.finish = choice.get("finish_reason") or self.finish
        delta = choice.get("delta") or {}
        if reasoning_text(delta):
            events += self._text("reasoning", reasoning_text(delta))
        if delta.get("content"):
            events += self._text("message", delta["content"])
        for entry in delta.get("tool_calls") or []:
            function = entry.get("function") or {}
            calling = self.open and self.output[-1]["type"] == "function_call"
            call_id = self.output[-1]["call_id"] if calling else None
            known = calling and self.tool_index == entry.get("index") and entry.get("id") in (None, call_id)
            if not known:  # a new call (some servers repeat the id on every chunk of a call)
                call: dict[str, Any] = {
                    "type": "function_call",
                    "id": new_id("fc"),
                    "call_id": entry.get("id"),
                    "name": function.get("name"),
                    "arguments": "",
                    "status": "in_progress",
                }
                events += self._add(call)
                self.tool_index = entry.get("index")
            if function.get("arguments"):
                self.output[-1]["arguments"] += function["arguments"]
                events.append(
                    self._event("response.function_call_arguments.delta", **self._where(), delta=function["arguments"])
                )
        return events

    def close(self) -> list[dict[str, Any]]:
        """The events ending the response (after the upstream's last chunk)."""
        events = self._done()
        final = self._final()
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=final)]

    def _final(self) -> dict[str, Any]:
        return _response(self.response_id, self.model, self.created, self.output, self.usage, self.finish)

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        """The events adding ``text`` to the open item of type ``kind`` (``message`` or ``reasoning``: one content
        part, ``output_text`` or ``reasoning_text``), opening one when another item is open."""
        events: list[dict[str, Any]] = []
        if not (self.open and self.output[-1]["type"] == kind):
            item: dict[str, Any]
            part: dict[str, Any]
            if kind == "message":
                item = {"type": "message", "id": new_id("msg"), "status": "in_progress", "role": "assistant"}
                part = {"type": "output_text", "text": "", "annotations": []}
            else:
                item = {"type": "reasoning", "id": new_id("rs"), "status": "in_progress", "summary": []}
                part = {"type": "reasoning_text", "text": ""}
            events += self._add({**item, "content": []})
            events.append(self._event("response.content_part.added", **self._where(), content_index=0, part=dict(part)))
            self.output[-1]["content"] = [part]
        part = self.output[-1]["content"][0]
        part["text"] += text
        logprobs: dict[str, Any] = {"logprobs": []} if kind == "message" else {}  # output text only
        where = {**self._where(), "content_index": 0}
        return [*events, self._event(f"response.{part['type']}.delta", **where, delta=text, **logprobs)]

    def _add(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        """Close the open item, open ``item``."""
        events = self._done()
        self.output.append(item)
        self.open = True
        return [*events, self._event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item))]

    def _done(self) -> list[dict[str, Any]]:
        """The events closing the open item, marked completed."""
        if not self.open:
            return []
        self.open = False
        item, where = self.output[-1], self._where()
        item["status"] = "completed"
        events = []
        if item["type"] in ("message", "reasoning"):
            part = item["content"][0]
            events.append(self._event(f"response.{part['type']}.done", **where, content_index=0, text=part["text"]))
            events.append(self._event("response.content_part.done", **where, content_index=0, part=part))
        else:
            item["arguments"] = item["arguments"] or "{}"
            arguments = {"arguments": item["arguments"], "name": item["name"]}
            events.append(self._event("response.function_call_arguments.done", **where, **arguments))
        events.append(self._event("response.output_item.done", output_index=where["output_index"], item=item))
        return events

    def _where(self) -> dict[str, Any]:
        return {"output_index": len(self.output) - 1, "item_id": self.output[-1]["id"]}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}


def conversation(
    messages: Sequence[dict[str, Any]], output: dict[str, Any], instructions: bool = False
) -> list[dict[str, Any]]:
    """The chat messages a request with ``previous_response_id`` continues: the recorded call's input ``messages``
    (less the system message its ``instructions`` made: instructions do not carry over to the next response) and
    its answer (a recorded ``output``: content, tool calls, reasoning) as the assistant's message."""
    answer: dict[str, Any] = {"role": "assistant", "content": output.get("content")}
    if output.get("reasoning_content"):
        answer["reasoning_content"] = output["reasoning_content"]
    if output.get("tool_calls"):
        answer["tool_calls"] = list(output["tool_calls"])
    return [*messages[1 if instructions else 0 :], answer]
