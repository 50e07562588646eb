"""The mock server's deterministic byte-level tokenizer (one token per UTF-8 byte, id = byte + 3; ids 0-2 are pad,
bos, eos: tests can predict every token id) and its prompt template."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentlightning._wire.messages import message_text

BYTE_OFFSET = 3


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
