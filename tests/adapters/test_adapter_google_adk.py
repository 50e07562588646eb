"""Google ADK adapter: real ``LlmAgent`` objects on ``LiteLlm(model="openai/...")`` (a coordinator with sub-agents
it transfers to and an ``AgentTool``, a tool that raises with and without ``ReflectAndRetryToolPlugin``, the sync
``Runner.run`` with SSE streaming, the ``SequentialAgent`` / ``ParallelAgent`` / ``LoopAgent`` workflows of ADK's docs)
against the mock server, through ``@agl.rollout``."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM would fetch its price list at import

import pytest  # noqa: E402
from adapter_support import RecordingModel, timeline  # noqa: E402
from google.adk.agents import LlmAgent, LoopAgent, ParallelAgent, SequentialAgent  # noqa: E402
from google.adk.agents.run_config import RunConfig, StreamingMode  # noqa: E402
from google.adk.apps import App  # noqa: E402
from google.adk.models.lite_llm import LiteLlm  # noqa: E402
from google.adk.plugins import ReflectAndRetryToolPlugin  # noqa: E402
from google.adk.runners import InMemoryRunner, Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService  # noqa: E402
from google.adk.tools.agent_tool import AgentTool  # noqa: E402
from google.adk.tools.tool_context import ToolContext  # noqa: E402
from google.genai import types  # noqa: E402

import agentlightning as agl  # noqa: E402
from agentlightning.protocol import ROLE_HEADER  # noqa: E402
from agentlightning.testing import MockLLMServer, MockReply, MockRequest, MockToolCall  # noqa: E402


@pytest.fixture(autouse=True)
def instrumented() -> None:
    agl.instrument("google_adk")


def model_for(llm: agl.LLM) -> LiteLlm:
    return LiteLlm(model=f"openai/{llm.model}", api_base=llm.base_url, api_key=llm.api_key)


def check_order(order_id: str) -> dict:
    """Looks up the status of an order.

    Args:
        order_id: The order's id.
    """
    return {"status": "success", "order": order_id, "state": "delivered damaged"}


def refund(order_id: str) -> dict:
    """Refunds an order.

    Args:
        order_id: The order's id.
    """
    return {"status": "success", "refunded": order_id}


def help_desk(llm: agl.LLM) -> LlmAgent:
    """ADK's coordinator pattern: a router with sub-agents it transfers to, and an agent used as a tool."""
    model = model_for(llm)
    billing = LlmAgent(
        name="billing",
        model=model,
        instruction="You handle billing: refunds and payments.",
        description="Handles refunds and payments.",
        tools=[refund],
    )
    support = LlmAgent(
        name="support",
        model=model,
        instruction="You handle technical problems.",
        description="Handles technical problems.",
    )
    summarizer = LlmAgent(name="summarizer", model=model, instruction="You summarize text in one sentence.")
    return LlmAgent(
        name="help_desk",
        model=model,
        instruction="You route requests: billing for payments and refunds, support for technical problems.",
        description="Main help desk router.",
        tools=[check_order, AgentTool(agent=summarizer)],
        sub_agents=[billing, support],
    )


def text_of(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def help_desk_rule(request: MockRequest) -> MockReply:
    """The router looks the order up, has it summarized, and transfers to billing, which refunds it."""
    system, last = text_of(request.messages[0]), text_of(request.messages[-1])
    if system.startswith("You summarize"):
        return MockReply(content="The order arrived damaged.")
    if system.startswith("You handle billing"):
        if "refunded" in last:
            return MockReply(content="Your order A1 is refunded.")
        return MockReply(tool_calls=[MockToolCall(name="refund", arguments={"order_id": "A1"})])
    if "delivered damaged" in last:
        return MockReply(tool_calls=[MockToolCall(name="summarizer", arguments={"request": last})])
    if "arrived damaged" in last:
        return MockReply(tool_calls=[MockToolCall(name="transfer_to_agent", arguments={"agent_name": "billing"})])
    return MockReply(tool_calls=[MockToolCall(name="check_order", arguments={"order_id": "A1"})])


HELP_DESK_TIMELINE = [
    ("llm", "help_desk", "ok"),
    ("tool", "help_desk:check_order", "ok"),
    ("llm", "help_desk", "ok"),
    ("tool", "help_desk:summarizer", "ok"),  # the AgentTool starts before the model call of the agent it runs
    ("llm", "summarizer", "ok"),
    ("llm", "help_desk", "ok"),
    ("tool", "help_desk:transfer_to_agent", "ok"),
    ("llm", "billing", "ok"),
    ("tool", "billing:refund", "ok"),
    ("llm", "billing", "ok"),
]


def user_message(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


async def final_text(runner: Runner, text: str, run_config: RunConfig | None = None) -> str:
    """Run one turn the way ADK's quick-start does, keeping the final response's text."""
    session = await runner.session_service.create_session(app_name=runner.app_name, user_id="user")
    answer = ""
    async for event in runner.run_async(
        user_id="user", session_id=session.id, new_message=user_message(text), run_config=run_config
    ):
        if event.is_final_response() and event.content and event.content.parts:
            answer = "".join(part.text or "" for part in event.content.parts)
    return answer


def assert_served_exactly(rollout: agl.Rollout, server: MockLLMServer, model: RecordingModel) -> None:
    """One captured LLM call per request served, each with the server's token ids and the role it was sent with."""
    assert len(rollout.llm_calls) == len(server.requests)
    assert [request.headers.get(ROLE_HEADER.lower()) for request in server.requests] == [
        call.role for call in rollout.llm_calls
    ]
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def assert_parents_by_tool_call_id(rollout: agl.Rollout) -> None:
    """Each tool call's parent is the LLM call whose output asked for it, matched by ADK's function-call id."""
    by_id = {call.call_id: call for call in rollout.llm_calls}
    for call in rollout.calls:
        if call.kind == "tool":
            parent = by_id[call.parent_call_id]
            asked = [item["id"] for item in parent.output["tool_calls"]]
            assert call.metadata["tool_call_id"] in asked


async def test_coordinator_with_sub_agents_and_an_agent_tool(serve) -> None:
    server, model = serve(help_desk_rule)

    @agl.rollout(reward=lambda task, out: float("refunded" in out))
    async def agent(task: dict, llm: agl.LLM) -> str:
        runner = InMemoryRunner(agent=help_desk(llm), app_name="help_desk")
        return await final_text(runner, task["request"])

    rollout = await agent.aexecute({"request": "Order A1: I want my money back."}, server.llm())
    assert timeline(rollout) == HELP_DESK_TIMELINE
    assert rollout.final_reward == 1.0
    assert_served_exactly(rollout, server, model)
    assert_parents_by_tool_call_id(rollout)
    calls = rollout.calls
    assert calls[1].input == {"order_id": "A1"} and calls[1].output["state"] == "delivered damaged"
    assert calls[3].metadata["agent_tool"] is True and calls[3].output == "The order arrived damaged."
    assert calls[6].input == {"agent_name": "billing"} and calls[6].metadata["agent_tool"] is False
    assert {call.metadata["adapter"] for call in calls if call.kind == "tool"} == {"google_adk"}


def get_weather(city: str) -> dict:
    """Returns the current weather report of a city.

    Args:
        city: The city's name.
    """
    if city == "Atlantis":
        raise ValueError("no weather station in Atlantis")
    return {"status": "success", "report": f"sunny in {city}"}


def weather_rule(request: MockRequest) -> MockReply:
    last = text_of(request.messages[-1])
    if "sunny in Paris" in last:
        return MockReply(content="It is sunny in Paris.")
    if "no weather station" in last:  # the tool's error, as the retry plugin reports it
        return MockReply(tool_calls=[MockToolCall(name="get_weather", arguments={"city": "Paris"})])
    return MockReply(tool_calls=[MockToolCall(name="get_weather", arguments={"city": "Atlantis"})])


def forecaster(llm: agl.LLM) -> LlmAgent:
    return LlmAgent(name="forecaster", model=model_for(llm), instruction="You tell the weather.", tools=[get_weather])


async def test_tool_that_raises_recovered_by_the_reflect_and_retry_plugin(serve) -> None:
    """The user's ReflectAndRetryToolPlugin answers the model in the tool's place; the tool call is still failed."""
    server, model = serve(weather_rule)

    @agl.rollout(reward=lambda task, out: float("sunny" in out))
    async def agent(task: dict, llm: agl.LLM) -> str:
        app = App(name="weather", root_agent=forecaster(llm), plugins=[ReflectAndRetryToolPlugin(max_retries=2)])
        return await final_text(Runner(app=app, session_service=InMemorySessionService()), task["question"])

    rollout = await agent.aexecute({"question": "What is the weather in Atlantis, or else in Paris?"}, server.llm())
    assert timeline(rollout) == [
        ("llm", "forecaster", "ok"),
        ("tool", "forecaster:get_weather", "error"),
        ("llm", "forecaster", "ok"),
        ("tool", "forecaster:get_weather", "ok"),
        ("llm", "forecaster", "ok"),
    ]
    failed, recovered = rollout.calls[1], rollout.calls[3]
    assert failed.input == {"city": "Atlantis"} and failed.error == "ValueError: no weather station in Atlantis"
    assert recovered.output == {"status": "success", "report": "sunny in Paris"}
    assert rollout.final_reward == 1.0
    assert_served_exactly(rollout, server, model)
    assert_parents_by_tool_call_id(rollout)


async def test_tool_that_raises_fails_the_run_and_keeps_what_ran(serve) -> None:
    """Without a plugin that handles it, ADK ends the run with the tool's error: the rollout fails, with its calls."""
    server, model = serve(weather_rule)

    @agl.rollout(reward=lambda task, out: 1.0)
    async def agent(task: dict, llm: agl.LLM) -> str:
        return await final_text(InMemoryRunner(agent=forecaster(llm), app_name="weather"), task["question"])

    rollout = await agent.aexecute({"question": "Weather in Atlantis?"}, server.llm())
    assert rollout.status == "failed" and "no weather station in Atlantis" in str(rollout.error)
    assert [(call.kind, call.role, call.status) for call in rollout.calls] == [
        ("llm", "forecaster", "ok"),
        ("tool", "forecaster", "error"),
    ]
    assert rollout.calls[1].parent_call_id == rollout.calls[0].call_id
    assert_served_exactly(rollout, server, model)


def test_sync_run_with_sse_streaming_and_a_runner_built_before_the_rollout(serve) -> None:
    """``Runner.run`` (ADK runs the invocation on its own thread) with streamed model output; the runner is built
    once, outside the rollout, as an app module would."""
    server, model = serve(help_desk_rule)
    runner = InMemoryRunner(agent=help_desk(server.llm()), app_name="help_desk")
    streaming = RunConfig(streaming_mode=StreamingMode.SSE)

    @agl.rollout(reward=lambda task, out: float("refunded" in out))
    def agent(task: dict, llm: agl.LLM) -> str:
        session = runner.session_service.create_session_sync(app_name="help_desk", user_id="user")
        answer = ""
        for event in runner.run(
            user_id="user", session_id=session.id, new_message=user_message(task["request"]), run_config=streaming
        ):
            if event.is_final_response() and event.content and event.content.parts:
                answer = "".join(part.text or "" for part in event.content.parts)
        return answer

    rollout = agent.execute({"request": "Order A1: I want my money back."}, server.llm())
    assert timeline(rollout) == HELP_DESK_TIMELINE
    # streamed, but for the summarizer's call: AgentTool runs its agent without streaming
    assert [request.stream for request in server.requests] == [True, True, False, True, True, True]
    assert_served_exactly(rollout, server, model)
    assert_parents_by_tool_call_id(rollout)


async def test_uninstrument_leaves_plain_capture(serve) -> None:
    """Without the adapter every call is still captured (through LiteLLM's openai client), with no names or tools."""
    server, _ = serve(help_desk_rule)

    @agl.rollout(reward=lambda task, out: float("refunded" in out))
    async def agent(task: dict, llm: agl.LLM) -> str:
        return await final_text(InMemoryRunner(agent=help_desk(llm), app_name="help_desk"), task["request"])

    agl.uninstrument("google_adk")
    try:
        rollout = await agent.aexecute({"request": "Order A1: I want my money back."}, server.llm())
    finally:
        agl.instrument("google_adk")
    assert [(call.kind, call.role) for call in rollout.calls] == [("llm", None)] * len(server.requests)
    assert len(server.requests) == 6


def two_cities_rule(request: MockRequest) -> MockReply:
    if request.messages[-1]["role"] == "tool":
        return MockReply(content="Sunny in both.")
    return MockReply(
        tool_calls=[
            MockToolCall(name="get_weather", arguments={"city": "Paris"}),
            MockToolCall(name="get_weather", arguments={"city": "Rome"}),
        ]
    )


async def test_parallel_function_calls_of_one_model_call(serve) -> None:
    """ADK runs the function calls of one model response concurrently, each in its own task."""
    server, model = serve(two_cities_rule)

    @agl.rollout(reward=lambda task, out: float("Sunny" in out))
    async def agent(task: dict, llm: agl.LLM) -> str:
        return await final_text(InMemoryRunner(agent=forecaster(llm), app_name="weather"), task["question"])

    rollout = await agent.aexecute({"question": "Weather in Paris and Rome?"}, server.llm())
    first, second = rollout.llm_calls
    tools = [call for call in rollout.calls if call.kind == "tool"]
    assert sorted((call.input["city"], call.role, call.status) for call in tools) == [
        ("Paris", "forecaster", "ok"),
        ("Rome", "forecaster", "ok"),
    ]
    assert all(call.parent_call_id == first.call_id for call in tools)
    assert (first.role, second.role) == ("forecaster", "forecaster")
    assert_served_exactly(rollout, server, model)
    assert_parents_by_tool_call_id(rollout)


def workflow_rule(request: MockRequest) -> MockReply:
    """Each workflow agent answers by its instruction; the critic ends the loop (``exit_loop``) on its second look."""
    system, last = text_of(request.messages[0]), text_of(request.messages[-1])
    if system.startswith("You write"):
        return MockReply(content="def add(a, b): return a + b")
    if system.startswith("You review"):
        return MockReply(content="Add a docstring.")
    if system.startswith("You refactor"):
        return MockReply(content='def add(a, b):\n    """Adds."""\n    return a + b')
    if system.startswith("You research"):
        topic = system.split("You research ", 1)[1].split(".", 1)[0]
        return MockReply(content=f"Findings on {topic}.")
    if system.startswith("You merge"):
        return MockReply(content="Report: " + " ".join(sorted(s for s in system.split() if s.startswith("Findings"))))
    if system.startswith("You critique"):
        if "exit_loop" in last or request.messages[-1]["role"] == "tool":
            return MockReply(content="Done.")
        if "Draft 2" in system:
            return MockReply(tool_calls=[MockToolCall(name="exit_loop", arguments={})])
        return MockReply(content="Make it shorter.")
    if system.startswith("You draft"):
        drafts = "Draft 2" if "Make it shorter" in system else "Draft 1"
        return MockReply(content=drafts)
    raise AssertionError(f"unexpected request: {system[:80]!r}")


def code_pipeline(llm: agl.LLM) -> SequentialAgent:
    """ADK's sequential pipeline: write, review, refactor, each reading the state the one before wrote."""
    model = model_for(llm)
    writer = LlmAgent(name="code_writer", model=model, instruction="You write Python code.", output_key="code")
    reviewer = LlmAgent(
        name="code_reviewer", model=model, instruction="You review this code: {code}", output_key="review"
    )
    refactorer = LlmAgent(
        name="code_refactorer", model=model, instruction="You refactor {code} following {review}", output_key="final"
    )
    return SequentialAgent(name="code_pipeline", sub_agents=[writer, reviewer, refactorer])


async def test_sequential_agent_names_each_step(serve) -> None:
    server, model = serve(workflow_rule)

    @agl.rollout(reward=lambda task, out: float("Adds" in out))
    async def agent(task: dict, llm: agl.LLM) -> str:
        return await final_text(InMemoryRunner(agent=code_pipeline(llm), app_name="code"), task["request"])

    rollout = await agent.aexecute({"request": "A function that adds two numbers."}, server.llm())
    assert timeline(rollout) == [
        ("llm", "code_writer", "ok"),
        ("llm", "code_reviewer", "ok"),
        ("llm", "code_refactorer", "ok"),
    ]
    assert rollout.final_reward == 1.0
    assert_served_exactly(rollout, server, model)


def research_team(llm: agl.LLM) -> SequentialAgent:
    """ADK's parallel research pattern: researchers run concurrently, then one agent merges what they wrote."""
    model = model_for(llm)
    topics = ["energy", "transport", "farming"]
    researchers = [
        LlmAgent(
            name=f"{topic}_researcher",
            model=model,
            instruction=f"You research {topic}. Answer in one sentence.",
            output_key=f"{topic}_findings",
        )
        for topic in topics
    ]
    merger = LlmAgent(
        name="merger",
        model=model,
        instruction="You merge these findings: " + " ".join(f"{{{topic}_findings}}" for topic in topics),
    )
    parallel = ParallelAgent(name="research", sub_agents=researchers)
    return SequentialAgent(name="research_pipeline", sub_agents=[parallel, merger])


async def test_parallel_agent_names_each_branch(serve) -> None:
    server, model = serve(workflow_rule)

    @agl.rollout(reward=lambda task, out: float(out.count("Findings") == 3))
    async def agent(task: dict, llm: agl.LLM) -> str:
        return await final_text(InMemoryRunner(agent=research_team(llm), app_name="research"), task["request"])

    rollout = await agent.aexecute({"request": "Research sustainable technology."}, server.llm())
    roles = [call.role for call in rollout.llm_calls]
    assert sorted(roles[:3]) == ["energy_researcher", "farming_researcher", "transport_researcher"]
    assert roles[3:] == ["merger"] and rollout.status == "succeeded"
    assert rollout.final_reward == 1.0
    assert len(rollout.llm_calls) == len(server.requests) == 4
    # each branch's request went out under its own name (the branches run concurrently, in any order)
    assert sorted(str(request.headers.get(ROLE_HEADER.lower())) for request in server.requests) == sorted(roles)
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def exit_loop(tool_context: ToolContext) -> dict:
    """Call this function only when the critique says no further changes are needed."""
    tool_context.actions.escalate = True
    return {}


def refinement_loop(llm: agl.LLM) -> LoopAgent:
    """ADK's iterative refinement: a drafter and a critic in a loop the critic ends with a tool. (ADK 2.13 marks
    LoopAgent deprecated in favour of its Workflow, which cannot yet be an LlmAgent's sub-agent; its docs still
    teach this one.)"""
    model = model_for(llm)
    drafter = LlmAgent(
        name="drafter", model=model, instruction="You draft a slogan. Critique so far: {critique?}", output_key="draft"
    )
    critic = LlmAgent(
        name="critic",
        model=model,
        instruction="You critique this draft: {draft}. Call exit_loop if it needs no change.",
        tools=[exit_loop],
        output_key="critique",
    )
    return LoopAgent(name="refinement", sub_agents=[drafter, critic], max_iterations=4)


@pytest.mark.filterwarnings("ignore:LoopAgent is deprecated:DeprecationWarning")
async def test_loop_agent_names_each_iteration_and_the_tool_that_ends_it(serve) -> None:
    server, model = serve(workflow_rule)

    @agl.rollout(reward=lambda task, out: 1.0)
    async def agent(task: dict, llm: agl.LLM) -> str:
        return await final_text(InMemoryRunner(agent=refinement_loop(llm), app_name="slogan"), task["request"])

    rollout = await agent.aexecute({"request": "A slogan for a bakery."}, server.llm())
    assert timeline(rollout) == [
        ("llm", "drafter", "ok"),
        ("llm", "critic", "ok"),
        ("llm", "drafter", "ok"),
        ("llm", "critic", "ok"),
        ("tool", "critic:exit_loop", "ok"),
        ("llm", "critic", "ok"),  # ADK gives the tool's response to the critic, then ends the loop (escalate)
    ]
    assert rollout.calls[4].parent_call_id == rollout.calls[3].call_id
    assert_served_exactly(rollout, server, model)
    assert_parents_by_tool_call_id(rollout)
