"""The agent of the SVAMP benchmark (``python -m examples.calc_x.svamp``): the Calc-X AutoGen agent, unchanged,
with its completions capped at ``$AGL_SVAMP_MAX_TOKENS`` tokens (default 160) through ``llm.sampling_parameters``,
which the agent reads. A module of its own so that worker processes import it by name."""

from __future__ import annotations

import os
from typing import Any

import agentlightning as agl
from examples.calc_x.calc_agent import AGENT_NAME, calc_agent

MAX_TOKENS_ENV = "AGL_SVAMP_MAX_TOKENS"
DEFAULT_MAX_TOKENS = 160


@agl.rollout(roles=[AGENT_NAME])
async def svamp_agent(task: dict[str, Any], llm: agl.LLM, rollout: agl.Rollout) -> float:
    """The Calc-X agent on one SVAMP problem, its completions capped at ``$AGL_SVAMP_MAX_TOKENS`` tokens."""
    cap = int(os.environ.get(MAX_TOKENS_ENV, DEFAULT_MAX_TOKENS))
    capped = llm.model_copy(update={"sampling_parameters": {"max_tokens": cap, **llm.sampling_parameters}})
    return await calc_agent(task, capped, rollout)
