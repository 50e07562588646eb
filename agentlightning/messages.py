"""Chat-message helpers shared by capture and the mock server: text of a message, Responses input as messages."""

from __future__ import annotations

from typing import Any


def message_text(content: Any) -> str:
    """The text of a chat message ``content`` (a string, None, or a list of content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text") or part.get("refusal") or ""))
            else:
                parts.append(str(getattr(part, "text", None) or part))
        return "".join(parts)
    return str(content)


def as_plain(value: Any) -> Any:
    """A pydantic object (e.g. a message the agent passed back from a response) as a plain dict; others as is."""
    dump = getattr(value, "model_dump", None)
    if dump is not None:
        try:
            return dump(exclude_none=True)
        except TypeError:
            return dump()
    return value


def responses_input_to_messages(input_: Any, instructions: Any = None) -> list[dict[str, Any]]:
    """Normalise a Responses API ``input`` (string or item list) and ``instructions`` to chat messages.

    Function-call items become assistant ``tool_calls``; function-call outputs become ``tool`` messages; other
    item kinds (reasoning, web search, ...) are skipped.
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": message_text(as_plain(instructions))})
    if input_ is None:
        return messages
    if isinstance(input_, str):
        messages.append({"role": "user", "content": input_})
        return messages
    for raw in input_:
        item = as_plain(raw)
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message" or ("role" in item and kind not in ("function_call", "function_call_output")):
            messages.append({"role": item.get("role", "user"), "content": message_text(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": str(item.get("output"))})
    return messages
