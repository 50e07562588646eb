"""smolagents adapter: real ``CodeAgent`` / ``ToolCallingAgent`` objects on ``OpenAIServerModel`` (a manager agent
running a managed web agent, a tool that raises, ``run(stream=True)`` read to the end and left early, streamed model
output) against the mock server, through ``@agl.rollout``."""

from __future__ import annotations

import pytest
from adapter_support import RecordingModel, timeline
from smolagents import CodeAgent, OpenAIServerModel, Tool, ToolCallingAgent, tool
from smolagents.memory import ActionStep

import agentlightning as agl
from agentlightning.protocol import ROLE_HEADER
from agentlightning.testing import MockLLMServer, MockReply, MockRequest, MockToolCall


@pytest.fixture(autouse=True)
def instrumented() -> None:
    agl.instrument("smolagents")


def model_for(llm: agl.LLM) -> OpenAIServerModel:
    return OpenAIServerModel(model_id=llm.model, api_base=llm.base_url, api_key=llm.api_key)


def request_text(request: MockRequest) -> str:
    """What the agent sent after its system prompt, as text (smolagents sends content as lists of text parts)."""
    parts = []
    for message in request.messages[1:]:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        parts.append(str(content or ""))
    return "\n".join(parts)


@tool
def web_search(query: str) -> str:
    """Searches the web and returns the top results.

    Args:
        query: The search query.
    """
    return "1. https://broken.example/answer\n2. https://example.org/answer"


@tool
def visit_webpage(url: str) -> str:
    """Visits a webpage at the given url and returns its content.

    Args:
        url: The url of the webpage to visit.
    """
    if "broken" in url:
        raise ConnectionError(f"could not reach {url}")
    return f"Content of {url}: the answer is 42."


def team(llm: agl.LLM, **manager_options) -> CodeAgent:
    """The multi-agent example of smolagents' docs: a CodeAgent manager running a ToolCallingAgent web agent."""
    model = model_for(llm)
    web_agent = ToolCallingAgent(
        tools=[web_search, visit_webpage],
        model=model,
        max_steps=6,
        name="web_search_agent",
        description="Runs web searches for you. Give it your query as an argument.",
    )
    return CodeAgent(tools=[], model=model, managed_agents=[web_agent], max_steps=4, **manager_options)


def team_rule(request: MockRequest) -> MockReply:
    """The manager asks its web agent; the web agent searches, visits a broken page (the tool raises), visits another
    one and answers; the manager then gives the final answer from code."""
    text = request_text(request)
    if request.tools:  # the web agent calls tools
        if "the answer is 42" in text:
            return MockReply(tool_calls=[MockToolCall(name="final_answer", arguments={"answer": "42"})])
        if "could not reach" in text:
            return MockReply(
                tool_calls=[MockToolCall(name="visit_webpage", arguments={"url": "https://example.org/answer"})]
            )
        if "https://example.org" in text:
            return MockReply(
                tool_calls=[MockToolCall(name="visit_webpage", arguments={"url": "https://broken.example/answer"})]
            )
        return MockReply(tool_calls=[MockToolCall(name="web_search", arguments={"query": "the answer"})])
    if "final answer from your managed agent" in text:
        return MockReply(content="Thought: I have it.\n<code>\nfinal_answer(answer)\n</code>")
    code = 'answer = web_search_agent(task="Find the answer")\nprint(answer)'
    return MockReply(content=f"Thought: I ask my web agent.\n<code>\n{code}\n</code>")


TEAM_TIMELINE = [
    ("llm", None, "ok"),  # the manager, unnamed as in the docs, writes code that calls its managed agent
    ("tool", "None:web_search_agent", "ok"),
    ("llm", "web_search_agent", "ok"),
    ("tool", "web_search_agent:web_search", "ok"),
    ("llm", "web_search_agent", "ok"),
    ("tool", "web_search_agent:visit_webpage", "error"),
    ("llm", "web_search_agent", "ok"),
    ("tool", "web_search_agent:visit_webpage", "ok"),
    ("llm", "web_search_agent", "ok"),
    ("tool", "web_search_agent:final_answer", "ok"),
    ("llm", None, "ok"),
    ("tool", "None:final_answer", "ok"),
]


def named_manager(expected: list[tuple[str, str | None, str]]) -> list[tuple[str, str, str]]:
    """``expected`` with the manager agent named ``manager``."""
    return [(kind, (who or "None").replace("None", "manager"), status) for kind, who, status in expected]


def assert_served_exactly(rollout: agl.Rollout, server: MockLLMServer, model: RecordingModel) -> None:
    """One captured LLM call per request served, each with the server's token ids and the role it was sent with."""
    assert len(rollout.llm_calls) == len(server.requests)
    assert [request.headers.get(ROLE_HEADER.lower()) for request in server.requests] == [
        call.role for call in rollout.llm_calls
    ]
    for call in rollout.llm_calls:
        model.assert_server_token_ids(call)


def test_manager_runs_a_managed_agent_whose_tool_raises(serve) -> None:
    server, model = serve(team_rule)

    @agl.rollout(reward=lambda task, out: float(str(out).endswith("42")))
    def agent(task: dict, llm: agl.LLM) -> str:
        return team(llm).run(task["question"])

    rollout = agent.execute({"question": "What is the answer?"}, server.llm())
    assert timeline(rollout) == TEAM_TIMELINE
    assert rollout.final_reward == 1.0
    assert_served_exactly(rollout, server, model)
    calls = rollout.calls
    managed, broken = calls[1], calls[5]
    assert managed.input == {"task": "Find the answer"} and managed.metadata["managed_agent"] is True
    assert "42" in managed.output and managed.parent_call_id == calls[0].call_id
    assert broken.input == {"url": "https://broken.example/answer"}
    assert broken.error == "ConnectionError: could not reach https://broken.example/answer"
    assert broken.parent_call_id == calls[4].call_id
    for tool_call, asked_by in [(calls[3], calls[2]), (calls[7], calls[6]), (calls[9], calls[8])]:
        assert tool_call.parent_call_id == asked_by.call_id and tool_call.metadata["managed_agent"] is False
    # the manager's final_answer comes from its own second model call, not from the web agent's last one
    assert calls[11].parent_call_id == calls[10].call_id and calls[11].output == managed.output
    assert {call.metadata["adapter"] for call in rollout.calls if call.kind == "tool"} == {"smolagents"}


def test_an_unnamed_manager_keeps_the_role_around_it(serve) -> None:
    server, model = serve(team_rule)

    @agl.rollout(reward=lambda task, out: float(str(out).endswith("42")))
    def agent(task: dict, llm: agl.LLM) -> str:
        with agl.role("manager"):
            return team(llm).run(task["question"])

    rollout = agent.execute({"question": "What is the answer?"}, server.llm())
    assert timeline(rollout) == named_manager(TEAM_TIMELINE)
    assert rollout.calls[11].parent_call_id == rollout.calls[10].call_id
    assert_served_exactly(rollout, server, model)


def test_run_stream_read_to_the_end_and_left_early(serve) -> None:
    """``run(stream=True)`` yields steps as they run (the model's output streamed too, ``stream_outputs=True``);
    each step's calls carry the agent's name whether the caller reads every step or stops after the first."""
    server, model = serve(team_rule)

    @agl.rollout(reward=lambda task, out: float(out == "42"))
    def full(task: dict, llm: agl.LLM) -> str:
        steps = list(team(llm, name="manager", stream_outputs=True).run(task["question"], stream=True))
        return str(steps[-1].output)

    rollout = full.execute({"question": "What is the answer?"}, server.llm())
    assert timeline(rollout) == named_manager(TEAM_TIMELINE)
    assert all(request.stream for request in server.requests if not request.tools)  # the manager's calls streamed
    assert_served_exactly(rollout, server, model)

    server, model = serve(team_rule)

    @agl.rollout(reward=lambda task, out: float(bool(out)))
    def early(task: dict, llm: agl.LLM) -> str:
        for step in team(llm, name="manager").run(task["question"], stream=True):
            if isinstance(step, ActionStep):
                return str(step.observations)
        return ""

    rollout = early.execute({"question": "What is the answer?"}, server.llm())
    assert timeline(rollout) == named_manager(TEAM_TIMELINE[:10])
    assert rollout.final_reward == 1.0
    assert_served_exactly(rollout, server, model)


class WordCounter(Tool):
    """A tool written as a ``Tool`` subclass, called from a CodeAgent's code with a positional argument."""

    name = "count_words"
    description = "Counts the words of a text."
    inputs = {"text": {"type": "string", "description": "The text."}}
    output_type = "integer"

    def forward(self, text: str) -> int:
        return len(text.split())


def mistakes_rule(request: MockRequest) -> MockReply:
    """A tool-calling agent names a tool it does not have, then gives a bad argument, then counts and answers."""
    text = request_text(request)
    if request.tools:
        if "Observation" in text:
            return MockReply(tool_calls=[MockToolCall(name="final_answer", arguments={"answer": "3"})])
        if "is not in the tool's input schema" in text:
            return MockReply(tool_calls=[MockToolCall(name="count_words", arguments={"text": "a b c"})])
        if "Unknown tool" in text:
            return MockReply(tool_calls=[MockToolCall(name="count_words", arguments={"words": "a b c"})])
        return MockReply(tool_calls=[MockToolCall(name="count_letters", arguments={"text": "a b c"})])
    return MockReply(content='<code>\nfinal_answer(count_words("one two"))\n</code>')


def test_unknown_tools_and_bad_arguments_are_failed_tool_calls(serve) -> None:
    server, model = serve(mistakes_rule)

    @agl.rollout(reward=lambda task, out: float(str(out) == "3"))
    def caller(task: dict, llm: agl.LLM) -> str:
        counter = ToolCallingAgent(tools=[WordCounter()], model=model_for(llm), name="counter", max_steps=5)
        return counter.run(task["text"])

    rollout = caller.execute({"text": "Count the words of 'a b c'."}, server.llm())
    assert timeline(rollout) == [
        ("llm", "counter", "ok"),
        ("tool", "counter:count_letters", "error"),
        ("llm", "counter", "ok"),
        ("tool", "counter:count_words", "error"),
        ("llm", "counter", "ok"),
        ("tool", "counter:count_words", "ok"),
        ("llm", "counter", "ok"),
        ("tool", "counter:final_answer", "ok"),
    ]
    unknown, bad, good = rollout.calls[1], rollout.calls[3], rollout.calls[5]
    assert unknown.error.startswith("AgentToolExecutionError: Unknown tool count_letters")
    assert bad.input == {"words": "a b c"} and bad.error.startswith("ValueError: ")
    assert good.output == 3 and good.parent_call_id == rollout.calls[4].call_id
    assert_served_exactly(rollout, server, model)

    server, model = serve(mistakes_rule)

    @agl.rollout(reward=lambda task, out: float(str(out) == "2"))
    def coder(task: dict, llm: agl.LLM) -> str:
        return CodeAgent(tools=[WordCounter()], model=model_for(llm), name="coder", max_steps=2).run(task["text"])

    rollout = coder.execute({"text": "Count the words of 'one two'."}, server.llm())
    assert timeline(rollout) == [
        ("llm", "coder", "ok"),
        ("tool", "coder:count_words", "ok"),
        ("tool", "coder:final_answer", "ok"),
    ]
    assert rollout.calls[1].input == {"text": "one two"} and rollout.calls[1].output == 2
    assert rollout.calls[2].parent_call_id == rollout.calls[0].call_id
    assert_served_exactly(rollout, server, model)


def test_uninstrument_leaves_plain_capture(serve) -> None:
    """Without the adapter every call is still captured (through the openai client), with no names and no tools."""
    server, _ = serve(team_rule)

    @agl.rollout(reward=lambda task, out: float(str(out).endswith("42")))
    def agent(task: dict, llm: agl.LLM) -> str:
        return team(llm, name="manager").run(task["question"])

    agl.uninstrument("smolagents")
    try:
        rollout = agent.execute({"question": "What is the answer?"}, server.llm())
    finally:
        agl.instrument("smolagents")
    assert [(call.kind, call.role) for call in rollout.calls] == [("llm", None)] * len(server.requests)
    assert len(server.requests) == 6


def parallel_rule(request: MockRequest) -> MockReply:
    text = request_text(request)
    if "the answer is 42" in text:
        return MockReply(tool_calls=[MockToolCall(name="final_answer", arguments={"answer": "42"})])
    return MockReply(
        tool_calls=[
            MockToolCall(name="visit_webpage", arguments={"url": "https://example.org/a"}),
            MockToolCall(name="visit_webpage", arguments={"url": "https://example.org/b"}),
        ]
    )


def test_parallel_tool_calls_of_one_model_call(serve) -> None:
    """Two tool calls in one model output run on smolagents' thread pool: both recorded, with the same parent."""
    server, model = serve(parallel_rule)

    @agl.rollout(reward=lambda task, out: float(str(out) == "42"))
    def browser(task: dict, llm: agl.LLM) -> str:
        return ToolCallingAgent(tools=[visit_webpage], model=model_for(llm), name="browser").run(task["question"])

    rollout = browser.execute({"question": "What do both pages say?"}, server.llm())
    first, visits, second, answer = rollout.calls[0], rollout.calls[1:3], rollout.calls[3], rollout.calls[4]
    assert (first.kind, first.role, second.kind, second.role) == ("llm", "browser", "llm", "browser")
    assert sorted((call.input["url"], call.status) for call in visits) == [
        ("https://example.org/a", "ok"),
        ("https://example.org/b", "ok"),
    ]
    assert all(call.role == "browser" and call.parent_call_id == first.call_id for call in visits)
    assert (answer.name, answer.parent_call_id) == ("final_answer", second.call_id)
    assert_served_exactly(rollout, server, model)
