"""Agents for the Ray worker tests, at module level of a module the Ray actors import (shipped to them through
``runtime_env``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import openai

import agentlightning as agl


@agl.rollout
def chat_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call; then with ``task["hang"]``, never returns; with ``task["hold"]``, writes
    ``<mark_dir>/<question>.<pid>`` and waits for ``<mark_dir>/release-<question>`` (so a test can kill its process
    mid-rollout). Reward: the reply's length, so a GRPO group's rewards differ."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8
    )
    if task.get("hang"):
        time.sleep(3600)
    if task.get("hold"):
        marks = Path(task["mark_dir"])
        (marks / f"{task['question']}.{os.getpid()}").write_text(str(os.getpid()))
        while not (marks / f"release-{task['question']}").exists():
            time.sleep(0.02)
    return len(reply.choices[0].message.content or "") / 50.0
