"""LangGraph multi-agent systems written the way LangGraph's and LangChain's docs write them, against the mock
server: every LLM call is named by the agent making it (not by the agent factory's internal node), explicit
``agl_role`` always wins, tools are recorded with their status, and one agent's transitions can be selected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from adapter_support import timeline
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, ToolException, tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent
from langgraph.types import Command, Send

import agentlightning as agl
from agentlightning.testing import MockReply, MockRequest, MockToolCall

# create_react_agent is deprecated since LangGraph 1.0 in favour of create_agent, and still what most code calls.
pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    if b == 0:
        raise ToolException("division by zero")
    return a / b


divide.handle_tool_error = True


def system_text(request: MockRequest) -> str:
    return next((str(m["content"]) for m in request.messages if m["role"] == "system"), "")


def team_rule(request: MockRequest) -> MockReply:
    """Math agent: asks for add and divide, then answers; research agent: answers; anything else: echoes."""
    system, last = system_text(request), request.messages[-1]
    if "math" in system:
        if last["role"] == "tool":
            return MockReply(
                content="math says " + " | ".join(m["content"] for m in request.messages if m["role"] == "tool")
            )
        return MockReply(tool_calls=[MockToolCall("add", {"a": 2, "b": 3}), MockToolCall("divide", {"a": 1, "b": 0})])
    if "research" in system:
        return MockReply(content="research says hello")
    return MockReply(content=f"echo {request.last_user_text}")


def chat(llm: agl.LLM, **options: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, **options)


Factory = Callable[..., Any]


def build_agent(factory: Factory, model: Any, tools: list, name: str | None, prompt: str) -> Any:
    """``create_react_agent`` takes ``prompt=``, ``create_agent`` ``system_prompt=``; otherwise written alike."""
    if factory is create_agent:
        return create_agent(model, tools, system_prompt=prompt, name=name)
    return create_react_agent(model, tools, prompt=prompt, name=name)


FACTORIES = pytest.mark.parametrize(
    "factory", [create_react_agent, create_agent], ids=["create_react_agent", "create_agent"]
)
MATH = [
    ("llm", "math_agent", "ok"),
    ("tool", "math_agent:add", "ok"),
    ("tool", "math_agent:divide", "error"),
    ("llm", "math_agent", "ok"),
]


def shape(rollout: agl.Rollout) -> list[tuple[str, str | None, str]]:
    """The timeline with each batch of tool calls sorted (a ToolNode runs the tools of one reply concurrently)."""
    calls, batch = [], []
    for entry in [*timeline(rollout), ("end", None, "")]:
        if entry[0] == "tool":
            batch.append(entry)
            continue
        calls += sorted(batch) + [entry]
        batch = []
    return calls[:-1]


def check_calls(rollout: agl.Rollout, server: Any, model: Any) -> None:
    """Every request the server saw is captured, with the server's token ids; tools hang off their LLM call."""
    assert len(rollout.llm_calls) == len(server.requests)
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)
    llm_ids = {call.call_id: call for call in rollout.llm_calls}
    for call in rollout.calls:
        if call.kind == "tool":
            assert llm_ids[call.parent_call_id].role == call.role


@FACTORIES
def test_sub_agents_as_nodes_of_a_parent_graph(serve, factory: Factory) -> None:
    server, model = serve(team_rule)

    @agl.rollout(roles=["math_agent"])
    def team(task: dict, llm: agl.LLM) -> float:
        math_agent = build_agent(factory, chat(llm), [add, divide], "math_agent", "You are a math agent.")
        research_agent = build_agent(factory, chat(llm), [], "research_agent", "You are a research agent.")
        graph = StateGraph(MessagesState)
        graph.add_node(math_agent)
        graph.add_node(research_agent)
        graph.add_edge(START, "math_agent")
        graph.add_edge("math_agent", "research_agent")
        graph.add_edge("research_agent", END)
        state = graph.compile().invoke({"messages": [HumanMessage(task["question"])]})
        return float(state["messages"][-1].content == "research says hello")

    (rollout,) = agl.run(team, [{"id": 1, "question": "2+3 and 1/0?"}], llm=server.llm())
    assert shape(rollout) == [*MATH, ("llm", "research_agent", "ok")]
    assert rollout.final_reward == 1.0 and rollout.diagnostics == []
    add_call, divide_call = sorted((call for call in rollout.calls if call.kind == "tool"), key=lambda c: c.name)
    assert add_call.output == "5" and divide_call.error == "ToolException: division by zero"
    check_calls(rollout, server, model)
    transitions = agl.transitions([rollout], roles=["math_agent"])
    assert [t.role for t in transitions] == ["math_agent", "math_agent"]


@FACTORIES
async def test_sub_agents_async_and_streamed(serve, factory: Factory) -> None:
    server, model = serve(team_rule)

    @agl.rollout
    async def team(task: dict, llm: agl.LLM) -> float:
        math_agent = build_agent(
            factory, chat(llm, streaming=True), [add, divide], "math_agent", "You are a math agent."
        )
        research_agent = build_agent(factory, chat(llm), [], "research_agent", "You are a research agent.")
        graph = StateGraph(MessagesState)
        graph.add_node(math_agent)
        graph.add_node(research_agent)
        graph.add_edge(START, "math_agent")
        graph.add_edge("math_agent", "research_agent")
        app = graph.compile()
        tokens = [chunk async for chunk, _meta in app.astream({"messages": [("user", "go")]}, stream_mode="messages")]
        return float(bool(tokens))

    rollout = await team.aexecute({}, server.llm())
    assert shape(rollout) == [*MATH, ("llm", "research_agent", "ok")]
    check_calls(rollout, server, model)


@FACTORIES
def test_explicit_roles_always_win(serve, factory: Factory) -> None:
    server, model = serve(team_rule)

    @agl.rollout(roles=["mathematician", "judge"])
    def team(task: dict, llm: agl.LLM) -> float:
        math_agent = build_agent(factory, chat(llm), [add, divide], "math_agent", "You are a math agent.")
        research_agent = build_agent(factory, chat(llm), [], "research_agent", "You are a research agent.")
        graph = StateGraph(MessagesState)
        graph.add_node("math_agent", math_agent.with_config(metadata={"agl_role": "mathematician"}))
        graph.add_node("research_agent", research_agent.with_config(tags=["agl_role:researcher"]))
        graph.add_edge(START, "math_agent")
        graph.add_edge("math_agent", "research_agent")
        graph.compile().invoke({"messages": [("user", "go")]})
        judge = build_agent(factory, chat(llm, name="judge"), [], None, "You judge.")  # an unnamed agent
        judge.invoke({"messages": [("user", "fair?")]})
        return 1.0

    (rollout,) = agl.run(team, [{"id": 1}], llm=server.llm())
    assert shape(rollout) == [
        ("llm", "mathematician", "ok"),
        ("tool", "mathematician:add", "ok"),
        ("tool", "mathematician:divide", "error"),
        ("llm", "mathematician", "ok"),
        ("llm", "researcher", "ok"),
        ("llm", "judge", "ok"),
    ]
    assert rollout.diagnostics == []
    check_calls(rollout, server, model)


@FACTORIES
def test_supervisor_calling_sub_agents_as_tools(serve, factory: Factory) -> None:
    """The docs' supervisor pattern: the supervisor's tools invoke the sub-agents."""

    def rule(request: MockRequest) -> MockReply:
        if "supervisor" not in system_text(request):
            return team_rule(request)
        if request.messages[-1]["role"] == "tool":
            return MockReply(content="final: " + request.messages[-1]["content"])
        return MockReply(tool_calls=[MockToolCall("ask_math_agent", {"question": "2+3"})])

    server, model = serve(rule)

    @agl.rollout(roles=["supervisor"])
    def team(task: dict, llm: agl.LLM) -> float:
        math_agent = build_agent(factory, chat(llm), [add, divide], "math_agent", "You are a math agent.")

        @tool
        def ask_math_agent(question: str) -> str:
            """Ask the math agent."""
            return math_agent.invoke({"messages": [("user", question)]})["messages"][-1].content

        supervisor = build_agent(factory, chat(llm), [ask_math_agent], "supervisor", "You are a supervisor.")
        state = supervisor.invoke({"messages": [("user", task["question"])]})
        return float(state["messages"][-1].content.startswith("final: math says 5"))

    (rollout,) = agl.run(team, [{"id": 1, "question": "2+3?"}], llm=server.llm())
    assert shape(rollout) == [
        ("llm", "supervisor", "ok"),
        ("tool", "supervisor:ask_math_agent", "ok"),
        *MATH,
        ("llm", "supervisor", "ok"),
    ]
    assert rollout.final_reward == 1.0
    check_calls(rollout, server, model)
    assert [t.role for t in agl.transitions([rollout], roles=["supervisor"])] == ["supervisor", "supervisor"]


class Fan(TypedDict):
    topics: list[str]
    notes: Annotated[list[str], lambda left, right: left + right]


def test_send_fan_out_and_nodes_running_unnamed_agents(serve) -> None:
    """Send() fan-out to a node, and the multi-agent network tutorial's nodes that each run an unnamed agent."""
    server, model = serve(team_rule)

    @agl.rollout(roles=["researcher"])
    def network(task: dict, llm: agl.LLM) -> float:
        model_ = chat(llm)
        research = create_react_agent(model_, [], prompt="You are a research agent.")
        mathematics = create_agent(model_, [add, divide], system_prompt="You are a math agent.")

        def researcher(state: Fan) -> dict:
            reply = research.invoke({"messages": [("user", "look it up")]})
            return {"notes": [reply["messages"][-1].content]}

        def mathematician(state: Fan) -> dict:
            reply = mathematics.invoke({"messages": [("user", "compute")]})
            return {"notes": [reply["messages"][-1].content]}

        def writer(state: dict) -> dict:
            return {"notes": [model_.invoke(f"Write about {state['topic']}").content]}

        graph = StateGraph(Fan)
        graph.add_node("researcher", researcher)
        graph.add_node("mathematician", mathematician)
        graph.add_node("writer", writer)
        graph.add_edge(START, "researcher")
        graph.add_edge("researcher", "mathematician")
        graph.add_conditional_edges("mathematician", lambda s: [Send("writer", {"topic": t}) for t in s["topics"]])
        graph.add_edge("writer", END)
        state = graph.compile().invoke({"topics": ["a", "b", "c"], "notes": []})
        return float(len(state["notes"]) == 5)

    (rollout,) = agl.run(network, [{"id": 1}], llm=server.llm())
    roles = [
        ("llm", "mathematician", "ok"),
        ("tool", "mathematician:add", "ok"),
        ("tool", "mathematician:divide", "error"),
        ("llm", "mathematician", "ok"),
    ]
    assert shape(rollout) == [("llm", "researcher", "ok"), *roles, *[("llm", "writer", "ok")] * 3]
    assert rollout.final_reward == 1.0
    check_calls(rollout, server, model)


@FACTORIES
def test_swarm_handoffs_between_agents(serve, factory: Factory) -> None:
    """The docs' handoff tool: an agent hands the conversation to another node of the parent graph with a Command."""

    def rule(request: MockRequest) -> MockReply:
        if "alice" in system_text(request):
            return MockReply(tool_calls=[MockToolCall("transfer_to_bob", {})])
        return MockReply(content="bob here")

    server, model = serve(rule)

    @tool
    def transfer_to_bob(tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Hand the conversation over to Bob."""
        done = ToolMessage("transferred to bob", tool_call_id=tool_call_id)
        return Command(goto="bob", graph=Command.PARENT, update={"messages": [done]})

    @agl.rollout(roles=["bob"])
    def swarm(task: dict, llm: agl.LLM) -> float:
        alice = build_agent(factory, chat(llm), [transfer_to_bob], "alice", "You are alice.")
        bob = build_agent(factory, chat(llm), [], "bob", "You are bob.")
        graph = StateGraph(MessagesState)
        graph.add_node(alice, destinations=("bob",))
        graph.add_node(bob)
        graph.add_edge(START, "alice")
        state = graph.compile().invoke({"messages": [("user", "hi")]})
        return float(state["messages"][-1].content == "bob here")

    (rollout,) = agl.run(swarm, [{"id": 1}], llm=server.llm())
    assert shape(rollout) == [("llm", "alice", "ok"), ("tool", "alice:transfer_to_bob", "ok"), ("llm", "bob", "ok")]
    assert rollout.final_reward == 1.0
    check_calls(rollout, server, model)
    assert [t.role for t in agl.transitions([rollout], roles=["bob"])] == ["bob"]


@FACTORIES
def test_a_lone_unnamed_agent_is_named_by_its_node_and_its_tools_follow(serve, factory: Factory) -> None:
    server, model = serve(team_rule)

    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        build_agent(factory, chat(llm), [add, divide], None, "You are a math agent.").invoke(
            {"messages": [("user", "go")]}
        )
        return 1.0

    (rollout,) = agl.run(agent, [{"id": 1}], llm=server.llm())
    node = "agent" if factory is create_react_agent else "model"
    assert shape(rollout) == [
        ("llm", node, "ok"),
        ("tool", f"{node}:add", "ok"),
        ("tool", f"{node}:divide", "error"),
        ("llm", node, "ok"),
    ]
    check_calls(rollout, server, model)
