"""What the mock server receives (:class:`MockRequest`) and what it is told to answer (:class:`MockReply`)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentlightning._wire.messages import message_text
from agentlightning._wire.read import request_fields
from agentlightning.testing._tokenizer import render_tool_calls

_APIS = {"/chat/completions": "chat.completions", "/messages": "messages", "/responses": "responses"}


@dataclass
class MockToolCall:
    """A tool call the mock model makes: ``MockToolCall(name="add", arguments={"a": 1, "b": 2})``."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        """The arguments as the JSON string the OpenAI API carries."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)

    def call_id(self) -> str:
        """The tool call id (generated once when not given)."""
        if self.id is None:
            self.id = "call_" + uuid.uuid4().hex[:24]
        return self.id


@dataclass
class MockReply:
    """How the mock server answers one request.

    - ``content`` / ``tool_calls``: the assistant message (both may be given);
    - ``finish_reason``: defaults to 'tool_calls' when there are tool calls, else 'stop';
    - ``latency``: seconds to wait before answering (streams wait before the first chunk);
    - ``status`` / ``error_message``: a status >= 400 answers with an OpenAI-style error body instead;
    - ``hang``: never answer (until the server stops), to exercise client timeouts.
    """

    content: str | None = None
    tool_calls: list[MockToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    latency: float = 0.0
    status: int = 200
    error_message: str | None = None
    hang: bool = False

    def resolved_finish_reason(self) -> str:
        """The finish reason to report."""
        return self.finish_reason if self.finish_reason is not None else "tool_calls" if self.tool_calls else "stop"

    def openai_tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls as the chat API carries them."""
        return [{"id": call.call_id(), "type": "function",
                 "function": {"name": call.name, "arguments": call.arguments_json()}} for call in self.tool_calls]

    def completion_text(self) -> str:
        """The text the completion's token ids stand for: content, then the rendered tool calls."""
        return (self.content or "") + render_tool_calls(self.openai_tool_calls())


@dataclass
class MockRequest:
    """One request the mock server received."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    received_at: float = field(default_factory=time.time)

    @property
    def model(self) -> str | None:
        """The ``model`` field of the request."""
        return self.body.get("model")

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The tool schemas offered, as sent."""
        return self.body.get("tools")

    @property
    def stream(self) -> bool:
        """Whether the client asked for a stream."""
        return bool(self.body.get("stream"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The input as chat messages: chat messages as sent, Responses ``input`` / ``instructions`` or Anthropic
        ``messages`` / ``system`` converted, or a legacy completions ``prompt`` as one user message."""
        api = next((api for path, api in _APIS.items() if self.path.endswith(path)), "completions")
        if api != "completions":
            return list(request_fields(api, self.body)["input"] or [])
        prompt = self.body.get("prompt")
        if isinstance(prompt, list):
            prompt = "".join(str(p) for p in prompt)
        return [{"role": "user", "content": prompt or ""}]

    @property
    def last_user_text(self) -> str:
        """Text of the last user message ('' when there is none)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return message_text(message.get("content"))
        return ""

