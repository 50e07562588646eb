"""A local OpenAI-compatible mock server for testing agents without a model."""

from agentlightning.testing._replies import MockReply, MockRequest, MockTokenizer, MockToolCall, render_chat_prompt
from agentlightning.testing._server import MockLLMServer, echo_handler

__all__ = [
    "MockLLMServer",
    "MockReply",
    "MockRequest",
    "MockTokenizer",
    "MockToolCall",
    "echo_handler",
    "render_chat_prompt",
]
