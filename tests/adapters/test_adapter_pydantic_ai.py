"""PydanticAI adapter: real ``Agent`` objects (tools, ``ModelRetry``, agent delegation, ``run_stream``) against the
mock server, through ``@agl.rollout``."""

from __future__ import annotations

import asyncio

import pytest
from adapter_support import timeline
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import agentlightning as agl
from agentlightning.testing import MockReply, MockRequest, MockToolCall


@pytest.fixture(autouse=True)
def instrumented() -> None:
    agl.instrument("pydantic_ai")


def model_for(llm: agl.LLM) -> OpenAIChatModel:
    return OpenAIChatModel(llm.model, provider=OpenAIProvider(base_url=llm.base_url, api_key=llm.api_key))


def system_text(request: MockRequest) -> str:
    return str(request.messages[0].get("content")) if request.messages else ""


def tool_results(request: MockRequest) -> list[dict]:
    return [m for m in request.messages if m["role"] == "tool"]


def delegation_rule(request: MockRequest) -> MockReply:
    """The joke selector (the docs' agent-delegation example) asks its tool for jokes, which runs the generator
    agent; the selector then calls ``pick`` with a bad index (ModelRetry), a good one, and answers."""
    system = system_text(request)
    if system.startswith("You generate jokes"):
        return MockReply(content="joke one\njoke two")
    results = tool_results(request)
    if not results:
        return MockReply(tool_calls=[MockToolCall(name="joke_factory", arguments={"count": 2})])
    if len(results) == 1:
        return MockReply(tool_calls=[MockToolCall(name="pick", arguments={"index": 7})])
    if len(results) == 2:
        return MockReply(tool_calls=[MockToolCall(name="pick", arguments={"index": 1})])
    return MockReply(content="joke two")


def selector_agents(llm: agl.LLM) -> Agent:
    model = model_for(llm)
    generator = Agent(model, name="joke_generator", system_prompt="You generate jokes.")
    selector = Agent(model, name="joke_selector", system_prompt="You pick the best joke.")

    @selector.tool
    async def joke_factory(ctx: RunContext[None], count: int) -> list[str]:
        """Generate ``count`` jokes."""
        result = await generator.run(f"Please generate {count} jokes.", usage=ctx.usage)
        return result.output.splitlines()

    @selector.tool_plain
    def pick(index: int) -> str:
        """Pick the joke at ``index``."""
        jokes = ["joke one", "joke two"]
        if index >= len(jokes):
            raise ModelRetry(f"index {index} is out of range, pick 0 or 1")
        return jokes[index]

    return selector


DELEGATION_TIMELINE = [
    ("llm", "joke_selector", "ok"),
    ("tool", "joke_selector:joke_factory", "ok"),  # calls are ordered by start: the tool starts the generator
    ("llm", "joke_generator", "ok"),
    ("llm", "joke_selector", "ok"),
    ("tool", "joke_selector:pick", "error"),
    ("llm", "joke_selector", "ok"),
    ("tool", "joke_selector:pick", "ok"),
    ("llm", "joke_selector", "ok"),
]


async def test_delegation_tools_and_retry_attributed_to_each_agent(serve) -> None:
    server, model = serve(delegation_rule)

    @agl.rollout(reward=lambda task, out: float(out == "joke two"))
    async def agent(task: dict, llm: agl.LLM) -> str:
        result = await selector_agents(llm).run(task["prompt"])
        return result.output

    rollout = await agent.aexecute({"prompt": "Tell me a joke."}, server.llm())
    assert timeline(rollout) == DELEGATION_TIMELINE
    assert rollout.final_reward == 1.0
    assert len(rollout.llm_calls) == len(model.served) == 5
    first, factory, _, second, bad_pick, third, good_pick, _ = rollout.calls
    assert factory.input == {"count": 2} and factory.output == ["joke one", "joke two"]
    assert factory.parent_call_id == first.call_id
    assert bad_pick.error == "ModelRetry: index 7 is out of range, pick 0 or 1"
    assert bad_pick.parent_call_id == second.call_id and bad_pick.metadata["retry"] == 0
    assert good_pick.output == "joke two" and good_pick.parent_call_id == third.call_id
    assert good_pick.metadata["retry"] == 1
    assert {call.metadata["adapter"] for call in rollout.calls if call.kind == "tool"} == {"pydantic_ai"}
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_run_sync_and_outer_role_for_an_unnamed_agent(serve) -> None:
    """``run_sync`` goes through the same capture; an agent with no name keeps the role the user set."""
    server, model = serve(lambda request: MockReply(content="hello"))

    @agl.rollout(reward=lambda task, out: float(out == "hello"))
    def agent(task: dict, llm: agl.LLM) -> str:
        with agl.role("greeter"):
            return Agent(model_for(llm)).run_sync(task["prompt"]).output

    rollout = agent.execute({"prompt": "Say hello."}, server.llm())
    assert timeline(rollout) == [("llm", "greeter", "ok")]
    model.assert_server_token_ids(rollout.llm_calls[0])


def stream_rule(request: MockRequest) -> MockReply:
    if not tool_results(request):
        return MockReply(tool_calls=[MockToolCall(name="weather", arguments={"city": "Paris"})])
    return MockReply(content="It is sunny in Paris today, with a light breeze from the west and no rain expected.")


async def test_run_stream_with_a_tool_and_left_early(serve) -> None:
    """``run_stream`` as the docs use it (``stream_text``), read to the end and left after the first chunk."""
    server, model = serve(stream_rule)

    def weather_agent(llm: agl.LLM) -> Agent:
        forecaster = Agent(model_for(llm), name="forecaster", instructions="You tell the weather.")

        @forecaster.tool_plain
        def weather(city: str) -> str:
            """The weather in ``city``."""
            return f"sunny in {city}"

        return forecaster

    @agl.rollout(reward=lambda task, out: float("sunny" in out))
    async def full(task: dict, llm: agl.LLM) -> str:
        async with weather_agent(llm).run_stream(task["prompt"]) as result:
            return "".join([delta async for delta in result.stream_text(delta=True)])

    rollout = await full.aexecute({"prompt": "Weather in Paris?"}, server.llm())
    assert timeline(rollout) == [
        ("llm", "forecaster", "ok"),
        ("tool", "forecaster:weather", "ok"),
        ("llm", "forecaster", "ok"),
    ]
    assert rollout.calls[1].output == "sunny in Paris"
    assert rollout.calls[1].parent_call_id == rollout.calls[0].call_id
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)

    @agl.rollout(reward=lambda task, out: float(bool(out)))
    async def early(task: dict, llm: agl.LLM) -> str:
        async with weather_agent(llm).run_stream(task["prompt"]) as result:
            async for delta in result.stream_text(delta=True):
                return delta
        return ""

    rollout = await early.aexecute({"prompt": "Weather in Paris?"}, server.llm())
    roles = [(call.kind, call.role) for call in rollout.calls]
    assert roles == [("llm", "forecaster"), ("tool", "forecaster"), ("llm", "forecaster")]
    model.assert_server_token_ids(rollout.llm_calls[0])
    model.assert_server_token_ids(rollout.llm_calls[1], partial=True)


def test_uninstrument_restores_plain_capture(serve) -> None:
    """Without the adapter the calls are still captured (through the openai client) but carry no agent name."""
    server, _ = serve(delegation_rule)

    @agl.rollout(reward=lambda task, out: float(out == "joke two"))
    async def agent(task: dict, llm: agl.LLM) -> str:
        return (await selector_agents(llm).run(task["prompt"])).output

    agl.uninstrument("pydantic_ai")
    try:
        rollout = asyncio.run(agent.aexecute({"prompt": "Tell me a joke."}, server.llm()))
    finally:
        agl.instrument("pydantic_ai")
    assert [(call.kind, call.role) for call in rollout.calls] == [("llm", None)] * 5
