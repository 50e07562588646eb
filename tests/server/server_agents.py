"""Agents used by the server/client tests. They live at module level of an importable module because worker
processes are spawned and import the agent by reference."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import openai

import agentlightning as agl

logger = logging.getLogger("server_agents")


@agl.rollout
def chat_agent(task: dict, llm: agl.LLM) -> float:
    """Makes ``task["calls"]`` chat calls through llm.base_url; reward 1 if the last answer echoes the question."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    content = ""
    for index in range(task.get("calls", 1)):
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": f"{task['question']} #{index}"}]
        )
        content = reply.choices[0].message.content or ""
    logger.info("answered %s", task["question"])
    return 1.0 if task["question"] in content else 0.0


@agl.rollout
def crashing_agent(task: dict, llm: agl.LLM) -> float:
    """Calls the model once, logs and prints, then crashes."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "before the crash"}])
    logger.warning("about to fail on %s", task["question"])
    print("printed by the agent before crashing")
    raise ValueError(f"agent bug on {task['question']}")


@agl.rollout
def hanging_agent(task: dict, llm: agl.LLM) -> float:
    """Calls the model once, then never returns."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "then hang"}])
    logger.info("hanging now")
    time.sleep(3600)
    return 1.0


@agl.rollout
def marking_agent(task: dict, llm: agl.LLM) -> float:
    """Writes its pid to ``task["mark_dir"]`` and waits while a file named after the question is absent on the
    first attempt (so a test can kill its worker mid-rollout); later attempts finish at once."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    marks = Path(task["mark_dir"])
    (marks / f"{task['question']}.{os.getpid()}").write_text(str(os.getpid()))
    release = marks / f"release-{task['question']}"
    deadline = time.monotonic() + task.get("hold", 0.0)
    while time.monotonic() < deadline and not release.exists():
        time.sleep(0.02)
    return 1.0
