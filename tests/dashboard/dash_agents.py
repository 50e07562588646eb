"""The agents the dashboard tests run through real worker processes (importable by reference): a LangChain tool
loop whose tools succeed, fail softly and crash, against the mock model's ``tool_rule``; and one some of whose calls
in-process capture misses."""

from __future__ import annotations

import json
import logging
import urllib.request

import openai
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import ToolException, tool
from langchain_openai import ChatOpenAI

import agentlightning as agl
from agentlightning.testing import MockReply, MockRequest, MockToolCall

logger = logging.getLogger("dash_agents")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def lookup(table: str) -> str:
    """Look a table up (there are none)."""
    raise ToolException(f"no table {table}")


lookup.handle_tool_error = True


def tool_rule(request: MockRequest) -> MockReply:
    """The mock model: asks for both tools, then answers with what they returned."""
    if request.messages[-1]["role"] == "tool":
        return MockReply(content="answer: " + " | ".join(m["content"] for m in request.messages if m["role"] == "tool"))
    return MockReply(
        tool_calls=[
            MockToolCall(name="add", arguments={"a": 2, "b": 3}),
            MockToolCall(name="lookup", arguments={"table": "users"}),
        ]
    )


@agl.rollout
def tool_agent(task: dict, llm: agl.LLM, rollout: agl.Rollout) -> float:
    """``task["mode"]``: "ok" returns ``task["score"]``; "crash" raises after its calls; "flaky" crashes on its
    first attempt only."""
    model = ChatOpenAI(model=llm.model, base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    bound = model.bind_tools([add, lookup]).with_config(run_name="solver")
    messages: list = [HumanMessage(task["question"])]
    reply = bound.invoke(messages)
    messages.append(reply)
    tools = {"add": add, "lookup": lookup}
    messages.extend(tools[request["name"]].invoke(request) for request in reply.tool_calls)
    assert all(isinstance(m, ToolMessage) for m in messages[2:])
    bound.invoke(messages)
    agl.emit_reward(0.25, name="tools_used")
    logger.info("solved %s on attempt %d", task["question"], rollout.attempt)
    if task["mode"] == "crash" or (task["mode"] == "flaky" and rollout.attempt == 1):
        raise ValueError(f"agent bug on {task['question']}")
    return float(task["score"])


@agl.rollout
def gap_agent(task: dict, llm: agl.LLM) -> float:
    """A first call through the openai client (captured in-process), then a second one through it or, with
    ``task["client"] == "urllib"``, through the standard library's urllib, which nothing instruments: only the
    proxy sees that one (as ``tests/adapters/raw_http_agents.half_captured_agent``)."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    plan = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    messages = [{"role": "user", "content": plan.choices[0].message.content}]
    if task["client"] != "urllib":
        client.chat.completions.create(model=llm.model, messages=messages)
        return 1.0
    request = urllib.request.Request(
        f"{llm.base_url}/chat/completions",
        data=json.dumps({"model": llm.model, "messages": messages}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {llm.api_key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        json.loads(response.read())
    return 1.0
