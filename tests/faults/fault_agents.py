"""Agents for the fault suite, at module level of an importable module (worker processes are spawned and import them).

``fault_agent`` waits until the file ``task["wait_before"]`` exists (when given), makes ``task["calls"]`` LLM calls
(default 1), then behaves as ``task["mode"]`` says:

- "ok": returns 1.0 if the last answer echoes the question;
- "exit": logs and prints a line, then ends its process with ``os._exit(1)``;
- "segfault": logs a line, then dereferences a null pointer (SIGSEGV);
- "gil": logs a line, then runs a regular expression that backtracks for hours while holding the GIL;
- "hold": waits until the file ``task["release"]`` exists (first creating a file in the folder ``task["holding"]``,
  when given, so a test can count the rollouts that hold);
- "surrogate": logs and prints a line holding a lone UTF-16 surrogate, then returns as "ok" does;
- "thread-local": keeps in a ``threading.local`` an object whose finalizer takes 0.5 s, so that the agent's thread
  ends that long after the agent returned (as a thread-local HTTP session closing its connections would), then
  returns as "ok" does;
- "stream": its LLM call is streamed, and read to its end;
- "script": runs the steps ``task["script"][str(attempt)]`` of its attempt in order instead of the calls: "call" (an
  LLM call whose message names the attempt and step, ``"<question> attempt <n> step <i>"``) or "wait:<path>" (until
  that file exists), then returns as "ok" does.

``ratio_agent`` is scored by a reward function and returns a ratio in its output (NaN for ``denominator`` 0).

``cycle_agent`` makes one LLM call and leaves 512 KiB of garbage in a reference cycle every rollout, as the README's
agent leaves its ``openai.OpenAI`` client (with native memory the collector does not see): each cycle is kept for
``KEPT_ROLLOUTS`` rollouts, long enough to reach the oldest generation, then dropped.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import re
import threading
import time
from pathlib import Path

import openai

import agentlightning as agl

logger = logging.getLogger("fault_agents")


@agl.rollout
def fault_agent(task: dict, llm: agl.LLM, rollout: agl.Rollout) -> float:
    """See the module docstring."""
    while task.get("wait_before") and not Path(task["wait_before"]).exists():
        time.sleep(0.02)
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=300)
    mode = task.get("mode", "ok")
    if mode == "script":
        steps = task["script"][str(rollout.attempt)]
    else:
        steps = ["call"] * task.get("calls", 1)
    content = ""
    for index, step in enumerate(steps):
        if step.startswith("wait:"):
            while not Path(step.removeprefix("wait:")).exists():
                time.sleep(0.02)
            continue
        message = f"{task['question']} attempt {rollout.attempt} step {index}" if mode == "script" else None
        messages = [{"role": "user", "content": message or f"{task['question']} #{index}"}]
        if mode == "stream":
            chunks = client.chat.completions.create(model=llm.model, messages=messages, stream=True)
            content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
            continue
        reply = client.chat.completions.create(model=llm.model, messages=messages)
        content = reply.choices[0].message.content or ""
    if mode == "surrogate":
        logger.warning("agent line with a lone surrogate \ud83d on %s", task["question"])
        print("printed \ud83d", flush=True)
    elif mode not in ("ok", "script", "stream"):
        logger.warning("agent line before %s on %s", mode, task["question"])
        print(f"printed before {mode}", flush=True)
    if mode == "exit":
        os._exit(1)
    if mode == "segfault":
        ctypes.string_at(0)
    if mode == "gil":
        re.match(r"(a+)+$", "a" * 64 + "b")
    if mode == "thread-local":
        _thread_local.session = _SlowToClose()
    if mode == "hold":
        if task.get("holding"):
            Path(task["holding"], f"{os.getpid()}-{time.monotonic_ns()}").touch()
        while not Path(task["release"]).exists():
            time.sleep(0.02)
    return 1.0 if task["question"] in content else 0.0


class _SlowToClose:
    def __del__(self) -> None:
        time.sleep(0.5)


_thread_local = threading.local()


def _scored(task: dict, output: dict) -> float:
    return 1.0 if task["question"] in output["answer"] else 0.0


@agl.rollout(reward=_scored)
def ratio_agent(task: dict, llm: agl.LLM) -> dict:
    """Answers, and returns with its answer a ratio that is NaN when the task's ``denominator`` is 0 (as ``0 / 0`` in
    numpy is): a scored agent whose output holds a number JSON cannot carry."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=60)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    answer = reply.choices[0].message.content or ""
    denominator = task.get("denominator", 1)
    return {"answer": answer, "ratio": len(answer) / denominator if denominator else float("nan")}


KEPT_ROLLOUTS = 30
_kept: collections.deque[dict] = collections.deque(maxlen=KEPT_ROLLOUTS)


@agl.rollout
def cycle_agent(task: dict, llm: agl.LLM) -> float:
    """See the module docstring."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=60)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    cycle: dict = {"payload": b"x" * 2**19}
    cycle["self"] = cycle
    _kept.append(cycle)  # the oldest one drops out, unreachable but alive until a collection of the oldest generation
    return 1.0 if task["question"] in (reply.choices[0].message.content or "") else 0.0
