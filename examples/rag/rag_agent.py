"""A retrieval-augmented QA agent in the OpenAI Agents SDK: it writes search queries for a BM25 retriever over
MuSiQue/HotpotQA paragraphs, refines them until it has the facts, and answers inside ``<answer>...</answer>``.

The agent's name, ``rag_agent``, is its role: Agent Lightning's Agents SDK adapter attributes each model request
to the agent that made it and records each ``retrieve`` call as a tool call.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import agents
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool
from openai import AsyncOpenAI

import agentlightning as agl
from examples.common import DEFAULT_DATA_DIR
from examples.rag.retrieval import BM25Index, index_for
from examples.rag.reward import score

logger = logging.getLogger(__name__)

AGENT_NAME = "rag_agent"
INSTRUCTIONS = (
    "You answer multi-hop questions using a search tool over Wikipedia paragraphs.\n"
    "Call `retrieve` with a short search query. Read the paragraphs; if a fact is still missing, call `retrieve` "
    "again with a refined query (for example about the entity you just found). When you know the answer, reply "
    "with a short answer (a name, date, number or short phrase) inside <answer></answer> tags, e.g. "
    "<answer>Audrey Hepburn</answer>."
)
TOP_K = 3
MAX_TURNS = 6


def keep_traces_local() -> None:
    """Stop the SDK from exporting traces to OpenAI's servers (capture does not depend on the SDK's tracing)."""
    agents.set_trace_processors([])


keep_traces_local()


def build_agent(llm: agl.LLM, index: BM25Index, *, top_k: int = TOP_K) -> Agent:
    """The agent for one rollout: the rollout's endpoint as model, ``retrieve`` over ``index`` as tool."""

    @function_tool
    def retrieve(query: str) -> str:
        """Search the paragraph collection and return the best matching paragraphs.

        Args:
            query: a short search query, e.g. an entity name and the relation you need.
        """
        passages = index.search(query, k=top_k)
        if not passages:
            return "No paragraph matches this query; try other words."
        return "\n\n".join(f"[{rank}] {passage.render()}" for rank, passage in enumerate(passages, start=1))

    settings: dict[str, Any] = {"temperature": 0.7, "max_tokens": 512}
    settings.update(llm.sampling_parameters)
    model = OpenAIChatCompletionsModel(
        model=llm.model, openai_client=AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=1)
    )
    return Agent(
        name=AGENT_NAME,
        instructions=INSTRUCTIONS,
        model=model,
        tools=[retrieve],
        model_settings=ModelSettings(
            temperature=settings.get("temperature"), top_p=settings.get("top_p"), max_tokens=settings.get("max_tokens")
        ),
    )


async def answer(question: str, llm: agl.LLM, data_dir: Path = DEFAULT_DATA_DIR, *, max_turns: int = MAX_TURNS) -> str:
    """Run the agent on ``question``; its final reply (which should hold ``<answer>...</answer>``)."""
    agent = build_agent(llm, index_for(str(Path(data_dir).resolve())))
    try:
        result = await Runner.run(agent, question, max_turns=max_turns)
    except agents.MaxTurnsExceeded:
        logger.info("rag agent used all %d turns without answering: %r", max_turns, question)
        return ""
    return str(result.final_output or "")


@agl.rollout(roles=[AGENT_NAME])
async def rag_agent(task: dict[str, Any], llm: agl.LLM, rollout: agl.Rollout) -> float:
    """One RAG episode: reward ``0.9 x F1 + 0.1 x format`` of the final reply against the gold answer.

    ``task["data_dir"]`` selects the paragraph collection (default: the shared data directory).
    """
    reply = await answer(task["question"], llm, Path(task.get("data_dir") or DEFAULT_DATA_DIR))
    result = score(reply, task["answer"], task.get("aliases"))
    rollout.output = {"reply": reply, "answer": result.answer, "f1": result.f1, "format_ok": result.format_ok}
    return result.reward
