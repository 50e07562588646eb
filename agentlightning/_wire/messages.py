"""Chat messages: the text of a message, Responses API input and Anthropic messages as chat messages, objects as plain
data."""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic
import pydantic_core


def as_plain(value: Any) -> Any:
    """``value`` as plain JSON data (a copy, by pydantic-core): pydantic objects without their None fields, tuples as
    lists, classes by name, other values that JSON cannot hold as their ``repr``."""
    try:
        return _jsonable(value)
    except TypeError:
        # pydantic < 2.14 cannot serialise, inside another value, a model whose class has not been built yet (its
        # serializer is still a placeholder until the class is first used); the model's own model_dump builds it.
        return _jsonable(_models_dumped(value))


def _jsonable(value: Any) -> Any:
    return pydantic_core.to_jsonable_python(  # a class: e.g. response_format=SomeModel for .parse()
        value, exclude_none=True, fallback=lambda other: other.__name__ if isinstance(other, type) else repr(other)
    )


def _models_dumped(value: Any) -> Any:
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(exclude_none=True)
    if isinstance(value, dict):
        return {key: _models_dumped(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_models_dumped(item) for item in value]
    return value


_BASE64_DATA_URL = re.compile(r"data:[\w.+-]+/[\w.+-]+(;[\w.+-]+=[^;,]*)*;base64,")


def media_size(value: Any) -> int:
    """Characters of image and audio data inlined in a request body (plain JSON data): base64 ``data:`` URLs and base64
    ``data`` fields (Anthropic image sources, OpenAI ``input_audio``). A model reads such data as a few hundred tokens
    per image, not as text, so it says little about the size of the call's token ids."""
    if isinstance(value, str):
        return len(value) if _BASE64_DATA_URL.match(value) else 0
    if isinstance(value, list):
        return sum(media_size(item) for item in value)
    if not isinstance(value, dict):
        return 0
    data = value.get("data")
    if isinstance(data, str) and (value.get("type") == "base64" or "format" in value):
        return len(data) + sum(media_size(item) for key, item in value.items() if key != "data")
    return sum(media_size(item) for item in value.values())


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A chat ``tool_calls`` entry."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def message_text(content: Any) -> str:
    """The text of a chat message ``content`` (a string, None, or a list of content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [as_plain(part) for part in content]
        return "".join(
            str(part.get("text") or part.get("refusal") or "") if isinstance(part, dict) else str(part)
            for part in parts
        )
    return str(content)


# Several pieces of reasoning (thinking blocks, reasoning items or their parts: interleaved thinking) join with a blank
# line into one reasoning text, as a chat message has one.
_THINKING_SEPARATOR = "\n\n"


def reasoning_text(message: dict[str, Any]) -> str:
    """The reasoning text of a chat message or stream delta: ``reasoning`` (vLLM 0.31's reasoning parsers) or
    ``reasoning_content`` (older vLLM, SGLang, DeepSeek's API); '' when there is none."""
    return str(message.get("reasoning") or message.get("reasoning_content") or "")


def responses_input_to_messages(input_: Any, instructions: Any = None) -> list[dict[str, Any]]:
    """A Responses API ``input`` (string or item list) and ``instructions`` as chat messages.

    Function-call items become assistant ``tool_calls`` (of the assistant message just before them, the turn they
    were generated in), function-call outputs ``tool`` messages; reasoning items become the ``reasoning_content`` of
    the assistant message after them (see :func:`reasoning_item_text`; not sent when a user or tool message comes
    first); other item kinds (web search, ...) are skipped.
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": message_text(as_plain(instructions))})
    if isinstance(input_, str):
        return [*messages, {"role": "user", "content": input_}]
    reasoning: list[str] = []  # the text of the reasoning items since the last message
    for item in as_plain(input_) or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "reasoning":
            reasoning += [text] if (text := reasoning_item_text(item)) else []
            continue
        if kind == "function_call":
            call = tool_call(item.get("call_id"), item.get("name"), item.get("arguments"))
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": str(item.get("output"))})
        elif kind == "message" or "role" in item:
            messages.append({"role": item.get("role", "user"), "content": message_text(item.get("content"))})
        else:
            continue
        if reasoning and messages[-1]["role"] == "assistant":  # interleaved: joined to the turn's earlier reasoning
            earlier = [messages[-1]["reasoning_content"]] if messages[-1].get("reasoning_content") else []
            messages[-1]["reasoning_content"] = _THINKING_SEPARATOR.join([*earlier, *reasoning])
        reasoning = []
    return messages


def reasoning_item_text(item: dict[str, Any]) -> str:
    """The text of a Responses reasoning item: its ``content`` (the model's own reasoning, ``reasoning_text``
    parts, as open-weight models and this proxy's translation give it), else its ``summary`` (OpenAI's models give
    only a summary); parts joined by a blank line. '' for an item with neither (``encrypted_content`` only)."""
    parts = [part for part in item.get("content") or [] if isinstance(part, dict)]
    parts = parts or [part for part in item.get("summary") or [] if isinstance(part, dict)]
    return _THINKING_SEPARATOR.join(str(part["text"]) for part in parts if part.get("text"))


# Assistant blocks that carry the model's reasoning.
_THINKING_BLOCKS = ("thinking", "redacted_thinking")


def anthropic_to_messages(messages: Any, system: Any = None) -> list[dict[str, Any]]:
    """Anthropic Messages API ``messages`` and ``system`` as chat messages: ``tool_use`` blocks become assistant
    ``tool_calls``, ``tool_result`` blocks ``tool`` messages, ``thinking`` blocks the assistant's
    ``reasoning_content`` (the field OpenAI-compatible reasoning servers read; vLLM renames it ``reasoning``) with the
    blocks as sent, signatures and ``redacted_thinking`` included, under ``thinking_blocks`` (LiteLLM's name for
    them); other blocks (images, documents, ...) are skipped."""
    chat: list[dict[str, Any]] = [{"role": "system", "content": message_text(as_plain(system))}] if system else []
    for message in as_plain(messages) or []:
        if not isinstance(message, dict):
            continue
        role, content = message.get("role", "user"), message.get("content")
        blocks = [block for block in content if isinstance(block, dict)] if isinstance(content, list) else []
        if not blocks:
            chat.append({"role": role, "content": message_text(content)})
            continue
        chat.extend(
            {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": message_text(block.get("content"))}
            for block in blocks
            if block.get("type") == "tool_result"
        )
        texts = [block.get("text") or "" for block in blocks if block.get("type") == "text"]
        calls = [
            tool_call(block.get("id"), block.get("name"), json.dumps(block.get("input") or {}))
            for block in blocks
            if block.get("type") == "tool_use"
        ]
        thinking = [block for block in blocks if block.get("type") in _THINKING_BLOCKS] if role == "assistant" else []
        if texts or calls or thinking:
            chat.append({"role": role, "content": "".join(texts) if texts else None})
            if thinking:
                reasoning = [str(block.get("thinking") or "") for block in thinking if block.get("type") == "thinking"]
                chat[-1]["reasoning_content"] = _THINKING_SEPARATOR.join(reasoning)
                chat[-1]["thinking_blocks"] = thinking
            if calls:
                chat[-1]["tool_calls"] = calls
    return chat
