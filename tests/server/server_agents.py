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


def _ask(llm: agl.LLM, text: str, client: openai.OpenAI | None = None) -> str:
    client = client or openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": text}])
    return reply.choices[0].message.content or ""


@agl.rollout
def chat_agent(task: dict, llm: agl.LLM) -> float:
    """Makes ``task["calls"]`` chat calls through llm.base_url; reward 1 if the last answer echoes the question."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    content = ""
    for index in range(task.get("calls", 1)):
        content = _ask(llm, f"{task['question']} #{index}", client)
    logger.info("answered %s", task["question"])
    return 1.0 if task["question"] in content else 0.0


@agl.rollout
def behaving_agent(task: dict, llm: agl.LLM) -> float:
    """Behaves as ``task["mode"]`` says, after one LLM call:

    - "ok": returns 1.0;
    - "crash": logs, prints, raises ValueError;
    - "hang": never returns;
    - "hold": on its first attempt writes ``<mark_dir>/<question>.<pid>`` and waits for ``release-<question>`` (so a
      test can kill its process mid-rollout); later attempts return at once;
    - "late": makes a second call, asking "slow <question>" (a test's upstream answers it slowly).
    """
    _ask(llm, task["question"])
    mode = task["mode"]
    if mode == "crash":
        logger.warning("about to fail on %s", task["question"])
        print("printed by the agent before crashing")
        raise ValueError(f"agent bug on {task['question']}")
    if mode == "late":
        _ask(llm, f"slow {task['question']}")
    if mode == "hang":
        logger.info("hanging now")
        time.sleep(3600)
    if mode == "hold":
        marks = Path(task["mark_dir"])
        (marks / f"{task['question']}.{os.getpid()}").write_text(str(os.getpid()))
        release = marks / f"release-{task['question']}"
        while not release.exists():
            time.sleep(0.02)
    return 1.0
