"""CrewAI adapter: a real crew (two agents with a role and a task each, a tool that raises) against the mock server,
run with .venv-frameworks' python (CrewAI needs openai<3), through both of CrewAI's routes to a model."""

from __future__ import annotations

from pathlib import Path

from adapter_support import timeline
from frameworks_venv import run_rollout

from agentlightning.testing import MockReply, MockRequest, MockToolCall


def crew_rule(request: MockRequest) -> MockReply:
    """The researcher looks a fact up twice (the first lookup raises) and answers; the writer answers; the rollout's
    own call after the crew is answered as a judge."""
    system = str(request.messages[0].get("content")) if request.messages else ""
    if "Researcher" in system:
        results = [m for m in request.messages if m["role"] == "tool"]
        if request.tools and not results:
            return MockReply(tool_calls=[MockToolCall(name="lookup_fact", arguments={"topic": "electric bikes"})])
        if request.tools and len(results) == 1:
            return MockReply(tool_calls=[MockToolCall(name="lookup_fact", arguments={"topic": "e-bikes"})])
        return MockReply(content="E-bikes ride 80 km on one charge.")
    if "Writer" in system:
        return MockReply(content="Ride 80 km on one charge: go electric.")
    return MockReply(content="Good slogan.")


def test_crew_through_the_native_openai_provider(serve, tmp_path: Path) -> None:
    server, model = serve(crew_rule)
    rollout = run_rollout("crewai_agents.py", "native_provider", server.llm(), tmp_path)
    assert timeline(rollout) == [
        ("llm", "Researcher", "ok"),
        ("tool", "Researcher:lookup_fact", "error"),
        ("llm", "Researcher", "ok"),
        ("tool", "Researcher:lookup_fact", "ok"),
        ("llm", "Researcher", "ok"),
        ("llm", "Writer", "ok"),
        ("llm", None, "ok"),  # the rollout's own call after the crew: the crew's roles end with it
    ]
    assert rollout.final_reward == 1.0
    assert len(rollout.llm_calls) == len(model.served) == 5  # each request once
    first, failed, second, looked_up, *_ = rollout.calls
    assert failed.input == {"topic": "electric bikes"} and failed.parent_call_id == first.call_id
    assert failed.error == "Error executing tool: no fact about 'electric bikes'"
    assert looked_up.output == "e-bikes ride 80 km on one charge" and looked_up.parent_call_id == second.call_id
    assert {call.metadata["adapter"] for call in rollout.calls if call.kind == "tool"} == {"crewai"}
    assert not any("litellm_model" in call.metadata for call in rollout.llm_calls)  # the native provider, not LiteLLM
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_crew_with_a_streaming_model(serve, tmp_path: Path) -> None:
    server, model = serve(crew_rule)
    rollout = run_rollout("crewai_agents.py", "streamed", server.llm(), tmp_path)
    assert timeline(rollout) == [
        ("llm", "Researcher", "ok"),
        ("tool", "Researcher:lookup_fact", "error"),
        ("llm", "Researcher", "ok"),
        ("tool", "Researcher:lookup_fact", "ok"),
        ("llm", "Researcher", "ok"),
        ("llm", "Writer", "ok"),
    ]
    assert all(call.metadata["stream"] for call in rollout.llm_calls)
    assert len(rollout.llm_calls) == len(model.served) == 4
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_crew_through_litellm(serve, tmp_path: Path) -> None:
    """``LLM(..., is_litellm=True)``: LiteLLM sends through the openai client's ``client.post``, recorded once each."""
    server, model = serve(crew_rule)
    rollout = run_rollout("crewai_agents.py", "through_litellm", server.llm(), tmp_path)
    assert timeline(rollout) == [("llm", "Researcher", "ok"), ("llm", "Writer", "ok")]
    assert len(rollout.llm_calls) == len(model.served) == 2
    assert {call.metadata["litellm_model"] for call in rollout.llm_calls} == {f"openai/{server.llm().model}"}
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def delegation_rule(request: MockRequest) -> MockReply:
    """The editor delegates the slogan to the writer with CrewAI's coworker tool, then answers with it."""
    system = str(request.messages[0].get("content")) if request.messages else ""
    if "Editor" in system and not [m for m in request.messages if m["role"] == "tool"]:
        arguments = {"task": "Write a slogan about e-bikes", "context": "They ride 80 km.", "coworker": "Writer"}
        return MockReply(tool_calls=[MockToolCall(name="delegate_work_to_coworker", arguments=arguments)])
    if "Editor" in system:
        return MockReply(content="Ride 80 km on one charge: go electric.")
    return MockReply(content="Ride 80 km on one charge.")


def test_delegation_names_the_coworkers_calls(serve, tmp_path: Path) -> None:
    server, model = serve(delegation_rule)
    rollout = run_rollout("crewai_agents.py", "delegation", server.llm(), tmp_path)
    assert timeline(rollout) == [
        ("llm", "Editor", "ok"),
        ("tool", "Editor:delegate_work_to_coworker", "ok"),  # ordered by start: the tool runs the writer
        ("llm", "Writer", "ok"),
        ("llm", "Editor", "ok"),
    ]
    delegate_call, delegated = rollout.calls[:2]
    assert delegated.parent_call_id == delegate_call.call_id and delegated.input["coworker"] == "Writer"
    assert len(rollout.llm_calls) == len(model.served) == 3
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_uninstrument_leaves_plain_capture(serve, tmp_path: Path) -> None:
    """Without the adapter every call is still captured once (through the openai client) but names no agent."""
    server, model = serve(crew_rule)
    rollout = run_rollout("crewai_agents.py", "uninstrumented", server.llm(), tmp_path)
    assert [(call.kind, call.role) for call in rollout.calls] == [("llm", None)] * 5
    assert len(model.served) == 5  # the second rollout sent the first one's five prompts again
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)
