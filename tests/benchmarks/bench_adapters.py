"""Benchmark: cost of capture per LLM call for each framework adapter, against the same agent uninstrumented.

For LangChain (a writer/checker/rewriter LCEL pipeline, 3 LLM calls), the OpenAI Agents SDK (an agent calling a
function tool, 2 LLM calls + 1 tool), AutoGen (an AssistantAgent calling a tool and reflecting, 2 LLM calls +
1 tool) and Microsoft Agent Framework (an Agent calling a tool, 2 LLM calls + 1 tool), each against the local mock
server (token ids on):

- baseline: every adapter uninstalled (``agl.uninstrument``), the agent function awaited directly;
- captured: adapters installed, the agent run by ``RolloutAgent.aexecute`` (a full rollout: recorder, role
  attribution, tool records, token ids, finished Rollout record);
- openai_only: the same rollout with the openai-client capture but without the framework adapter, so that
  "adapter us" (captured - openai_only) is the framework adapter's own cost per LLM call.

The framework objects (models, chains, agents) are built once and reused, so the baseline is the framework's own
cost per call plus the HTTP round trip to the local server.

Rounds alternate the variants so that machine load affects all alike. Reported per LLM call: process CPU time and
elapsed time (median round), and, from CPU time since elapsed time on a shared machine mostly measures the other
processes, the ratio captured/baseline and the overheads in microseconds (medians of the per-round pairs).
Run with either of:

    python tests/benchmarks/bench_adapters.py
    python -m pytest -q -s tests/benchmarks/bench_adapters.py
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import agentlightning as agl
from agentlightning.capture._instrument import ADAPTERS
from agentlightning.testing import MockLLMServer, MockReply, MockRequest, MockToolCall

ROUNDS = 15
RUNS_PER_ROUND = 10


def rule(request: MockRequest) -> MockReply:
    """A tool request first when tools are offered, then a plain answer."""
    if request.tools and not any(message["role"] == "tool" for message in request.messages):
        return MockReply(tool_calls=[MockToolCall(name="add", arguments={"a": 2, "b": 3})])
    return MockReply(content="SELECT 1 -- " + request.last_user_text[:20])


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# -- the agents, written as their users write them (framework objects built once, reused by every run) --

AgentFunction = Callable[[dict, agl.LLM], Awaitable[float]]


def langchain_agent(llm: agl.LLM) -> AgentFunction:
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model)
    steps = [
        (ChatPromptTemplate.from_messages([("user", f"{name} {{x}}")]) | model | StrOutputParser()).with_config(
            run_name=name
        )
        for name in ("writer", "checker", "rewriter")
    ]

    async def agent(task: dict, llm: agl.LLM) -> float:
        text = task["question"]
        for step in steps:
            text = await step.ainvoke({"x": text})
        return 1.0

    return agent


def openai_agents_agent(llm: agl.LLM) -> AgentFunction:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_trace_processors
    from openai import AsyncOpenAI

    set_trace_processors([])  # no export to OpenAI, in every variant
    model = OpenAIChatCompletionsModel(llm.model, AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key))
    solver = Agent(name="solver", instructions="Solve.", tools=[function_tool(add)], model=model)

    async def agent(task: dict, llm: agl.LLM) -> float:
        await Runner.run(solver, task["question"])
        return 1.0

    return agent


def autogen_agent(llm: agl.LLM) -> AgentFunction:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core.models import ModelInfo
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    info = ModelInfo(vision=False, function_calling=True, json_output=True, family="unknown", structured_output=True)
    client = OpenAIChatCompletionClient(model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=info)

    async def agent(task: dict, llm: agl.LLM) -> float:
        solver = AssistantAgent("solver", model_client=client, tools=[add], reflect_on_tool_use=True)
        await solver.run(task=task["question"])
        return 1.0

    return agent


def agent_framework_agent(llm: agl.LLM) -> AgentFunction:
    from agent_framework import Agent
    from agent_framework.openai import OpenAIChatCompletionClient

    client = OpenAIChatCompletionClient(model=llm.model, base_url=llm.base_url, api_key=llm.api_key)
    solver = Agent(client=client, name="solver", instructions="Solve.", tools=[add])

    async def agent(task: dict, llm: agl.LLM) -> float:
        await solver.run(task["question"])
        return 1.0

    return agent


@dataclass
class Case:
    name: str
    adapter: str
    build: Callable[[agl.LLM], AgentFunction]
    llm_calls: int
    roles: set[str]


CASES = [
    Case("langchain", "langchain", langchain_agent, 3, {"writer", "checker", "rewriter"}),
    Case("openai_agents", "openai_agents", openai_agents_agent, 2, {"solver"}),
    Case("autogen", "autogen", autogen_agent, 2, {"solver"}),
    Case("agent_framework", "agent_framework", agent_framework_agent, 2, {"solver"}),
]


VARIANTS = ("baseline", "openai_only", "captured")


def _set_capture(variant: str, adapter: str) -> None:
    """baseline: nothing installed; openai_only: the openai-client capture without the framework adapter;
    captured: both."""
    for name, on in (("openai", variant != "baseline"), (adapter, variant == "captured")):
        if on:
            agl.instrument(name)
        else:
            agl.uninstrument(name)


async def bench_case(case: Case, server: MockLLMServer) -> dict[str, Any]:
    llm = server.llm()
    function = case.build(llm)
    rollout_agent = agl.rollout(function)
    # Warm up every path (imports, connection pools, lazily built tables) and check the capture is real.
    _set_capture("captured", case.adapter)
    rollout = await rollout_agent.aexecute({"question": "warm up"}, llm)
    assert rollout.status == "succeeded", rollout.error
    assert len(rollout.llm_calls) == case.llm_calls and {c.role for c in rollout.llm_calls} == case.roles, [
        (c.kind, c.role) for c in rollout.calls
    ]
    assert all(call.completion_token_ids for call in rollout.llm_calls)
    _set_capture("openai_only", case.adapter)
    await rollout_agent.aexecute({"question": "warm up"}, llm)
    _set_capture("baseline", case.adapter)
    await function({"question": "warm up"}, llm)

    samples: dict[str, list[tuple[float, float]]] = {variant: [] for variant in VARIANTS}
    calls = RUNS_PER_ROUND * case.llm_calls
    for round_index in range(ROUNDS):
        for variant in VARIANTS:
            _set_capture(variant, case.adapter)
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            for run in range(RUNS_PER_ROUND):
                task = {"question": f"q{round_index}-{run}"}
                if variant == "baseline":
                    await function(task, llm)
                else:
                    rollout = await rollout_agent.aexecute(task, llm)
            samples[variant].append(((time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls))
        assert len(rollout.llm_calls) == case.llm_calls
    result: dict[str, Any] = {"case": case.name}
    for variant, values in samples.items():
        result[f"{variant}_wall_ms"] = statistics.median(v[0] for v in values) * 1e3
        result[f"{variant}_cpu_ms"] = statistics.median(v[1] for v in values) * 1e3
    # Paired per round (same machine state), then the median: robust to load drifting during the run.
    cpu = {variant: [v[1] for v in values] for variant, values in samples.items()}
    pairs = list(zip(cpu["baseline"], cpu["openai_only"], cpu["captured"], strict=True))
    result["ratio"] = statistics.median(c / b for b, _, c in pairs)
    result["overhead_us"] = statistics.median(c - b for b, _, c in pairs) * 1e6
    result["adapter_us"] = statistics.median(c - o for _, o, c in pairs) * 1e6
    return result


async def _bench_all(server: MockLLMServer) -> list[dict[str, Any]]:
    return [await bench_case(case, server) for case in CASES]


def run() -> list[dict[str, Any]]:
    with MockLLMServer(handler=rule, token_ids=True) as server:
        results = asyncio.run(_bench_all(server))
    for name, module in ADAPTERS.items():  # leave the process as a rollout would: every installed framework's adapter
        if importlib.util.find_spec(module.split(".")[0]) is not None:  # crewai, llama_index: only in .venv-frameworks
            agl.instrument(name)
    print(f"\ncapture cost per LLM call (median of {ROUNDS} rounds x {RUNS_PER_ROUND} agent runs, local mock server)")
    print("cpu = process CPU time (includes the in-process mock server; stable on a loaded machine); wall = elapsed")
    header = (
        "framework",
        "base cpu ms",
        "captured cpu ms",
        "ratio",
        "overhead us",
        "adapter us",
        "base wall ms",
        "capt. wall ms",
    )
    print(f"{header[0]:<15}" + "".join(f"{h:>16}" for h in header[1:]))
    for r in results:
        values = (r["baseline_cpu_ms"], r["captured_cpu_ms"], r["ratio"], r["overhead_us"], r["adapter_us"])
        walls = (r["baseline_wall_ms"], r["captured_wall_ms"])
        print(
            f"{r['case']:<15}{values[0]:>16.3f}{values[1]:>16.3f}{values[2]:>16.3f}{values[3]:>16.0f}"
            f"{values[4]:>16.0f}{walls[0]:>16.3f}{walls[1]:>16.3f}"
        )
    return results


def test_bench_adapters() -> None:
    results = run()
    for result in results:
        assert result["ratio"] < 1.5, f"{result['case']}: capture costs {result['ratio']:.2f}x the uninstrumented agent"


if __name__ == "__main__":
    run()
