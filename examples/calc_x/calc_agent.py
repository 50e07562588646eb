"""A math word-problem solver in AutoGen AgentChat: an assistant with a calculator tool.

The assistant (named ``calculator_assistant``, which is its role for Agent Lightning's AutoGen adapter) reasons
step by step, calls ``calculator`` for arithmetic and ends with ``### ANSWER: <number> ###``. The calculator is a
``FunctionTool`` over the safe evaluator in :mod:`examples.calc_x.calculator`; a bad expression makes the tool call
fail (AutoGen reports the error to the model, Agent Lightning records the tool call with status 'error', and the
AIR rule in ``train.py`` turns it into a penalty on the LLM call that made it).

The paper's setup serves the calculator over MCP; this example uses the equivalent ``FunctionTool``. With the pinned
mcp 1.30.0 an ``McpWorkbench`` can replace it (the AutoGen adapter records MCP tool calls the same way).
"""

from __future__ import annotations

import logging
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage
from autogen_core.models import ModelFamily, ModelInfo
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agentlightning as agl
from examples.calc_x.calculator import calculate
from examples.calc_x.reward import extract_answer, score

logger = logging.getLogger(__name__)

AGENT_NAME = "calculator_assistant"
SYSTEM_MESSAGE = (
    "You solve math word problems. Think step by step. Use the `calculator` tool for every arithmetic step: pass "
    "it one arithmetic expression such as (12 + 8) * 3 / 4. When you know the final answer, end your reply with "
    "### ANSWER: <answer> ### where <answer> is just the number (or the letter of the correct choice)."
)
MAX_TOOL_ITERATIONS = 5

MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family=ModelFamily.UNKNOWN, structured_output=False
)


def calculator_tool() -> FunctionTool:
    """The calculator as an AutoGen ``FunctionTool``."""
    return FunctionTool(
        calculate,
        name="calculator",
        description="Evaluate one arithmetic expression (+ - * / // % ** ^, parentheses, sqrt, round, min, max) "
        "and return its value.",
    )


def model_client(llm: agl.LLM) -> OpenAIChatCompletionClient:
    """An AutoGen model client for the rollout's endpoint."""
    settings: dict[str, Any] = {"temperature": 0.7, "max_tokens": 512}
    settings.update(llm.sampling_parameters)
    return OpenAIChatCompletionClient(
        model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=MODEL_INFO, max_retries=1, **settings
    )


async def solve(question: str, llm: agl.LLM) -> str:
    """Run the assistant on ``question`` and return its final text reply."""
    client = model_client(llm)
    try:
        agent = AssistantAgent(
            AGENT_NAME,
            model_client=client,
            tools=[calculator_tool()],
            system_message=SYSTEM_MESSAGE,
            reflect_on_tool_use=True,
            max_tool_iterations=MAX_TOOL_ITERATIONS,
        )
        return _final_text(await agent.run(task=question))
    finally:
        await client.close()


def _final_text(result: Any) -> str:
    for message in reversed(result.messages):
        if isinstance(message, TextMessage) and message.source == AGENT_NAME:
            return message.content
    return ""


@agl.rollout(roles=[AGENT_NAME])
async def calc_agent(task: dict[str, Any], llm: agl.LLM, rollout: agl.Rollout) -> float:
    """One Calc-X episode: reward 1 when the final answer equals the gold answer, else 0."""
    reply = await solve(task["question"], llm)
    reward = score(reply, task["answer"])
    rollout.output = {"reply": reply, "answer": extract_answer(reply)}
    return reward
