"""Agents for the fault suite, at module level of an importable module (worker processes are spawned and import them).

``fault_agent`` waits until the file ``task["wait_before"]`` exists (when given), makes ``task["calls"]`` LLM calls
(default 1), then behaves as ``task["mode"]`` says:

- "ok": returns 1.0 if the last answer echoes the question;
- "exit": logs and prints a line, then ends its process with ``os._exit(1)``;
- "segfault": logs a line, then dereferences a null pointer (SIGSEGV);
- "gil": logs a line, then runs a regular expression that backtracks for hours while holding the GIL;
- "hold": waits until the file ``task["release"]`` exists (first creating a file in the folder ``task["holding"]``,
  when given, so a test can count the rollouts that hold);
- "surrogate": logs and prints a line holding a lone UTF-16 surrogate, then returns as "ok" does.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import time
from pathlib import Path

import openai

import agentlightning as agl

logger = logging.getLogger("fault_agents")


@agl.rollout
def fault_agent(task: dict, llm: agl.LLM) -> float:
    """See the module docstring."""
    while task.get("wait_before") and not Path(task["wait_before"]).exists():
        time.sleep(0.02)
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=300)
    content = ""
    for index in range(task.get("calls", 1)):
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": f"{task['question']} #{index}"}]
        )
        content = reply.choices[0].message.content or ""
    mode = task.get("mode", "ok")
    if mode == "surrogate":
        logger.warning("agent line with a lone surrogate \ud83d on %s", task["question"])
        print("printed \ud83d", flush=True)
    elif mode != "ok":
        logger.warning("agent line before %s on %s", mode, task["question"])
        print(f"printed before {mode}", flush=True)
    if mode == "exit":
        os._exit(1)
    if mode == "segfault":
        ctypes.string_at(0)
    if mode == "gil":
        re.match(r"(a+)+$", "a" * 64 + "b")
    if mode == "hold":
        if task.get("holding"):
            Path(task["holding"], f"{os.getpid()}-{time.monotonic_ns()}").touch()
        while not Path(task["release"]).exists():
            time.sleep(0.02)
    return 1.0 if task["question"] in content else 0.0
