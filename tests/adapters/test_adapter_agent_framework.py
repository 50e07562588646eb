"""Microsoft Agent Framework adapter: real ``agent_framework.Agent`` objects (function tools, one that raises, a
two-agent workflow, a streamed run left early, an agent used as another's tool) against the mock server, through
``@agl.rollout``."""

from __future__ import annotations

import asyncio
from typing import Annotated

import pytest
from adapter_support import timeline
from agent_framework import Agent, WorkflowBuilder, tool
from agent_framework.openai import OpenAIChatClient, OpenAIChatCompletionClient
from pydantic import Field

import agentlightning as agl
from agentlightning.testing import MockReply, MockRequest, MockToolCall


@pytest.fixture(autouse=True)
def instrumented() -> None:
    agl.instrument("agent_framework")


def client_for(llm: agl.LLM, api: str = "chat.completions") -> OpenAIChatCompletionClient | OpenAIChatClient:
    """The framework's Chat Completions client, or its Responses API client (``OpenAIChatClient``)."""
    client = OpenAIChatCompletionClient if api == "chat.completions" else OpenAIChatClient
    return client(model=llm.model, base_url=llm.base_url, api_key=llm.api_key)


def system_text(request: MockRequest) -> str:
    return str(request.messages[0].get("content")) if request.messages else ""


def tool_results(request: MockRequest) -> list[dict]:
    return [m for m in request.messages if m["role"] == "tool"]


@tool(approval_mode="never_require")
def get_weather(location: Annotated[str, Field(description="The city to get the weather for.")]) -> str:
    """Get the weather for a given location."""
    return f"The weather in {location} is sunny, 22 degrees."


def weather_rule(request: MockRequest) -> MockReply:
    if not tool_results(request):
        return MockReply(tool_calls=[MockToolCall(name="get_weather", arguments={"location": "Seattle"})])
    return MockReply(content="It is sunny in Seattle today, 22 degrees, with a light breeze and no rain expected.")


def weather_agent(llm: agl.LLM, api: str = "chat.completions") -> Agent:
    return Agent(
        client=client_for(llm, api),
        name="WeatherAgent",
        instructions="You are a helpful weather agent.",
        tools=[get_weather],
    )


@pytest.mark.parametrize("api", ["chat.completions", "responses"])
async def test_quick_start_agent_with_a_tool(serve, api: str) -> None:
    server, model = serve(weather_rule)

    @agl.rollout(reward=lambda task, out: float("sunny" in out))
    async def agent(task: dict, llm: agl.LLM) -> str:
        result = await weather_agent(llm, api).run(task["prompt"])
        return result.text

    rollout = await agent.aexecute({"prompt": "What's the weather like in Seattle?"}, server.llm())
    assert timeline(rollout) == [
        ("llm", "WeatherAgent", "ok"),
        ("tool", "WeatherAgent:get_weather", "ok"),
        ("llm", "WeatherAgent", "ok"),
    ]
    assert rollout.final_reward == 1.0
    assert len(rollout.llm_calls) == len(model.served) == 2
    first, weather, _ = rollout.calls
    assert weather.input == {"location": "Seattle"}
    assert weather.output == "The weather in Seattle is sunny, 22 degrees."
    assert weather.parent_call_id == first.call_id
    assert weather.metadata["adapter"] == "agent_framework"
    assert {call.metadata["api"] for call in rollout.llm_calls} == {api}
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def workflow_rule(request: MockRequest) -> MockReply:
    """The writer looks a fact up twice (the first lookup raises), then drafts; the reviewer answers."""
    if system_text(request).startswith("You review"):
        return MockReply(content="Approved: the slogan is short and true.")
    results = tool_results(request)
    if not results:
        return MockReply(tool_calls=[MockToolCall(name="lookup_fact", arguments={"topic": "electric bikes"})])
    if len(results) == 1:
        return MockReply(tool_calls=[MockToolCall(name="lookup_fact", arguments={"topic": "e-bikes"})])
    return MockReply(content="E-bikes: ride 80 km on one charge.")


def workflow_agents(llm: agl.LLM) -> tuple[Agent, Agent]:
    @tool(approval_mode="never_require")
    def lookup_fact(topic: Annotated[str, Field(description="What to look up.")]) -> str:
        """Look up one fact about a topic."""
        if topic != "e-bikes":
            raise LookupError(f"no fact about {topic!r}")
        return "e-bikes ride 80 km on one charge"

    client = client_for(llm)
    writer = Agent(
        client=client,
        name="writer",
        instructions="You write short slogans. Use lookup_fact for facts.",
        tools=[lookup_fact],
    )
    reviewer = Agent(client=client, name="reviewer", instructions="You review slogans and approve or reject them.")
    return writer, reviewer


WORKFLOW_TIMELINE = [
    ("llm", "writer", "ok"),
    ("tool", "writer:lookup_fact", "error"),
    ("llm", "writer", "ok"),
    ("tool", "writer:lookup_fact", "ok"),
    ("llm", "writer", "ok"),
    ("llm", "reviewer", "ok"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
async def test_workflow_of_two_agents_with_a_tool_that_raises(serve, stream: bool) -> None:
    """The docs' agents-in-a-workflow shape: writer -> reviewer edges built from the agents themselves."""
    server, model = serve(workflow_rule)

    @agl.rollout(reward=lambda task, out: float(out.startswith("Approved")))
    async def agent(task: dict, llm: agl.LLM) -> str:
        writer, reviewer = workflow_agents(llm)
        workflow = WorkflowBuilder(start_executor=writer).add_edge(writer, reviewer).build()
        if stream:  # every agent's updates as they stream: the reviewer's answer is the last agent's
            events = [event async for event in workflow.run(task["prompt"], stream=True) if event.type == "output"]
            return "".join(event.data.text for event in events if event.executor_id == "reviewer")
        return (await workflow.run(task["prompt"])).get_outputs()[-1].text

    rollout = await agent.aexecute({"prompt": "Write a slogan for an electric bike."}, server.llm())
    assert timeline(rollout) == WORKFLOW_TIMELINE
    assert rollout.final_reward == 1.0
    assert len(rollout.llm_calls) == len(model.served) == 4
    first, failed, second, looked_up, _, _ = rollout.calls
    assert failed.error == "LookupError: no fact about 'electric bikes'"
    assert failed.input == {"topic": "electric bikes"} and failed.parent_call_id == first.call_id
    assert looked_up.output == "e-bikes ride 80 km on one charge" and looked_up.parent_call_id == second.call_id
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


async def test_streamed_run_read_to_the_end_and_left_early(serve) -> None:
    server, model = serve(weather_rule)

    @agl.rollout(reward=lambda task, out: float("sunny" in out))
    async def full(task: dict, llm: agl.LLM) -> str:
        return "".join([update.text async for update in weather_agent(llm).run(task["prompt"], stream=True)])

    rollout = await full.aexecute({"prompt": "Weather in Seattle?"}, server.llm())
    assert timeline(rollout) == [
        ("llm", "WeatherAgent", "ok"),
        ("tool", "WeatherAgent:get_weather", "ok"),
        ("llm", "WeatherAgent", "ok"),
    ]
    assert rollout.calls[1].parent_call_id == rollout.calls[0].call_id
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)

    @agl.rollout(reward=lambda task, out: float(bool(out)))
    async def early(task: dict, llm: agl.LLM) -> str:
        # The framework's way to leave a stream early: its ResponseStream closes on block exit.
        async with weather_agent(llm).run(task["prompt"], stream=True) as stream:
            async for update in stream:
                if update.text:
                    return update.text
        return ""

    rollout = await early.aexecute({"prompt": "Weather in Seattle?"}, server.llm())
    assert [(call.kind, call.role) for call in rollout.calls] == [
        ("llm", "WeatherAgent"),
        ("tool", "WeatherAgent"),
        ("llm", "WeatherAgent"),
    ]
    model.assert_server_token_ids(rollout.llm_calls[0])
    model.assert_server_token_ids(rollout.llm_calls[1], partial=True)


def concurrent_rule(request: MockRequest) -> MockReply:
    if system_text(request).startswith("You tell jokes"):
        return MockReply(content="Why did the bike fall over? It was two tired.")
    return weather_rule(request)


async def test_agents_run_concurrently_keep_their_own_names(serve) -> None:
    """Two agents awaited together in one rollout (their calls interleave): each call carries its own agent's name."""
    server, model = serve(concurrent_rule)

    @agl.rollout(reward=lambda task, out: float("sunny" in out[0]))
    async def agent(task: dict, llm: agl.LLM) -> list[str]:
        joker = Agent(client=client_for(llm), name="JokeAgent", instructions="You tell jokes.")
        results = await asyncio.gather(weather_agent(llm).run(task["prompt"]), joker.run("A joke about bikes."))
        return [result.text for result in results]

    rollout = await agent.aexecute({"prompt": "Weather in Seattle?"}, server.llm())
    assert rollout.status == "succeeded", rollout.error
    assert len(rollout.llm_calls) == len(model.served) == 3
    for call in rollout.llm_calls:
        system = call.input[0]["content"]
        assert call.role == ("JokeAgent" if system.startswith("You tell jokes") else "WeatherAgent"), call.role
        model.assert_server_token_ids(call)
    (weather,) = [call for call in rollout.calls if call.kind == "tool"]
    assert weather.role == "WeatherAgent" and weather.status == "ok"


def delegation_rule(request: MockRequest) -> MockReply:
    """A coordinator asks its researcher agent (given as a tool) once, then answers with what it said."""
    if system_text(request).startswith("You research"):
        if not tool_results(request):
            return MockReply(tool_calls=[MockToolCall(name="get_weather", arguments={"location": "Oslo"})])
        return MockReply(content="Oslo is sunny.")
    if not tool_results(request):
        return MockReply(tool_calls=[MockToolCall(name="researcher", arguments={"task": "Weather in Oslo?"})])
    return MockReply(content="The researcher says Oslo is sunny.")


async def test_agent_as_tool_keeps_each_agents_name_and_records_each_tool_once(serve) -> None:
    server, model = serve(delegation_rule)

    @agl.rollout(reward=lambda task, out: float("sunny" in out))
    async def agent(task: dict, llm: agl.LLM) -> str:
        client = client_for(llm)
        researcher = Agent(
            client=client,
            name="researcher",
            description="Finds facts.",
            instructions="You research facts with your tools.",
            tools=[get_weather],
        )
        coordinator = Agent(
            client=client,
            name="coordinator",
            instructions="You answer with the researcher's help.",
            tools=[researcher.as_tool()],
        )
        return (await coordinator.run(task["prompt"])).text

    rollout = await agent.aexecute({"prompt": "How is the weather in Oslo?"}, server.llm())
    assert timeline(rollout) == [
        ("llm", "coordinator", "ok"),
        ("tool", "coordinator:researcher", "ok"),  # calls are ordered by start: the tool runs the researcher
        ("llm", "researcher", "ok"),
        ("tool", "researcher:get_weather", "ok"),
        ("llm", "researcher", "ok"),
        ("llm", "coordinator", "ok"),
    ]
    assert len(rollout.llm_calls) == len(model.served) == 4
    coordinate, delegated, research, weather, _, _ = rollout.calls
    assert delegated.parent_call_id == coordinate.call_id and delegated.output == "Oslo is sunny."
    assert weather.parent_call_id == research.call_id
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_unnamed_agent_keeps_the_outer_role_and_uninstrument_restores_plain_capture(serve) -> None:
    server, model = serve(weather_rule)

    @agl.rollout(reward=lambda task, out: float("sunny" in out))
    async def unnamed(task: dict, llm: agl.LLM) -> str:
        with agl.role("forecaster"):
            agent = Agent(client=client_for(llm), instructions="You tell the weather.", tools=[get_weather])
            return (await agent.run(task["prompt"])).text

    rollout = asyncio.run(unnamed.aexecute({"prompt": "Weather in Seattle?"}, server.llm()))
    assert timeline(rollout) == [
        ("llm", "forecaster", "ok"),
        ("tool", "forecaster:get_weather", "ok"),
        ("llm", "forecaster", "ok"),
    ]

    @agl.rollout(reward=lambda task, out: float("sunny" in out))
    async def named(task: dict, llm: agl.LLM) -> str:
        return (await weather_agent(llm).run(task["prompt"])).text

    agl.uninstrument("agent_framework")
    try:
        rollout = asyncio.run(named.aexecute({"prompt": "Weather in Seattle?"}, server.llm()))
    finally:
        agl.instrument("agent_framework")
    assert [(call.kind, call.role) for call in rollout.calls] == [("llm", None), ("llm", None)]
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)
