"""OpenAI Agents SDK adapter: real ``Agent`` / ``Runner`` objects against the mock server, through ``@agl.rollout``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import wrapt
from adapter_support import timeline
from agents import (
    Agent,
    ModelProvider,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_trace_processors,
    set_tracing_disabled,
)
from agents.mcp import MCPServerStdio
from agents.models.interface import Model
from openai import AsyncOpenAI

import agentlightning as agl
from agentlightning.testing import MockReply, MockRequest, MockToolCall


@pytest.fixture(autouse=True)
def no_trace_export() -> Iterator[None]:
    """Drop the SDK's default exporter (it would post traces to OpenAI); the capture processor stays."""
    agl.instrument("openai_agents")
    set_trace_processors([])
    yield


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@function_tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


def system_text(request: MockRequest) -> str:
    return str(request.messages[0].get("content")) if request.messages else ""


def math_rule(request: MockRequest) -> MockReply:
    """triage hands off to math; math calls add (works) and divide by zero (fails), then answers."""
    system = system_text(request)
    question = next(m["content"] for m in request.messages if m["role"] == "user")
    if system.startswith("You triage"):
        return MockReply(tool_calls=[MockToolCall(name="transfer_to_math", arguments={})])
    tool_results = [m for m in request.messages if m["role"] == "tool"]
    if len(tool_results) < 3:  # the handoff's own tool result, then add and divide
        return MockReply(
            tool_calls=[
                MockToolCall(name="add", arguments={"a": 2, "b": 3}),
                MockToolCall(name="divide", arguments={"a": 1, "b": 0}),
            ]
        )
    return MockReply(content=f"5 for {question}")


def agents_for(model: Model | str) -> Agent:
    math = Agent(name="math", instructions="You do math.", tools=[add, divide], model=model)
    return Agent(name="triage", instructions="You triage questions.", handoffs=[math], model=model)


def model_for(llm: agl.LLM, api: str) -> Model:
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key)
    if api == "chat":
        return OpenAIChatCompletionsModel(llm.model, client)
    return OpenAIResponsesModel(llm.model, client)


HANDOFF_TIMELINE = [
    ("llm", "triage", "ok"),
    ("llm", "math", "ok"),
    ("tool", "math:add", "ok"),
    ("tool", "math:divide", "error"),
    ("llm", "math", "ok"),
]


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_handoff_and_tools_attributed_to_each_agent(serve, api: str) -> None:
    server, model = serve(math_rule)

    @agl.rollout(reward=lambda task, out: float(out.startswith("5")))
    async def agent(task: dict, llm: agl.LLM) -> str:
        result = await Runner.run(agents_for(model_for(llm, api)), task["question"])
        return result.final_output

    rollout = await agent.aexecute({"question": "2+3?"}, server.llm())
    assert timeline(rollout) == HANDOFF_TIMELINE
    assert rollout.final_reward == 1.0
    _, math_first, add_call, divide_call, _ = rollout.calls
    assert add_call.input == {"a": 2, "b": 3} and add_call.output == 5
    assert divide_call.input == {"a": 1, "b": 0}
    assert divide_call.error is not None and divide_call.error.startswith("Error running tool")
    assert add_call.parent_call_id == divide_call.parent_call_id == math_first.call_id
    assert [call.metadata["api"] for call in rollout.llm_calls] == [
        "chat.completions" if api == "chat" else "responses"
    ] * 3
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_sync_runner(serve) -> None:
    server, model = serve(math_rule)

    @agl.rollout(reward=lambda task, out: float(out.startswith("5")))
    def agent(task: dict, llm: agl.LLM) -> str:
        return Runner.run_sync(agents_for(model_for(llm, "chat")), task["question"]).final_output

    rollout = agent.execute({"question": "2+3?"}, server.llm())
    assert timeline(rollout) == HANDOFF_TIMELINE
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_streamed_run(serve, api: str) -> None:
    server, model = serve(math_rule)

    @agl.rollout(reward=lambda task, out: float(out.startswith("5")))
    async def agent(task: dict, llm: agl.LLM) -> str:
        result = Runner.run_streamed(agents_for(model_for(llm, api)), task["question"])
        async for _event in result.stream_events():
            pass
        return result.final_output

    rollout = await agent.aexecute({"question": "2+3?"}, server.llm())
    assert timeline(rollout) == HANDOFF_TIMELINE
    assert all(call.metadata.get("stream") for call in rollout.llm_calls)
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def translate_rule(request: MockRequest) -> MockReply:
    """The orchestrator asks the translator agent (exposed as a tool), then answers with its output."""
    system = system_text(request)
    if system.startswith("You translate"):
        return MockReply(content="bonjour")
    tool_results = [m["content"] for m in request.messages if m["role"] == "tool"]
    if not tool_results:
        return MockReply(tool_calls=[MockToolCall(name="translate", arguments={"input": "hello"})])
    return MockReply(content=f"answer: {tool_results[0]}")


async def test_agent_as_tool_attributes_inner_calls_to_inner_agent(serve) -> None:
    server, model = serve(translate_rule)

    @agl.rollout(reward=lambda task, out: float("bonjour" in out))
    async def agent(task: dict, llm: agl.LLM) -> str:
        chat = model_for(llm, "chat")
        translator = Agent(name="translator", instructions="You translate to French.", model=chat)
        orchestrator = Agent(
            name="orchestrator",
            instructions="You orchestrate.",
            tools=[translator.as_tool(tool_name="translate", tool_description="Translate to French.")],
            model=chat,
        )
        return (await Runner.run(orchestrator, task["text"])).final_output

    rollout = await agent.aexecute({"text": "hello"}, server.llm())
    assert timeline(rollout) == [
        ("llm", "orchestrator", "ok"),
        ("tool", "orchestrator:translate", "ok"),
        ("llm", "translator", "ok"),
        ("llm", "orchestrator", "ok"),
    ]
    assert rollout.final_reward == 1.0
    assert rollout.calls[1].parent_call_id == rollout.calls[0].call_id
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


@pytest.mark.parametrize("mode", ["threads", "asyncio"])
def test_twenty_parallel_rollouts_do_not_mix(serve, mode: str) -> None:
    server, model = serve(math_rule)

    def score(task: dict, out: str) -> float:
        return float(task["question"] in out)

    @agl.rollout(reward=score)
    def sync_agent(task: dict, llm: agl.LLM) -> str:  # Runner.run_sync: one event loop per worker thread
        return Runner.run_sync(agents_for(model_for(llm, "responses")), task["question"]).final_output

    @agl.rollout(reward=score)
    async def async_agent(task: dict, llm: agl.LLM) -> str:
        return (await Runner.run(agents_for(model_for(llm, "chat")), task["question"])).final_output

    tasks = [{"question": f"question {i}"} for i in range(20)]
    rollouts = agl.run(sync_agent if mode == "threads" else async_agent, tasks, llm=server.llm(), n_workers=20)
    for task, rollout in zip(tasks, rollouts, strict=True):
        assert timeline(rollout) == HANDOFF_TIMELINE
        assert rollout.final_reward == 1.0
        for call in rollout.llm_calls:
            assert any(message.get("content") == task["question"] for message in call.input)
            model.assert_server_token_ids(call)


def test_install_twice_and_uninstall(serve) -> None:
    from agentlightning.adapters import openai_agents as adapter
    from agents.tracing.spans import NoOpSpan, SpanImpl

    server, _ = serve(math_rule)
    agl.instrument("openai_agents")
    adapter.install()
    assert len(adapter._PATCH.originals) == 7

    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        Runner.run_sync(agents_for(model_for(llm, "chat")), "2+3?")
        return 1.0

    try:
        agl.uninstrument("openai_agents")
        assert not adapter.is_installed()
        assert not any(
            isinstance(getattr(cls, name), wrapt.FunctionWrapper)
            for cls in (SpanImpl, NoOpSpan)
            for name in ("start", "finish", "set_error")
        )
        rollout = agent.execute({}, server.llm())
        assert [call.role for call in rollout.calls] == [None, None, None]
    finally:
        agl.instrument("openai_agents")
    assert timeline(agent.execute({}, server.llm())) == HANDOFF_TIMELINE
    assert not adapter._open  # every span followed was closed


class MockProvider(ModelProvider):
    """The SDK's custom-provider example: every model of the run comes from one OpenAI-compatible client."""

    def __init__(self, llm: agl.LLM) -> None:
        self.client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key)
        self.model = llm.model

    def get_model(self, model_name: str | None) -> Model:
        return OpenAIChatCompletionsModel(model=model_name or self.model, openai_client=self.client)


@pytest.fixture
def tracing_off() -> Iterator[None]:
    """``set_tracing_disabled(True)``, as every custom-provider example of the SDK has it."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)
    set_default_openai_api("responses")


@pytest.mark.parametrize("setup", ["global_client", "agent_model", "model_provider", "run_config"])
async def test_tracing_disabled_keeps_roles_and_tools(serve, tracing_off: None, setup: str) -> None:
    server, model = serve(math_rule)

    @agl.rollout(roles=["math"])
    async def agent(task: dict, llm: agl.LLM) -> float:
        run_config = None
        if setup == "global_client":  # custom_example_global.py
            set_default_openai_client(AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key), use_for_tracing=False)
            set_default_openai_api("chat_completions")
            triage = agents_for(llm.model)
        elif setup == "agent_model":  # custom_example_agent.py
            triage = agents_for(
                OpenAIChatCompletionsModel(
                    model=llm.model, openai_client=AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key)
                )
            )
        else:  # custom_example_provider.py, or tracing disabled for one run only
            triage = agents_for(llm.model)
            run_config = RunConfig(model_provider=MockProvider(llm), tracing_disabled=setup == "run_config")
        result = await Runner.run(triage, task["question"], run_config=run_config)
        return float(result.final_output.startswith("5"))

    (rollout,) = await agl.arun(agent, [{"question": "2+3?"}], llm=server.llm())
    assert timeline(rollout) == HANDOFF_TIMELINE
    assert rollout.final_reward == 1.0 and rollout.diagnostics == []
    assert len(rollout.llm_calls) == len(server.requests)
    add_call, divide_call = (call for call in rollout.calls if call.kind == "tool")
    assert add_call.input == {"a": 2, "b": 3} and add_call.output == 5
    assert divide_call.error is not None and divide_call.error.startswith("Error running tool")
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)
    assert [t.role for t in agl.transitions([rollout], roles=["math"])] == ["math", "math"]


def test_tracing_disabled_streamed_sync_and_agent_as_tool(serve, tracing_off: None) -> None:
    server, model = serve(translate_rule)

    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        def orchestrator() -> Agent:  # a client per event loop
            chat = model_for(llm, "chat")
            translator = Agent(name="translator", instructions="You translate to French.", model=chat)
            return Agent(
                name="orchestrator",
                instructions="You orchestrate.",
                model=chat,
                tools=[translator.as_tool(tool_name="translate", tool_description="Translate.")],
            )

        async def streamed() -> str:
            result = Runner.run_streamed(orchestrator(), task["text"])
            async for _event in result.stream_events():
                pass
            return result.final_output

        first = Runner.run_sync(orchestrator(), task["text"]).final_output
        return float("bonjour" in first and "bonjour" in asyncio.run(streamed()))

    rollout = agent.execute({"text": "hello"}, server.llm())
    one_run = [
        ("llm", "orchestrator", "ok"),
        ("tool", "orchestrator:translate", "ok"),
        ("llm", "translator", "ok"),
        ("llm", "orchestrator", "ok"),
    ]
    assert timeline(rollout) == one_run * 2
    assert rollout.final_reward == 1.0
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


@pytest.mark.parametrize("tracing", ["on", "off"])
async def test_mcp_tools_recorded_with_status(serve, request: pytest.FixtureRequest, tracing: str) -> None:
    """The Agents SDK's MCP quickstart: a local MCP server over stdio gives the agent its tools."""
    if tracing == "off":
        request.getfixturevalue("tracing_off")
    server, model = serve(math_rule)
    calculator = Path(__file__).with_name("mcp_calculator.py")

    @agl.rollout(roles=["math"])
    async def agent(task: dict, llm: agl.LLM) -> float:
        chat = model_for(llm, "chat")
        async with MCPServerStdio(
            name="calculator",
            params={"command": sys.executable, "args": [str(calculator)]},
            client_session_timeout_seconds=30,
        ) as mcp_server:
            math = Agent(name="math", instructions="You do math.", mcp_servers=[mcp_server], model=chat)
            triage = Agent(name="triage", instructions="You triage questions.", handoffs=[math], model=chat)
            result = await Runner.run(triage, task["question"])
        return float(result.final_output.startswith("5"))

    rollout = await agent.aexecute({"question": "2+3?"}, server.llm())
    assert timeline(rollout) == HANDOFF_TIMELINE
    assert rollout.final_reward == 1.0 and len(rollout.llm_calls) == len(server.requests)
    add_call, divide_call = (call for call in rollout.calls if call.kind == "tool")
    assert add_call.input == {"a": 2, "b": 3} and "5" in str(add_call.output)
    assert divide_call.error.startswith("MCP tool error: Error executing tool divide")  # the text the server sent
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)
