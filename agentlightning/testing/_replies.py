"""What the mock server receives (:class:`MockRequest`), what it is told to answer (:class:`MockReply`), and how it
counts tokens: a deterministic byte-level tokenizer (one token per UTF-8 byte, id = byte + 3; ids 0-2 are pad, bos,
eos: tests can predict every token id) and its prompt template."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentlightning._wire.messages import message_text, tool_call
from agentlightning._wire.read import request_fields

BYTE_OFFSET = 3
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
    - ``reasoning``: reasoning text before them, sent as vLLM's reasoning parsers send it (the chat message's and
      stream deltas' ``reasoning``); its tokens come first in the completion's token ids;
    - ``finish_reason``: defaults to 'tool_calls' when there are tool calls, else 'stop';
    - ``latency``: seconds to wait before answering (streams wait before the first chunk);
    - ``status`` / ``error_message``: a status >= 400 answers with an OpenAI-style error body instead;
    - ``hang``: never answer (until the client closes its connection or the server stops), to exercise client
      timeouts; :attr:`MockLLMServer.hanging` counts the requests hanging now.
    """

    content: str | None = None
    tool_calls: list[MockToolCall] = field(default_factory=list)
    reasoning: str | None = None
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
        return [tool_call(call.call_id(), call.name, call.arguments_json()) for call in self.tool_calls]

    def completion_text(self) -> str:
        """The text the completion's token ids stand for: reasoning, content, then the rendered tool calls."""
        return (self.reasoning or "") + (self.content or "") + render_tool_calls(self.openai_tool_calls())


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


class MockTokenizer:
    """Byte-level tokenizer: ``encode(text) -> list[int]``, ``decode(ids) -> str``, fake logprobs."""

    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    vocab_size = 256 + BYTE_OFFSET

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (one per UTF-8 byte)."""
        return [byte + BYTE_OFFSET for byte in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special ids are skipped, broken UTF-8 is replaced."""
        return bytes(i - BYTE_OFFSET for i in ids if i >= BYTE_OFFSET).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        """A printable form of one token: the character, or ``bytes:\\xNN`` for a partial UTF-8 byte (as vLLM)."""
        raw = bytes([token_id - BYTE_OFFSET]) if token_id >= BYTE_OFFSET else b""  # special tokens: no text
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    @staticmethod
    def logprob(token_id: int) -> float:
        """The log-probability the mock 'model' assigns to ``token_id`` (deterministic, in [-0.85, -0.05])."""
        return -((token_id % 17) + 1) / 20


def render_tool_calls(tool_calls: Sequence[dict[str, Any]]) -> str:
    """The text a tool-calling completion stands for: one ``<tool_call>{json}</tool_call>`` per call."""
    rendered = []
    for call in tool_calls:
        function = call.get("function", call)
        payload = json.dumps({"name": function.get("name"), "arguments": function.get("arguments")}, sort_keys=True)
        rendered.append(f"<tool_call>{payload}</tool_call>")
    return "".join(rendered)


def render_chat_prompt(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> str:
    """The prompt text the mock server 'tokenizes' for chat messages (a ChatML-like template).

    ``<|tools|>`` lists the offered tool schemas as JSON; each message becomes ``<|role|>\\ntext\\n``; the prompt
    ends with the generation prompt ``<|assistant|>\\n``.
    """
    text = ""
    if tools:
        text += "<|tools|>\n" + json.dumps(list(tools), sort_keys=True) + "\n"
    for message in messages:
        body = message_text(message.get("content"))
        if message.get("tool_calls"):
            body += render_tool_calls(message["tool_calls"])
        text += f"<|{message.get('role', 'user')}|>\n{body}\n"
    return text + "<|assistant|>\n"
