"""A local OpenAI-compatible mock server for testing agents without a model."""

from agentlightning.testing._replies import MockReply, MockRequest, MockToolCall
from agentlightning.testing._server import MockLLMServer, echo_handler
from agentlightning.testing._tokenizer import MockTokenizer, render_chat_prompt

__all__ = ["MockLLMServer", "MockReply", "MockRequest", "MockTokenizer", "MockToolCall", "echo_handler",
           "render_chat_prompt"]
