"""Command agents used by the tests, at module level because client worker processes import them by reference."""

from __future__ import annotations

import shutil
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

# Real coding agents from npm (`make cli-agents`), for test_cli_agents.py. Each rollout asks the agent to write a
# number to answer.txt; the reward is whether the file holds the task's expected answer.
CLI_AGENTS = Path(__file__).resolve().parents[2] / ".cli-agents" / "node_modules" / ".bin"


def answer_reward(task: dict, workdir: Path, result: agl.CommandResult) -> float:
    """1.0 when answer.txt, left in the working directory, holds the expected number."""
    answer = workdir / "answer.txt"
    return 1.0 if answer.exists() and answer.read_text().strip() == task["expect"] else 0.0


# Claude Code's documented switches for a machine without its vendor: no telemetry, error reports, auto-update or
# other non-essential traffic. ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY come from the CommandAgent.
CLAUDE_OFFLINE = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
}
CLAUDE_ARGV = [
    str(CLI_AGENTS / "claude"),
    "-p",  # print mode: one prompt, no terminal UI
    "{task[prompt]}",
    "--model",
    "{model}",
    "--allowedTools",
    "Bash",
    "--output-format",
    "json",
]
# Codex reads its endpoint from a model provider of its config (OPENAI_BASE_URL is not read for the built-in one):
# given here with -c options, the rollout's address filled in by {base_url}. Plugins and apps are off because they
# sync from github.com and chatgpt.com at start-up; analytics, feedback and the update check are off too.
CODEX_ARGV = [
    str(CLI_AGENTS / "codex"),
    "exec",
    "--skip-git-repo-check",
    "--sandbox",
    "workspace-write",
    "--model",
    "{model}",
    "-c",
    "model_provider=agl",
    "-c",
    'model_providers.agl.name="agentlightning"',
    "-c",
    'model_providers.agl.base_url="{base_url}"',
    "-c",
    'model_providers.agl.env_key="OPENAI_API_KEY"',
    "-c",
    'model_providers.agl.wire_api="responses"',
    "-c",
    "check_for_update_on_startup=false",
    "-c",
    "analytics.enabled=false",
    "-c",
    "feedback.enabled=false",
    "-c",
    "features.plugins=false",
    "-c",
    "features.remote_plugin=false",
    "-c",
    "features.apps=false",
    "{task[prompt]}",
]

claude_agent = agl.CommandAgent(CLAUDE_ARGV, env=CLAUDE_OFFLINE, reward=answer_reward, timeout=120, name="claude")
codex_agent = agl.CommandAgent(CODEX_ARGV, reward=answer_reward, timeout=120, name="codex")
# The same agents with a short timeout, and a variable that marks every process they start (to find any left over).
claude_hung_agent = agl.CommandAgent(
    CLAUDE_ARGV, env={**CLAUDE_OFFLINE, "AGL_CLI_TEST": "claude-hung"}, timeout=8, name="claude_hung"
)
codex_hung_agent = agl.CommandAgent(CODEX_ARGV, env={"AGL_CLI_TEST": "codex-hung"}, timeout=8, name="codex_hung")

# mini-swe-agent from PyPI in its own venv (`make cli-agents`): its `mini` CLI, the model through LiteLLM's OpenAI
# provider at the rollout's address, no confirmations (-y, --exit-immediately). Given -c, it reads only the configs
# named, so its default mini.yaml comes first. MSWEA_CONFIGURED skips its first-run set-up prompt,
# MSWEA_COST_TRACKING=ignore_errors its refusal of a model it has no price for, and LITELLM_LOCAL_MODEL_COST_MAP keeps
# LiteLLM from fetching its price list at import.
MINI_SWE_AGENT = Path(__file__).resolve().parents[2] / ".cli-agents" / "mini-swe-agent" / "bin" / "mini"
MINI_OFFLINE = {
    "MSWEA_CONFIGURED": "true",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}
MINI_ARGV = [
    str(MINI_SWE_AGENT),
    "-y",
    "--exit-immediately",
    "-m",
    "openai/{model}",
    "-c",
    "mini.yaml",
    "-c",
    "model.model_kwargs.api_base={base_url}",
    "-o",
    "{workdir}/trajectory.json",
    "-t",
    "{task[prompt]}",
]
mini_agent = agl.CommandAgent(MINI_ARGV, env=MINI_OFFLINE, reward=answer_reward, timeout=120, name="mini")

# The same three under bubblewrap (isolated=True), where it is installed (`make bubblewrap`).
if shutil.which("bwrap") is not None:
    claude_isolated_agent = agl.CommandAgent(
        CLAUDE_ARGV, env=CLAUDE_OFFLINE, reward=answer_reward, timeout=120, name="claude_isolated", isolated=True
    )
    # Codex's own sandbox cannot start inside this one (its helper binary is not created under a temporary
    # directory, where the rollout's HOME is), and the rollout is sandboxed already: its tools run unconfined.
    CODEX_ISOLATED_ARGV = [("danger-full-access" if word == "workspace-write" else word) for word in CODEX_ARGV]
    codex_isolated_agent = agl.CommandAgent(
        CODEX_ISOLATED_ARGV, reward=answer_reward, timeout=120, name="codex_isolated", isolated=True
    )
    mini_isolated_agent = agl.CommandAgent(
        MINI_ARGV, env=MINI_OFFLINE, reward=answer_reward, timeout=120, name="mini_isolated", isolated=True
    )
mini_hung_agent = agl.CommandAgent(
    MINI_ARGV, env={**MINI_OFFLINE, "AGL_CLI_TEST": "mini-hung"}, timeout=8, name="mini_hung"
)
