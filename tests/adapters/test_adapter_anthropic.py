"""Capture of the anthropic client's Messages API, written the way Anthropic's docs write a tool-use loop and a
streamed reply, against the mock server's /v1/messages route (token ids on, as a vLLM-like server would send them)."""

from __future__ import annotations

import anthropic
import pytest
import wrapt
from adapter_support import timeline

import agentlightning as agl
from agentlightning.testing import MockReply, MockRequest, MockToolCall

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a given location",
    "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
}


def weather_model(request: MockRequest) -> MockReply:
    last = request.messages[-1]
    if last["role"] == "tool":
        return MockReply(content=f"It is {last['content']} in Paris.")
    if request.tools:
        return MockReply(content="Let me check.", tool_calls=[MockToolCall("get_weather", {"location": "Paris"})])
    if request.last_user_text == "please fail":
        return MockReply(status=429, error_message="slow down")
    return MockReply(content=f"A long story about {request.last_user_text}, told slowly")


def get_weather(location: str) -> str:
    return "sunny" if location == "Paris" else "unknown"


@agl.rollout(roles=["forecaster"])
def weather_agent(task: dict, llm: agl.LLM) -> float:
    client = anthropic.Anthropic(base_url=llm.base_url.removesuffix("/v1"), api_key=llm.api_key)
    messages = [{"role": "user", "content": task["question"]}]
    with agl.role("forecaster"):
        response = client.messages.create(model=llm.model, max_tokens=1024, tools=[WEATHER_TOOL], messages=messages)
        while response.stop_reason == "tool_use":
            tool_use = next(block for block in response.content if block.type == "tool_use")
            messages += [
                {"role": "assistant", "content": response.content},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": tool_use.id, "content": get_weather(**tool_use.input)}
                    ],
                },
            ]
            response = client.messages.create(model=llm.model, max_tokens=1024, tools=[WEATHER_TOOL], messages=messages)
    with client.messages.stream(
        model=llm.model, max_tokens=1024, system="You tell stories.", messages=[{"role": "user", "content": "a cat"}]
    ) as stream:
        story = "".join(stream.text_stream)
    try:
        client.messages.create(model=llm.model, max_tokens=10, messages=[{"role": "user", "content": "please fail"}])
    except anthropic.RateLimitError:
        pass
    return float(response.content[0].text == "It is sunny in Paris." and story.startswith("A long story"))


def test_tool_use_loop_and_stream_helper_are_captured(serve) -> None:
    server, model = serve(weather_model)
    (rollout,) = agl.run(weather_agent, [{"id": 1, "question": "What is the weather in Paris?"}], llm=server.llm())
    assert rollout.status == "succeeded" and rollout.final_reward == 1.0, rollout.error
    assert timeline(rollout) == [
        ("llm", "forecaster", "ok"),
        ("llm", "forecaster", "ok"),
        ("llm", None, "ok"),
        ("llm", None, "error"),
    ]
    assert len(rollout.llm_calls) == 4 and len(server.requests) == 4 + 2  # the client retried the 429 twice
    asked, answered, story, failed = rollout.llm_calls
    assert asked.metadata["api"] == "messages" and asked.metadata["endpoint"] == server.url
    assert asked.tools == [WEATHER_TOOL] and asked.metadata["sampling"] == {"max_tokens": 1024}
    (tool_call,) = asked.output["tool_calls"]
    assert asked.output["finish_reason"] == "tool_use" and tool_call["function"] == {
        "name": "get_weather",
        "arguments": '{"location": "Paris"}',
    }
    assert answered.input[-2:] == [
        {"role": "assistant", "content": "Let me check.", "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": tool_call["id"], "content": "sunny"},
    ]
    assert answered.output["content"] == "It is sunny in Paris." and answered.output["finish_reason"] == "end_turn"
    assert story.metadata["stream"] is True and story.input[0] == {"role": "system", "content": "You tell stories."}
    assert story.output["content"] == "A long story about a cat, told slowly"
    assert story.metadata["usage"]["output_tokens"] == len(story.completion_token_ids)
    for call in (asked, answered, story):
        model.assert_server_token_ids(call)
        assert call.completion_logprobs is None  # the Messages API has no logprobs
    assert failed.error.startswith("RateLimitError") and failed.metadata["http_status"] == 429
    assert [t.role for t in agl.transitions([rollout], roles=["forecaster"])] == ["forecaster"] * 2


async def test_async_client_streams_are_captured_and_a_stream_left_early_is_recorded(serve) -> None:
    server, model = serve(weather_model)

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        client = anthropic.AsyncAnthropic(base_url=llm.base_url.removesuffix("/v1"), api_key=llm.api_key)
        question = [{"role": "user", "content": "a dog"}]
        text = []
        async for event in await client.messages.create(model=llm.model, max_tokens=64, messages=question, stream=True):
            if event.type == "content_block_delta":
                text.append(event.delta.text)
        async with client.messages.stream(model=llm.model, max_tokens=64, messages=question) as stream:
            async for _ in stream.text_stream:
                break  # left early: recorded as incomplete when the block closes the stream
        message = await client.messages.create(model=llm.model, max_tokens=64, messages=question)
        return float("".join(text) == message.content[0].text)

    (rollout,) = await agl.arun(agent, [{"id": 1}], llm=server.llm())
    assert rollout.final_reward == 1.0 and timeline(rollout) == [("llm", None, "ok")] * 3
    assert len(rollout.llm_calls) == len(server.requests) == 3
    streamed, left, whole = rollout.llm_calls
    assert streamed.output == whole.output and streamed.output["finish_reason"] == "end_turn"
    assert left.output["finish_reason"] == "incomplete_stream"
    model.assert_server_token_ids(streamed)
    model.assert_server_token_ids(whole)
    model.assert_server_token_ids(left, partial=True)


def test_instrument_and_uninstrument_anthropic() -> None:
    from agentlightning.adapters import anthropic as adapter
    from anthropic.resources.messages.messages import Messages

    agl.instrument("anthropic")
    assert adapter.is_installed() and isinstance(Messages.__dict__["create"], wrapt.FunctionWrapper)
    agl.uninstrument("anthropic")
    assert not adapter.is_installed() and not isinstance(Messages.__dict__["create"], wrapt.FunctionWrapper)
    agl.instrument("anthropic")
    with pytest.raises(ValueError, match="unknown adapter"):
        agl.instrument("claude")
