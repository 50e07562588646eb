"""LlamaIndex adapter: a real ``AgentWorkflow`` (two ``FunctionAgent`` s handing off, a tool that raises, streamed
events) and a single ``FunctionAgent`` against the mock server, run with .venv-frameworks' python
(llama-index-llms-openai needs openai<3)."""

from __future__ import annotations

from pathlib import Path

from adapter_support import timeline
from frameworks_venv import run_rollout

from agentlightning.testing import MockReply, MockRequest, MockToolCall


def tool_results(request: MockRequest) -> list[dict]:
    return [m for m in request.messages if m["role"] == "tool"]


def workflow_rule(request: MockRequest) -> MockReply:
    """The research agent looks a fact up twice (the first lookup raises), then hands off; the write agent answers."""
    system = str(request.messages[0].get("content")) if request.messages else ""
    results = tool_results(request)
    if system.startswith("You research") and len(results) < 2:
        topic = "e-bikes" if results else "electric bikes"
        return MockReply(tool_calls=[MockToolCall(name="lookup_fact", arguments={"topic": topic})])
    if system.startswith("You research"):
        arguments = {"to_agent": "WriteAgent", "reason": "The facts are in."}
        return MockReply(tool_calls=[MockToolCall(name="handoff", arguments=arguments)])
    return MockReply(content="Ride 80 km on one charge: go electric.")


def test_agent_workflow_with_a_handoff_and_a_tool_that_raises(serve, tmp_path: Path) -> None:
    server, model = serve(workflow_rule)
    rollout = run_rollout("llama_index_agents.py", "workflow", server.llm(), tmp_path)
    assert timeline(rollout) == [
        ("llm", "ResearchAgent", "ok"),
        ("tool", "ResearchAgent:lookup_fact", "error"),
        ("llm", "ResearchAgent", "ok"),
        ("tool", "ResearchAgent:lookup_fact", "ok"),
        ("llm", "ResearchAgent", "ok"),
        ("tool", "ResearchAgent:handoff", "ok"),
        ("llm", "WriteAgent", "ok"),
    ]
    assert rollout.final_reward == 1.0
    assert len(rollout.llm_calls) == len(model.served) == 4
    first, failed, second, looked_up, third, handoff, _ = rollout.calls
    assert failed.error == "LookupError: no fact about 'electric bikes'"
    assert failed.input == {"topic": "electric bikes"} and failed.parent_call_id == first.call_id
    assert looked_up.output == "e-bikes ride 80 km on one charge" and looked_up.parent_call_id == second.call_id
    assert handoff.input["to_agent"] == "WriteAgent" and handoff.parent_call_id == third.call_id
    assert {call.metadata["adapter"] for call in rollout.calls if call.kind == "tool"} == {"llama_index"}
    assert all(call.metadata.get("stream") for call in rollout.llm_calls)  # FunctionAgent streams by default
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def weather_rule(request: MockRequest) -> MockReply:
    """Two tool calls in one answer (the agent runs them as concurrent steps), then the answer."""
    if not tool_results(request):
        cities = [MockToolCall(name="get_weather", arguments={"city": city}) for city in ("Paris", "Oslo")]
        return MockReply(tool_calls=cities)
    return MockReply(content="It is sunny in both.")


def test_function_agent_not_streamed_with_two_tool_calls_at_once(serve, tmp_path: Path) -> None:
    server, model = serve(weather_rule)
    rollout = run_rollout("llama_index_agents.py", "function_agent", server.llm(), tmp_path)
    assert timeline(rollout) == [
        ("llm", "WeatherAgent", "ok"),
        ("tool", "WeatherAgent:get_weather", "ok"),
        ("tool", "WeatherAgent:get_weather", "ok"),
        ("llm", "WeatherAgent", "ok"),
    ]
    first, *tools, _ = rollout.calls
    assert sorted(tool.output for tool in tools) == ["sunny in Oslo", "sunny in Paris"]
    requested = {call["id"] for call in first.output["tool_calls"]}
    assert {tool.metadata["tool_call_id"] for tool in tools} == requested
    assert all(tool.parent_call_id == first.call_id for tool in tools)
    assert not any(call.metadata.get("stream") for call in rollout.llm_calls)
    assert len(rollout.llm_calls) == len(model.served) == 2
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_uninstrument_leaves_plain_capture(serve, tmp_path: Path) -> None:
    """Without the adapter every call is still captured once (through the openai client) but names no agent."""
    server, model = serve(weather_rule)
    rollout = run_rollout("llama_index_agents.py", "uninstrumented", server.llm(), tmp_path)
    assert [(call.kind, call.role) for call in rollout.calls] == [("llm", None), ("llm", None)]
    assert len(rollout.llm_calls) == len(model.served) == 2  # the second rollout sent the first one's two prompts again
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)
