"""LlamaIndex agents for tests/adapters/test_adapter_llama_index.py, run with .venv-frameworks' python
(llama-index-llms-openai needs openai<3).

``python llama_index_agents.py SCENARIO LLM_JSON OUT``: runs the scenario once as a rollout against the LLM described
by ``LLM_JSON`` (an ``agl.LLM`` as JSON) and writes the rollout, as JSON, to ``OUT``.
"""

from __future__ import annotations

import asyncio
import sys

from llama_index.core.agent.workflow import AgentStream, AgentWorkflow, FunctionAgent
from llama_index.llms.openai import OpenAI

import agentlightning as agl

# llama-index's OpenAI class knows the context window of OpenAI's own models only; the mock server answers any name.
MODEL = "gpt-4o-mini"


def lookup_fact(topic: str) -> str:
    """Look up one fact about a topic."""
    if topic != "e-bikes":
        raise LookupError(f"no fact about {topic!r}")
    return "e-bikes ride 80 km on one charge"


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@agl.rollout(reward=lambda task, out: float("80 km" in out))
async def workflow(task: dict, llm: agl.LLM) -> str:
    """The multi-agent pattern of LlamaIndex's docs: a research agent with a tool (which raises once) hands off to a
    write agent; the caller streams the workflow's events as it runs."""
    model = OpenAI(model=MODEL, api_base=llm.base_url, api_key=llm.api_key)
    research = FunctionAgent(
        name="ResearchAgent",
        description="Finds facts about a topic.",
        system_prompt="You research facts with lookup_fact, then hand off to the WriteAgent.",
        llm=model,
        tools=[lookup_fact],
        can_handoff_to=["WriteAgent"],
    )
    write = FunctionAgent(
        name="WriteAgent",
        description="Writes slogans from facts.",
        system_prompt="You write slogans.",
        llm=model,
    )
    agents = AgentWorkflow(agents=[research, write], root_agent=research.name)
    handler = agents.run(user_msg=f"Write a slogan about {task['topic']}.")
    async for event in handler.stream_events():
        if isinstance(event, AgentStream):
            print(event.delta, end="", flush=True)
    return str(await handler)


@agl.rollout(reward=lambda task, out: float("sunny" in out))
async def function_agent(task: dict, llm: agl.LLM) -> str:
    """One ``FunctionAgent`` run directly, not streamed."""
    model = OpenAI(model=MODEL, api_base=llm.base_url, api_key=llm.api_key)
    agent = FunctionAgent(
        name="WeatherAgent",
        system_prompt="You tell the weather.",
        llm=model,
        tools=[get_weather],
        streaming=False,
    )
    return str(await agent.run(user_msg=f"Weather in {task['city']}?"))


async def uninstrumented(task: dict, llm: agl.LLM) -> agl.Rollout:
    """``function_agent`` again after ``agl.uninstrument("llama_index")`` (the first rollout installed the adapter)."""
    await function_agent.aexecute(task, llm)
    agl.uninstrument("llama_index")
    return await function_agent.aexecute(task, llm)


async def run(scenario: str, task: dict, llm: agl.LLM) -> agl.Rollout:
    if scenario == "uninstrumented":
        return await uninstrumented(task, llm)
    return await globals()[scenario].aexecute(task, llm)


if __name__ == "__main__":
    scenario, llm_json, out = sys.argv[1:]
    rollout = asyncio.run(run(scenario, {"topic": "e-bikes", "city": "Paris"}, agl.LLM.model_validate_json(llm_json)))
    with open(out, "w") as file:
        file.write(rollout.model_dump_json())
