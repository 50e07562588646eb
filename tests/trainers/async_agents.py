"""Module-level agents for the asynchronous-training tests (worker processes import them by reference)."""

from __future__ import annotations

import random
import threading
import time

import openai

import agentlightning as agl

FIRST_CALL_DONE = threading.Event()
WEIGHTS_UPDATED = threading.Event()
SAMPLED = threading.Condition()
SAMPLED_TOGETHER = 0
"""How many rollouts of :func:`sampled_together_agent` hold their result until that many have made their call."""
_calls = 0


@agl.rollout
def scored_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call, then ``task["delay"]`` seconds of environment; ``task["flat"]`` tasks always score 0.5 (a group
    without GRPO signal), others at random."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=4
    )
    time.sleep(task.get("delay", 0.0))
    return 0.5 if task.get("flat") else random.random()


@agl.rollout
def two_call_agent(task: dict, llm: agl.LLM) -> float:
    """Two chat calls with a weight update in between: waits for WEIGHTS_UPDATED after the first (threads only)."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    messages = [{"role": "user", "content": task["question"]}]
    first = client.chat.completions.create(model=llm.model, messages=messages, max_tokens=4)
    FIRST_CALL_DONE.set()
    if not WEIGHTS_UPDATED.wait(timeout=60):
        raise TimeoutError("the test never updated the weights")
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "again"},
    ]
    client.chat.completions.create(model=llm.model, messages=messages, max_tokens=4)
    return 1.0


@agl.rollout
def sampled_together_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call rewarded by the reply's length; the first ``SAMPLED_TOGETHER`` rollouts finish only once all of
    them have made their call, so every group submitted with them is sampled before the first update (threads only)."""
    global _calls
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8
    )
    with SAMPLED:
        _calls += 1
        SAMPLED.notify_all()
        if not SAMPLED.wait_for(lambda: _calls >= SAMPLED_TOGETHER, timeout=60):
            raise TimeoutError(f"only {_calls} of {SAMPLED_TOGETHER} rollouts made their call")
    return len(reply.choices[0].message.content or "") / 50.0
