"""A module of the user's own that has a framework's name (``agents.py``, the OpenAI Agents SDK's import name) is not
taken for the framework: no adapter error, and the agent's calls are captured as usual."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

AGENT = """
import agentlightning as agl
from openai import OpenAI


@agl.rollout(roles=["solver"])
def solve(task: dict, llm: agl.LLM) -> float:
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    with agl.role("solver"):
        reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["q"]}])
    return 1.0 if reply.choices[0].message.content else 0.0
"""

SCRIPT = """
import agentlightning as agl
from agentlightning.testing import MockLLMServer

from agents import solve

with MockLLMServer(handler=lambda request: "4") as server:
    rollouts = agl.run(solve, [{"id": "t1", "q": "2 + 2 = ?"}], llm=server.llm())
print([(r.status, [call.role for call in r.calls]) for r in rollouts])
"""


def test_a_users_agents_py_is_not_taken_for_the_agents_sdk(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(textwrap.dedent(AGENT))
    (tmp_path / "main.py").write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('succeeded', ['solver'])]"
    assert "could not install" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
