"""CrewAI agents for tests/adapters/test_adapter_crewai.py, run with .venv-frameworks' python (CrewAI needs openai<3).

``python crewai_agents.py SCENARIO LLM_JSON OUT``: runs the scenario once as a rollout against the LLM described by
``LLM_JSON`` (an ``agl.LLM`` as JSON) and writes the rollout, as JSON, to ``OUT``.
"""

from __future__ import annotations

import os
import sys

# No telemetry, no trace prompt, LiteLLM's bundled model map: the tests reach nothing but the local mock server.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import openai  # noqa: E402
from crewai import LLM, Agent, Crew, Process, Task  # noqa: E402
from crewai.tools import tool  # noqa: E402

import agentlightning as agl  # noqa: E402


@tool("lookup_fact")
def lookup_fact(topic: str) -> str:
    """Look up one fact about a topic."""
    if topic != "e-bikes":
        raise LookupError(f"no fact about {topic!r}")
    return "e-bikes ride 80 km on one charge"


def slogan_crew(model: LLM, tools: list) -> Crew:
    """Two agents with a task each, run in sequence (CrewAI's quick-start shape)."""
    researcher = Agent(
        role="Researcher",
        goal="Find one true fact about {topic}",
        backstory="A careful researcher who checks every fact.",
        tools=tools,
        llm=model,
    )
    writer = Agent(
        role="Writer",
        goal="Write a short slogan about {topic}",
        backstory="A copywriter who turns facts into slogans.",
        llm=model,
    )
    research = Task(description="Find one fact about {topic}.", expected_output="One fact.", agent=researcher)
    write = Task(description="Write a slogan from the fact.", expected_output="One slogan.", agent=writer)
    return Crew(agents=[researcher, writer], tasks=[research, write], process=Process.sequential)


@agl.rollout(reward=lambda task, out: float("80 km" in out))
def native_provider(task: dict, llm: agl.LLM) -> str:
    """CrewAI's native OpenAI provider (an ``openai/`` model with a base URL), a tool that raises, then one call of
    the rollout's own after the crew."""
    model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key)
    output = str(slogan_crew(model, [lookup_fact]).kickoff(inputs={"topic": task["topic"]}))
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": f"Judge: {output}"}])
    return output


@agl.rollout(reward=lambda task, out: float("80 km" in out))
def streamed(task: dict, llm: agl.LLM) -> str:
    """The same crew with a streaming model (``LLM(..., stream=True)``)."""
    model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key, stream=True)
    return str(slogan_crew(model, [lookup_fact]).kickoff(inputs={"topic": task["topic"]}))


@agl.rollout(reward=lambda task, out: float("80 km" in out))
def through_litellm(task: dict, llm: agl.LLM) -> str:
    """The same crew through LiteLLM (``is_litellm=True``), without tools."""
    model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key, is_litellm=True)
    return str(slogan_crew(model, []).kickoff(inputs={"topic": task["topic"]}))


@agl.rollout(reward=lambda task, out: float("80 km" in out))
def delegation(task: dict, llm: agl.LLM) -> str:
    """An editor allowed to delegate (CrewAI's coworker tools) hands the writing to a writer."""
    model = LLM(model=f"openai/{llm.model}", base_url=llm.base_url, api_key=llm.api_key)
    editor = Agent(
        role="Editor",
        goal="Deliver a slogan about {topic}",
        backstory="An editor who delegates the writing.",
        allow_delegation=True,
        llm=model,
    )
    writer = Agent(role="Writer", goal="Write slogans", backstory="A copywriter.", llm=model)
    deliver = Task(description="Deliver a slogan about {topic}.", expected_output="One slogan.", agent=editor)
    return str(Crew(agents=[editor, writer], tasks=[deliver]).kickoff(inputs={"topic": task["topic"]}))


def uninstrumented(task: dict, llm: agl.LLM) -> agl.Rollout:
    """``native_provider`` again after ``agl.uninstrument("crewai")`` (the first rollout installed the adapter)."""
    native_provider.execute(task, llm)
    agl.uninstrument("crewai")
    return native_provider.execute(task, llm)


def run(scenario: str, task: dict, llm: agl.LLM) -> agl.Rollout:
    if scenario == "uninstrumented":
        return uninstrumented(task, llm)
    return globals()[scenario].execute(task, llm)


if __name__ == "__main__":
    scenario, llm_json, out = sys.argv[1:]
    rollout = run(scenario, {"topic": "e-bikes"}, agl.LLM.model_validate_json(llm_json))
    with open(out, "w") as file:
        file.write(rollout.model_dump_json())
