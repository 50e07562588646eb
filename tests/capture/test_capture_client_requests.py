"""Capture of the requests the openai client sends below its resource methods (``client.post``, ``client.request``,
as LiteLLM sends them), against the mock server: each HTTP request to a chat / completions / responses endpoint is
recorded exactly once, whichever method sent it, with the resource-method calls of the same rollout."""

from __future__ import annotations

import importlib

import openai
import pytest
from openai._models import FinalRequestOptions
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import agentlightning as agl
from agentlightning.capture._context import RolloutRecorder, recording
from agentlightning.testing import MockLLMServer, MockReply, MockToolCall, render_chat_prompt

MESSAGES = [{"role": "system", "content": "You write SQL."}, {"role": "user", "content": "count users"}]
TOOLS = [{"type": "function", "function": {"name": "run_sql", "parameters": {"type": "object"}}}]
# The HTTP library under the installed openai client: httpx2 for openai 3, httpx for openai 2.
http = importlib.import_module(openai.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0])


@pytest.fixture(autouse=True)
def _instrumented() -> None:
    agl.instrument("openai")
    agl.instrument(http.__name__)


@pytest.fixture
def server() -> MockLLMServer:
    with MockLLMServer(token_ids=True) as srv:
        yield srv


def sync_client(server: MockLLMServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def async_client(server: MockLLMServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def body(**extra: object) -> dict:
    return {"model": "qwen", "messages": MESSAGES, "tools": TOOLS, **extra}


def test_client_post_with_tools_is_recorded_with_token_ids(server: MockLLMServer) -> None:
    server.set_replies([MockReply(content="let me", tool_calls=[MockToolCall("run_sql", {"q": "SELECT 1"})])])
    recorder = RolloutRecorder("ro-post")
    with recording(recorder), agl.role("writer"):
        answer = sync_client(server).post("/chat/completions", body=body(temperature=0.2), cast_to=ChatCompletion)
    (call,) = recorder.calls
    tool_call = answer.choices[0].message.tool_calls[0]
    assert (call.role, call.name, call.status, call.rollout_id) == ("writer", "qwen", "ok", "ro-post")
    assert call.input == MESSAGES and call.tools == TOOLS
    assert call.output["content"] == "let me" and call.output["finish_reason"] == "tool_calls"
    assert call.output["tool_calls"] == [
        {"id": tool_call.id, "type": "function", "function": {"name": "run_sql", "arguments": '{"q": "SELECT 1"}'}}
    ]
    assert call.prompt_token_ids == server.tokenizer.encode(render_chat_prompt(MESSAGES, TOOLS))
    assert call.completion_token_ids == answer.choices[0].model_extra["token_ids"]
    assert call.metadata["endpoint"] == server.base_url and call.metadata["api"] == "chat.completions"
    assert server.requests[0].headers.get("x-agl-role") == "writer"  # the proxy serves it by the role's policy


def test_client_post_stream_read_through_and_left_early(server: MockLLMServer) -> None:
    server.set_replies(["one two three", "a b c d e f"])
    client = sync_client(server)
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        stream = client.post(
            "/chat/completions",
            body=body(stream=True),
            cast_to=ChatCompletion,
            stream=True,
            stream_cls=openai.Stream[ChatCompletionChunk],
        )
        assert recorder.calls == []  # nothing read yet
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        early = client.post(
            "/chat/completions",
            body=body(stream=True),
            cast_to=ChatCompletion,
            stream=True,
            stream_cls=openai.Stream[ChatCompletionChunk],
        )
        next(iter(early))
        early.close()
    full, left = recorder.calls
    assert text == full.output["content"] == "one two three" and full.output["finish_reason"] == "stop"
    assert full.metadata["stream"] is True
    assert full.completion_token_ids == server.tokenizer.encode("one two three")
    assert left.output["finish_reason"] == "incomplete_stream" and left.status == "ok"
    assert len(server.requests) == 2


def test_client_request_and_legacy_completions(server: MockLLMServer) -> None:
    client = sync_client(server)
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        options = FinalRequestOptions.construct(method="post", url="/chat/completions", json_data=body())
        chat = client.request(ChatCompletion, options)
        legacy = client.post("/completions", body={"model": "qwen", "prompt": "SELECT"}, cast_to=Completion)
    chat_call, legacy_call = recorder.calls
    assert chat_call.output["content"] == chat.choices[0].message.content == "echo: count users"
    assert legacy_call.metadata["api"] == "completions" and legacy_call.output["content"] == legacy.choices[0].text


def test_every_request_of_a_mixed_rollout_is_recorded_once(server: MockLLMServer) -> None:
    """``create``, ``with_raw_response``, ``with_streaming_response``, a stream and ``client.post`` in one rollout:
    the calls recorded are the requests the server served, one each."""
    client = sync_client(server)
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        client.chat.completions.create(model="qwen", messages=MESSAGES, tools=TOOLS)
        client.post("/chat/completions", body=body(), cast_to=ChatCompletion)
        client.chat.completions.with_raw_response.create(model="qwen", messages=MESSAGES).parse()
        with client.chat.completions.with_streaming_response.create(model="qwen", messages=MESSAGES) as response:
            response.parse()
        list(client.chat.completions.create(model="qwen", messages=MESSAGES, stream=True))
        client.responses.create(model="qwen", input="hello")
    apis = [(c.metadata["api"], c.metadata["stream"]) for c in recorder.calls]
    assert apis == [
        ("chat.completions", False),
        ("chat.completions", False),
        ("chat.completions", False),
        ("chat.completions", False),
        ("chat.completions", True),
        ("responses", False),
    ]
    assert len(server.requests) == len(recorder.calls)
    assert recorder.unfinished_endpoints() == set()


async def test_async_client_post_streamed_and_not(server: MockLLMServer) -> None:
    server.set_replies(["async words", "more async words", "resource call"])
    client = async_client(server)
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        plain = await client.post("/chat/completions", body=body(), cast_to=ChatCompletion)
        stream = await client.post(
            "/chat/completions",
            body=body(stream=True),
            cast_to=ChatCompletion,
            stream=True,
            stream_cls=openai.AsyncStream[ChatCompletionChunk],
        )
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        await client.chat.completions.create(model="qwen", messages=MESSAGES)
    await client.close()
    posted, streamed, created = recorder.calls
    assert posted.output["content"] == plain.choices[0].message.content == "async words"
    assert streamed.output["content"] == "".join(pieces) == "more async words"
    assert created.output["content"] == "resource call"
    assert len(server.requests) == 3


def test_outside_a_rollout_nothing_is_recorded(server: MockLLMServer) -> None:
    sync_client(server).post("/chat/completions", body=body(), cast_to=ChatCompletion)
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        pass
    assert recorder.calls == [] and len(server.requests) == 1


@pytest.mark.parametrize("library", ["httpx", http.__name__])
def test_a_body_streamed_from_an_iterator_is_sent_untouched_in_a_rollout_and_outside(
    server: MockLLMServer, library: str
) -> None:
    """Capture reads a request's body to record it; one streamed from an iterator only the transport may read
    (httpx raised RequestNotRead from inside the patched ``send``, failing the user's upload)."""
    module = importlib.import_module(library)
    agl.instrument(library)
    chunks = [b'{"model": "qwen", ', b'"messages": [{"role": "user", "content": "hi"}]}']
    recorder = RolloutRecorder("ro")
    with module.Client(base_url=server.base_url) as client:
        outside = client.post("/chat/completions", content=iter(chunks))
        with recording(recorder):
            inside = client.post("/chat/completions", content=iter(chunks))
    assert outside.status_code == inside.status_code == 200
    assert [request.last_user_text for request in server.requests] == ["hi", "hi"]
    assert recorder.calls == []  # a streamed body is not read, so not recorded
