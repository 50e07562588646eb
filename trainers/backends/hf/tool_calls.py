"""Parse Hermes-style ``<tool_call>{json}</tool_call>`` blocks out of generated text into OpenAI tool calls."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split ``text`` into ``(content, tool_calls)``.

    Each well-formed block (a JSON object with a string ``name`` and object ``arguments``) becomes
    ``{"id", "type": "function", "function": {"name", "arguments": <json string>}}``; a block that does not parse
    stays in the content so the agent (and its reward) sees exactly what the model wrote. ``content`` is None when
    nothing but tool calls was generated.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        call = _to_call(match.group(1))
        if call is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    content = "".join(kept).strip() if calls else text
    return (content or None) if calls else content, calls


def _to_call(body: str) -> dict[str, Any] | None:
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": payload["name"], "arguments": json.dumps(arguments)},
    }
