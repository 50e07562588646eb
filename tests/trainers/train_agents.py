"""Module-level agents for the trainer tests (worker processes import them by reference)."""

from __future__ import annotations

import time

import openai

import agentlightning as agl


@agl.rollout
def echo_length_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call; the reward depends on the reply so a group of rollouts has different rewards."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8
    )
    text = reply.choices[0].message.content or ""
    return float(len(text) % 3) / 2.0


@agl.rollout
def reply_length_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call rewarded by the reply's length: sampled replies of a group almost never tie."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8
    )
    return len(reply.choices[0].message.content or "") / 50.0


@agl.rollout
def reply_text_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call rewarded by the reply's characters (their code points' sum mod 101): a tiny random model's
    replies all run to max_tokens and often tie in length, but two sampled replies seldom tie in text."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8
    )
    return sum(map(ord, reply.choices[0].message.content or "")) % 101 / 100.0


COUNTED_SYSTEM = "You are a careful assistant. Think about the question, then answer with one number only."


@agl.rollout
def counted_reply_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call behind a shared system prompt, rewarded by the number the reply ends with (a mock server that
    counts its replies per prompt makes a group's rewards distinct and the same whatever order the rollouts run)."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model,
        max_tokens=16,
        messages=[{"role": "system", "content": COUNTED_SYSTEM}, {"role": "user", "content": task["question"]}],
    )
    return float((reply.choices[0].message.content or "0").split()[-1]) / 10.0


@agl.rollout
def writer_rewriter_agent(task: dict, llm: agl.LLM) -> float:
    """Three roles in one rollout (writer, rewriter, checker), one chat call each; rewarded by the replies' lengths."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    replies = {}
    for role in ("writer", "rewriter", "checker"):
        with agl.role(role):
            reply = client.chat.completions.create(
                model=llm.model, messages=[{"role": "user", "content": f"{role}: {task['question']}"}], max_tokens=6
            )
        replies[role] = reply.choices[0].message.content or ""
    return (len(replies["writer"]) % 4 + len(replies["rewriter"]) % 3) / 5.0


@agl.rollout
def task_reward_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call; the reward is the task's own ``reward``, so every group ties and the groups differ."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=4
    )
    return task["reward"]


@agl.rollout(roles=["solver"])
def solver_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call as the role ``solver``, rewarded by the reply's length (a group's rewards differ)."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    with agl.role("solver"):
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8
        )
    return len(reply.choices[0].message.content or "") / 50.0


@agl.rollout
def no_llm_agent(task: dict) -> float:
    """An agent that never receives the model (it answers by itself): nothing training does can change it."""
    return 1.0


@agl.rollout
def slow_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call, then ``task['sleep']`` seconds of the agent's own work: a step that takes a while."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8
    )
    time.sleep(task["sleep"])
    return len(reply.choices[0].message.content or "") / 50.0
