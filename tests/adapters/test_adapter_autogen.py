"""AutoGen AgentChat adapter: real ``AssistantAgent`` teams with ``OpenAIChatCompletionClient`` against the mock
server, through ``@agl.rollout``."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from adapter_support import timeline
from autogen_agentchat.agents import AssistantAgent, BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import MagenticOneGroupChat, RoundRobinGroupChat, SelectorGroupChat, Swarm
from autogen_agentchat.tools import AgentTool
from autogen_agentchat.ui import Console
from autogen_core import CancellationToken
from autogen_core.models import ChatCompletionClient, ModelInfo, SystemMessage, UserMessage
from autogen_core.tools import FunctionTool, TextResultContent, ToolResult, ToolSchema, Workbench
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agentlightning as agl
from agentlightning.testing import MockReply, MockRequest, MockToolCall


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


def model_client(llm: agl.LLM) -> OpenAIChatCompletionClient:
    info = ModelInfo(vision=False, function_calling=True, json_output=True, family="unknown", structured_output=True)
    return OpenAIChatCompletionClient(model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=info)


def agents(llm: agl.LLM, stream: bool = False) -> list[AssistantAgent]:
    client = model_client(llm)  # one client shared by both agents: the role must come from the agent
    solver = AssistantAgent(
        "solver",
        model_client=client,
        tools=[add, FunctionTool(divide, description="Divide a by b.")],
        system_message="You are the solver.",
        reflect_on_tool_use=True,
        model_client_stream=stream,
    )
    critic = AssistantAgent(
        "critic", model_client=client, system_message="You are the critic.", model_client_stream=stream
    )
    return [solver, critic]


def team_rule(request: MockRequest) -> MockReply:
    """solver: add (works) + divide by zero (fails), then reflects; critic approves; the selector picks by turn."""
    texts = [str(m.get("content")) for m in request.messages]
    task = next((t for t in texts if "Compute" in t), "")
    if any("role play game" in t for t in texts):
        return MockReply(content="solver" if "critic: APPROVED" in texts[-1] else "critic")
    if texts[0].startswith("You are the critic"):
        return MockReply(content=f"APPROVED ({task})")
    if request.messages[-1]["role"] == "tool":
        return MockReply(content=f"the sum is 5 ({task})")
    return MockReply(
        tool_calls=[
            MockToolCall(name="add", arguments={"a": 2, "b": 3}),
            MockToolCall(name="divide", arguments={"a": 1, "b": 0}),
        ]
    )


ROUND_ROBIN = [
    ("llm", "solver", "ok"),
    ("tool", "solver:add", "ok"),
    ("tool", "solver:divide", "error"),
    ("llm", "solver", "ok"),
    ("llm", "critic", "ok"),
]


async def run_round_robin(task: dict, llm: agl.LLM, stream: bool = False) -> str:
    team = RoundRobinGroupChat(agents(llm, stream), termination_condition=TextMentionTermination("APPROVED"))
    result = await team.run(task=f"Compute {task['question']}")
    return str(result.messages[-1].content)


@pytest.mark.parametrize("stream", [False, True])
async def test_round_robin_team_roles_tools_and_token_ids(serve, stream: bool) -> None:
    server, model = serve(team_rule)

    @agl.rollout(reward=lambda task, out: float(out.startswith("APPROVED")))
    async def agent(task: dict, llm: agl.LLM) -> str:
        return await run_round_robin(task, llm, stream)

    rollout = await agent.aexecute({"question": "2+3"}, server.llm())
    assert timeline(rollout) == ROUND_ROBIN
    assert rollout.final_reward == 1.0
    first, add_call, divide_call, _, _ = rollout.calls
    assert add_call.input == {"a": 2, "b": 3} and add_call.output == "5"
    assert divide_call.error == "ToolError: division by zero"
    assert add_call.parent_call_id == divide_call.parent_call_id == first.call_id
    assert [call.metadata.get("stream", False) for call in rollout.llm_calls] == [stream] * 3
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_sync_agent_function(serve) -> None:
    server, model = serve(team_rule)

    @agl.rollout(reward=lambda task, out: float(out.startswith("APPROVED")))
    def agent(task: dict, llm: agl.LLM) -> str:
        return asyncio.run(run_round_robin(task, llm))

    rollout = agent.execute({"question": "2+3"}, server.llm())
    assert timeline(rollout) == ROUND_ROBIN
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


async def test_selector_group_chat_attributes_speaker_selection(serve) -> None:
    server, model = serve(team_rule)

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        team = SelectorGroupChat(
            agents(llm),
            model_client=model_client(llm),
            termination_condition=MaxMessageTermination(3),
            allow_repeated_speaker=True,
        )
        await team.run(task=f"Compute {task['question']}")
        return 1.0

    rollout = await agent.aexecute({"question": "2+3"}, server.llm())
    assert timeline(rollout) == [
        ("llm", "SelectorGroupChatManager", "ok"),
        ("llm", "critic", "ok"),
        ("llm", "SelectorGroupChatManager", "ok"),
        ("llm", "solver", "ok"),
        ("tool", "solver:add", "ok"),
        ("tool", "solver:divide", "error"),
        ("llm", "solver", "ok"),
    ]
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def handoff_rule(request: MockRequest) -> MockReply:
    if str(request.messages[0]["content"]).startswith("You are alice"):
        return MockReply(tool_calls=[MockToolCall(name="transfer_to_bob", arguments={})])
    return MockReply(content="TERMINATE from bob")


async def test_swarm_handoff(serve) -> None:
    server, model = serve(handoff_rule)

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        client = model_client(llm)
        alice = AssistantAgent("alice", model_client=client, handoffs=["bob"], system_message="You are alice.")
        bob = AssistantAgent("bob", model_client=client, system_message="You are bob.")
        await Swarm([alice, bob], termination_condition=TextMentionTermination("TERMINATE")).run(task="hi")
        return 1.0

    rollout = await agent.aexecute({}, server.llm())
    assert timeline(rollout) == [("llm", "alice", "ok"), ("tool", "alice:transfer_to_bob", "ok"), ("llm", "bob", "ok")]
    assert rollout.calls[1].parent_call_id == rollout.calls[0].call_id
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


class KeyValueWorkbench(Workbench):
    """A workbench serving one tool over its own protocol, as an MCP server does: errors come back as results
    flagged ``is_error`` rather than as exceptions."""

    def __init__(self, data: dict[str, str]) -> None:
        self.data = data

    async def list_tools(self) -> list[ToolSchema]:
        parameters = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
        return [ToolSchema(name="get", description="Read a key.", parameters=parameters)]

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        cancellation_token: CancellationToken | None = None,
        call_id: str | None = None,
    ) -> ToolResult:
        key = (arguments or {}).get("key", "")
        found = key in self.data
        text = self.data[key] if found else f"no key {key!r}"
        return ToolResult(name=name, result=[TextResultContent(content=text)], is_error=not found)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def reset(self) -> None:
        return None

    async def save_state(self) -> Mapping[str, Any]:
        return {}

    async def load_state(self, state: Mapping[str, Any]) -> None:
        return None


def lookup_rule(request: MockRequest) -> MockReply:
    if request.messages[-1]["role"] == "tool":
        return MockReply(content="done")
    return MockReply(
        tool_calls=[MockToolCall(name="get", arguments={"key": "a"}), MockToolCall(name="get", arguments={"key": "zz"})]
    )


async def test_workbench_tools_report_error_results(serve) -> None:
    server, _ = serve(lookup_rule)

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        reader = AssistantAgent("reader", model_client=model_client(llm), workbench=KeyValueWorkbench({"a": "1"}))
        await reader.run(task="read a and zz")
        return 1.0

    rollout = await agent.aexecute({}, server.llm())
    assert timeline(rollout) == [("llm", "reader", "ok"), ("tool", "reader:get", "ok"), ("tool", "reader:get", "error")]
    assert [call.output for call in rollout.calls[1:]] == ["1", "no key 'zz'"]
    assert rollout.calls[2].error == "ToolError: no key 'zz'"
    ids = [tc["id"] for tc in rollout.calls[0].output["tool_calls"]]
    assert [call.metadata["tool_call_id"] for call in rollout.calls[1:]] == ids


def delegate_rule(request: MockRequest) -> MockReply:
    if str(request.messages[0]["content"]).startswith("You translate"):
        return MockReply(content="bonjour")
    if request.messages[-1]["role"] == "tool":
        return MockReply(content="done: " + str(request.messages[-1]["content"]))
    return MockReply(tool_calls=[MockToolCall(name="translator", arguments={"task": "hello"})])


async def test_agent_as_tool_attributes_inner_calls_to_inner_agent(serve) -> None:
    server, model = serve(delegate_rule)

    @agl.rollout(reward=lambda task, out: float("bonjour" in out))
    async def agent(task: dict, llm: agl.LLM) -> str:
        client = model_client(llm)
        translator = AssistantAgent("translator", model_client=client, system_message="You translate.")
        boss = AssistantAgent(
            "boss",
            model_client=client,
            tools=[AgentTool(translator)],
            system_message="You delegate.",
            reflect_on_tool_use=True,
        )
        result = await boss.run(task="say hello in French")
        return str(result.messages[-1].content)

    rollout = await agent.aexecute({}, server.llm())
    assert timeline(rollout) == [
        ("llm", "boss", "ok"),
        ("tool", "boss:translator", "ok"),
        ("llm", "translator", "ok"),
        ("llm", "boss", "ok"),
    ]
    assert rollout.final_reward == 1.0
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


async def test_single_agent_run_and_on_messages(serve) -> None:
    server, _ = serve(team_rule)

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        solver, critic = agents(llm)
        await solver.run(task="Compute 1+1")
        await critic.run(task="Compute 1+1")
        return 1.0

    rollout = await agent.aexecute({}, server.llm())
    assert timeline(rollout) == ROUND_ROBIN


async def test_twenty_parallel_rollouts_do_not_mix(serve) -> None:
    server, model = serve(team_rule)

    @agl.rollout(reward=lambda task, out: float(task["question"] in out))
    async def agent(task: dict, llm: agl.LLM) -> str:
        return await run_round_robin(task, llm)

    tasks = [{"question": f"{i}+{i}"} for i in range(20)]
    rollouts = await agl.arun(agent, tasks, llm=server.llm(), n_workers=20)
    for task, rollout in zip(tasks, rollouts, strict=True):
        assert timeline(rollout) == ROUND_ROBIN
        assert rollout.final_reward == 1.0
        for call in rollout.llm_calls:
            assert any(f"Compute {task['question']}" in str(message.get("content")) for message in call.input)
            model.assert_server_token_ids(call)


async def test_install_twice_and_uninstall(serve) -> None:
    server, _ = serve(team_rule)
    original = AssistantAgent.__dict__["_call_llm"]
    agl.instrument("autogen")
    agl.instrument("autogen")

    @agl.rollout(reward=lambda task, out: 1.0)
    async def agent(task: dict, llm: agl.LLM) -> str:
        return await run_round_robin(task, llm)

    try:
        agl.uninstrument("autogen")
        assert isinstance(AssistantAgent.__dict__["_call_llm"], classmethod)
        rollout = await agent.aexecute({"question": "1+1"}, server.llm())
        assert rollout.status == "succeeded"
        assert [call.role for call in rollout.calls] == [None, None, None]  # no roles, no tool calls
    finally:
        agl.instrument("autogen")
    assert AssistantAgent.__dict__["_call_llm"] is not original
    rollout = await agent.aexecute({"question": "1+1"}, server.llm())
    assert timeline(rollout) == ROUND_ROBIN


def ledger(satisfied: bool, next_speaker: str) -> str:
    """A Magentic-One progress ledger, as the orchestrator asks its model for one."""

    def entry(answer: object) -> dict:
        return {"reason": "because", "answer": answer}

    return json.dumps(
        {
            "is_request_satisfied": entry(satisfied),
            "is_in_loop": entry(False),
            "is_progress_being_made": entry(True),
            "next_speaker": entry(next_speaker),
            "instruction_or_question": entry(f"{next_speaker}, your turn"),
        }
    )


def magentic_rule(request: MockRequest) -> MockReply:
    """The orchestrator's facts, plan, progress ledgers (coder, then poet, then done) and final answer; the coder
    (an AssistantAgent) and the poet (a custom agent calling its model client itself) answer."""
    texts = [str(m.get("content")) for m in request.messages]
    last = texts[-1]
    if "pre-survey" in last:
        return MockReply(content="facts: none needed")
    if last.startswith("Fantastic. To address this request"):
        return MockReply(content="plan: the coder computes, the poet writes")
    if "Recall we are working on the following request" in last:
        done = {"coder": any("coder says" in t for t in texts), "poet": any("poet says" in t for t in texts)}
        return MockReply(content=ledger(all(done.values()), "poet" if done["coder"] else "coder"))
    if "provide the final answer" in last:
        return MockReply(content="FINAL: 42 and a poem")
    if texts[0].startswith("You are the coder"):
        return MockReply(content="coder says 42")
    if texts[0].startswith("You are the poet"):
        return MockReply(content="poet says roses")
    return MockReply(content=f"unexpected prompt: {last[:80]}")


class Poet(BaseChatAgent):
    """A custom agent, as AutoGen's docs write one: it calls its model client itself."""

    def __init__(self, name: str, model_client: ChatCompletionClient) -> None:
        super().__init__(name, "A poet.")
        self._model_client = model_client

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        return (TextMessage,)

    async def on_messages(self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken) -> Response:
        history = [UserMessage(content=m.to_model_text(), source=m.source) for m in messages]
        result = await self._model_client.create(
            [SystemMessage(content="You are the poet."), *history], cancellation_token=cancellation_token
        )
        return Response(chat_message=TextMessage(content=str(result.content), source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        pass


MAGENTIC = (
    ["MagenticOneOrchestrator"] * 3 + ["coder", "MagenticOneOrchestrator", "poet"] + ["MagenticOneOrchestrator"] * 2
)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_stream"])
async def test_magentic_one_orchestrator_and_custom_agents_are_named(serve, stream: bool) -> None:
    server, model = serve(magentic_rule)

    @agl.rollout(roles=["MagenticOneOrchestrator"])
    async def team(task: dict, llm: agl.LLM) -> float:
        client = model_client(llm)
        coder = AssistantAgent("coder", model_client=client, system_message="You are the coder.")
        team = MagenticOneGroupChat([coder, Poet("poet", client)], model_client=client)
        if stream:
            result = await Console(team.run_stream(task=task["question"]), output_stats=False)
        else:
            result = await team.run(task=task["question"])
        return float(result.messages[-1].content == "FINAL: 42 and a poem")

    (rollout,) = await agl.arun(team, [{"id": 1, "question": "Compute 6*7 and write a poem."}], llm=server.llm())
    assert [role for _kind, role, _status in timeline(rollout)] == MAGENTIC
    assert rollout.final_reward == 1.0 and rollout.diagnostics == []
    assert len(rollout.llm_calls) == len(server.requests)
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)
    assert len(agl.transitions([rollout], roles=["MagenticOneOrchestrator"])) == 6


async def test_custom_agent_used_alone_is_named(serve) -> None:
    server, model = serve(magentic_rule)

    @agl.rollout(roles=["poet"])
    async def alone(task: dict, llm: agl.LLM) -> float:
        poet = Poet("poet", model_client(llm))
        first = await poet.run(task="a poem")
        streamed = [message async for message in poet.run_stream(task="another")]
        return float(first.messages[-1].content == "poet says roses" and len(streamed) == 3)

    rollout = await alone.aexecute({}, server.llm())
    assert timeline(rollout) == [("llm", "poet", "ok")] * 2
    assert rollout.final_reward == 1.0
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def mcp_rule(request: MockRequest) -> MockReply:
    if request.messages[-1]["role"] == "tool":
        return MockReply(content="2 + 3 = 5; 1 / 0 is undefined")
    return MockReply(
        tool_calls=[
            MockToolCall(name="add", arguments={"a": 2, "b": 3}),
            MockToolCall(name="divide", arguments={"a": 1, "b": 0}),
        ]
    )


async def test_mcp_workbench_tools_recorded_with_status(serve) -> None:
    """AutoGen's MCP example: an ``McpWorkbench`` over a local stdio MCP server gives the agent its tools."""
    from autogen_ext.tools.mcp import McpWorkbench, StdioServerParams

    server, model = serve(mcp_rule)
    params = StdioServerParams(
        command=sys.executable, args=[str(Path(__file__).with_name("mcp_calculator.py"))], read_timeout_seconds=30
    )

    @agl.rollout(roles=["mathematician"])
    async def agent(task: dict, llm: agl.LLM) -> float:
        async with McpWorkbench(server_params=params) as workbench:
            mathematician = AssistantAgent(
                "mathematician", model_client=model_client(llm), workbench=workbench, reflect_on_tool_use=True
            )
            result = await mathematician.run(task=task["question"])
        return float("= 5" in result.messages[-1].content)

    (rollout,) = await agl.arun(agent, [{"id": 1, "question": "2+3 and 1/0?"}], llm=server.llm())
    assert rollout.final_reward == 1.0, rollout.error
    assert timeline(rollout) == [
        ("llm", "mathematician", "ok"),
        ("tool", "mathematician:add", "ok"),
        ("tool", "mathematician:divide", "error"),
        ("llm", "mathematician", "ok"),
    ]
    assert len(rollout.llm_calls) == len(server.requests) == 2
    add_call, divide_call = (call for call in rollout.calls if call.kind == "tool")
    assert add_call.input == {"a": 2, "b": 3} and add_call.output == "5"
    assert "division by zero" in divide_call.error  # the text the MCP server sent
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)
    assert len(agl.transitions([rollout], roles=["mathematician"])) == 2
