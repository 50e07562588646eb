"""The OpenAI Responses API translated to and from chat completions, for a backend whose token ids come on chat
completions only (the HF backend serves nothing else): :func:`chat_request` turns a Responses request, after the
conversation of its ``previous_response_id``, into a chat request; :func:`response_from_chat` turns the chat answer
back into a ``response`` (streamed as :func:`agentlightning._wire.payloads.response_stream`); :func:`conversation`
is what a later request continuing that response starts from. The chat answer, with its token ids, is what is
recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from agentlightning._wire.messages import responses_input_to_messages
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
    """The Responses ``response`` (id ``response_id``) a chat completion (first choice) answers: its text as an
    output message, its tool calls as ``function_call`` items, ``incomplete`` when it stopped at its token limit."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
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
    usage = chat.get("usage") or {}
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    incomplete = choice.get("finish_reason") == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(chat.get("created") or time.time()),
        "model": model if isinstance(model, str) else chat.get("model"),
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


def conversation(
    messages: Sequence[dict[str, Any]], output: dict[str, Any], instructions: bool = False
) -> list[dict[str, Any]]:
    """The chat messages a request with ``previous_response_id`` continues: the recorded call's input ``messages``
    (less the system message its ``instructions`` made: instructions do not carry over to the next response) and
    its answer (a recorded ``output``: content and tool calls) as the assistant's message."""
    answer: dict[str, Any] = {"role": "assistant", "content": output.get("content")}
    if output.get("tool_calls"):
        answer["tool_calls"] = list(output["tool_calls"])
    return [*messages[1 if instructions else 0 :], answer]
