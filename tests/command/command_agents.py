"""Command agents used by the tests, at module level because client worker processes import them by reference."""

from __future__ import annotations

import sys
from pathlib import Path

import agentlightning as agl

SCRIPTS = Path(__file__).parent / "scripts"
TEMPLATE = Path(__file__).parent / "template"


def weather_reward(task: dict, workdir: Path, result: agl.CommandResult) -> float:
    """1.0 when the report the agent left in its working directory names the expected weather."""
    report = (workdir / "report.txt").read_text()
    return 1.0 if task["expect"] in report else 0.0


weather_agent = agl.CommandAgent(
    [sys.executable, str(SCRIPTS / "anthropic_agent.py")], template=TEMPLATE, reward=weather_reward, timeout=60
)

# The question from a placeholder; the reward the script prints (1.0 when the answer holds task["expect"]).
echo_agent = agl.CommandAgent([sys.executable, str(SCRIPTS / "openai_agent.py"), "{task[question]}"], timeout=60)

# For the training test: one call per rollout, a reward that varies with the reply.
length_agent = agl.CommandAgent([sys.executable, str(SCRIPTS / "length_agent.py")], timeout=120)

# Reports what its credentials reach (its own proxy; the server's admin routes) as a JSON line of its stdout.
credential_probe = agl.CommandAgent([sys.executable, str(SCRIPTS / "credential_probe.py")], timeout=60)
