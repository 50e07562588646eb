"""LiteLLM agents against the mock server: ``litellm.completion`` / ``acompletion`` with an ``openai/...`` model send
through the openai client's ``client.post``, below its resource methods; every call is captured once, with role,
messages, tool calls, the server's token ids and LiteLLM's model string, streamed (read to the end or left early)
or not. Without the litellm adapter the calls are captured all the same, without LiteLLM's model string."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM would fetch its price list at import
litellm = pytest.importorskip("litellm")

import agentlightning as agl  # noqa: E402
from agentlightning.capture._context import RolloutRecorder, recording  # noqa: E402
from agentlightning.testing import MockLLMServer, MockReply, MockToolCall, render_chat_prompt  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(autouse=True)
def _instrumented() -> None:
    agl.instrument("litellm")
    agl.instrument("openai")
    for http in ("httpx", "httpx2"):
        try:
            agl.instrument(http)
        except ImportError:  # only the HTTP library under the installed openai client is needed
            pass


@pytest.fixture
def server() -> MockLLMServer:
    with MockLLMServer(token_ids=True) as srv:
        yield srv


def test_tool_loop_with_completion_is_captured_call_by_call(server: MockLLMServer) -> None:
    """LiteLLM's function-calling loop from its docs: ask, run the tool, send its result back."""
    server.set_replies(
        [MockReply(tool_calls=[MockToolCall("get_weather", {"city": "Paris"})]), "It is sunny in Paris."]
    )
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    options = {"model": "openai/qwen", "api_base": server.base_url, "api_key": "x", "tools": [WEATHER]}
    recorder = RolloutRecorder("ro-litellm")
    with recording(recorder), agl.role("forecaster"):
        first = litellm.completion(messages=messages, **options)
        tool_call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": tool_call.id, "content": "sunny"},
        ]
        final = litellm.completion(messages=messages, **options)
    asked, answered = recorder.calls
    assert len(server.requests) == 2
    assert (asked.role, asked.name, asked.rollout_id) == ("forecaster", "qwen", "ro-litellm")
    assert asked.metadata["litellm_model"] == answered.metadata["litellm_model"] == "openai/qwen"  # LiteLLM's name
    assert asked.input == messages[:1] and asked.tools == [WEATHER]
    assert asked.output["finish_reason"] == "tool_calls"
    assert asked.output["tool_calls"] == [
        {"id": tool_call.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    assert asked.prompt_token_ids == server.tokenizer.encode(render_chat_prompt(messages[:1], [WEATHER]))
    assert answered.output["content"] == final.choices[0].message.content == "It is sunny in Paris."
    assert answered.input[-1] == {"role": "tool", "tool_call_id": tool_call.id, "content": "sunny"}
    assert answered.completion_token_ids == server.tokenizer.encode("It is sunny in Paris.")


def test_stream_read_to_the_end(server: MockLLMServer) -> None:
    server.set_replies(["one two three"])
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        response = litellm.completion(
            model="openai/qwen",
            api_base=server.base_url,
            api_key="x",
            messages=[{"role": "user", "content": "count"}],
            stream=True,
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in response)
    (call,) = recorder.calls
    assert text == call.output["content"] == "one two three" and call.metadata["stream"] is True
    assert call.completion_token_ids == server.tokenizer.encode("one two three")


async def test_acompletion_with_tools_and_a_stream_left_early(server: MockLLMServer) -> None:
    server.set_replies([MockReply(tool_calls=[MockToolCall("get_weather", {"city": "Oslo"})]), "a b c d e f"])
    options = {"model": "openai/qwen", "api_base": server.base_url, "api_key": "x"}
    recorder = RolloutRecorder("ro")
    with recording(recorder), agl.role("planner"):
        first = await litellm.acompletion(
            messages=[{"role": "user", "content": "weather in Oslo?"}], tools=[WEATHER], **options
        )
        stream = await litellm.acompletion(messages=[{"role": "user", "content": "spell"}], stream=True, **options)
        async for chunk in stream:
            if chunk.choices[0].delta.content:
                break
        await stream.aclose()
    tools_call, streamed = recorder.calls
    assert len(server.requests) == 2
    assert tools_call.role == streamed.role == "planner"
    assert tools_call.metadata["litellm_model"] == streamed.metadata["litellm_model"] == "openai/qwen"
    assert tools_call.output["tool_calls"][0]["id"] == first.choices[0].message.tool_calls[0].id
    assert streamed.output["content"] == "a" and streamed.output["finish_reason"] == "incomplete_stream"


def test_without_the_litellm_adapter_calls_are_captured_without_its_model_string(server: MockLLMServer) -> None:
    server.set_replies(["plain"])
    agl.uninstrument("litellm")
    recorder = RolloutRecorder("ro")
    with recording(recorder):
        litellm.completion(
            model="openai/qwen", api_base=server.base_url, api_key="x", messages=[{"role": "user", "content": "hi"}]
        )
    (call,) = recorder.calls
    assert call.output["content"] == "plain" and "litellm_model" not in call.metadata
