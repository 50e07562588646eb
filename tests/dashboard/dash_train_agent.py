"""The training-run test's agent, apart from dash_agents so that its worker processes do not import LangChain."""

from __future__ import annotations

import openai

import agentlightning as agl


@agl.rollout
def reply_length_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call rewarded by the reply's length: a group's rollouts seldom tie."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8
    )
    return len(reply.choices[0].message.content or "") / 50.0


@agl.rollout
def solver_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call as the role ``solver``, rewarded by the reply's length."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    with agl.role("solver"):
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8
        )
    return len(reply.choices[0].message.content or "") / 50.0
