"""The Calc-X example end to end on CPU: AutoGen assistant -> mock model -> calculator FunctionTool (successes and
failures) -> capture with the agent's name as role -> numeric reward -> AIR penalty on the call that broke the tool."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import agentlightning as agl
from agentlightning.rl.air import ToolErrorRule
from agentlightning.testing import MockLLMServer
from examples.calc_x import eval as calc_eval
from examples.calc_x.calc_agent import AGENT_NAME, calc_agent
from examples.calc_x.data import SOURCES, load_tasks
from examples.calc_x.mock import WRONG_ANSWER, mock_handler
from examples.common import REPO_ROOT, mock_dry_run


def test_sources_and_splits(data_dir: Path) -> None:
    train = load_tasks(data_dir, "train", SOURCES)
    test = load_tasks(data_dir, "test", SOURCES)
    assert sum(t["source"] == "gsm8k" for t in train) == 7473 and sum(t["source"] == "gsm8k" for t in test) == 1319
    assert sum(t["source"] == "svamp" for t in train) == 700 and sum(t["source"] == "svamp" for t in test) == 300
    assert sum(t["source"] == "calcx" for t in train) == 10
    assert test[0]["answer"] == "18"  # Janet's ducks, '#### 18'
    with pytest.raises(ValueError, match="unknown Calc-X source"):
        load_tasks(data_dir, "train", ["math"])


def test_dry_run_roles_tool_errors_rewards_and_air(data_dir: Path) -> None:
    tasks = load_tasks(data_dir, "test", ["gsm8k"])[:2]
    result = mock_dry_run(calc_agent, tasks, mock_handler(tasks), group_size=3, air=[ToolErrorRule(penalty=-0.5)])
    assert all(r.status == "succeeded" for r in result.rollouts)
    for rollout in result.rollouts:
        assert {call.role for call in rollout.calls} == {AGENT_NAME}
        tools = [call for call in rollout.calls if call.kind == "tool"]
        if not tools:  # answered directly in a loose format: '$18.0'
            assert rollout.final_reward == 1.0 and "$" in rollout.output["answer"]
        elif tools[0].status == "error":  # bad expression -> tool error -> wrong guess
            assert "cannot parse 'two plus three'" in tools[0].error
            assert rollout.output["answer"] == WRONG_ANSWER and rollout.final_reward == 0.0
        else:
            assert tools[0].output == rollout.task["answer"] and rollout.final_reward == 1.0
    for task in tasks:
        rewards = sorted(r.final_reward for r in result.rollouts if r.task_id == task["task_id"])
        assert rewards == [0.0, 1.0, 1.0]
    # AIR: the LLM call that sent the bad expression gets final reward 0 plus the -0.5 penalty
    failing = [r for r in result.rollouts if any(c.status == "error" for c in r.calls)]
    assert len(failing) == 2
    for rollout in failing:
        rewards = [t.reward for t in result.transitions if t.rollout_id == rollout.rollout_id]
        assert rewards == [-0.5, 0.0]
    assert len(result.transitions) == 2 * (1 + 2 + 2) and set(result.roles()) == {AGENT_NAME}


def test_malformed_gold_fails_the_rollout_clearly(data_dir: Path) -> None:
    task = {**load_tasks(data_dir, "test", ["gsm8k"])[0], "answer": "eighteen"}
    with MockLLMServer(handler=mock_handler([task])) as server:
        (rollout,) = agl.run(calc_agent, [task], llm=server.llm())
    assert rollout.status == "failed" and rollout.error.type == "GoldAnswerError"
    assert "gold answer 'eighteen' is not a number" in rollout.error.message


def test_eval_script(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tasks = load_tasks(data_dir, "test", ["gsm8k"])[:3]
    with MockLLMServer(handler=mock_handler(tasks)) as server:
        arguments = ["--base-url", server.base_url, "--model", "m", "--data-dir", str(data_dir), "--limit", "3"]
        assert calc_eval.main(arguments) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(f"calc-x-test ({server.base_url}, version ") and "3 rollouts of 3 tasks" in lines[0]
    assert lines[1].startswith("accuracy ") and "(Wilson 95%)" in lines[1]
    assert re.match(r"LLM calls \d+ \(calculator_assistant \d+\); tool calls \d+, failed \d+", lines[2]), lines[2]


def test_train_cli_dry_run_and_missing_data_dir(data_dir: Path, tmp_path: Path) -> None:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "examples.calc_x.train", "--dry-run"],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "transitions for training" in run.stdout and "dry run: 18 rollouts" in run.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "examples.calc_x.train", "--dry-run", "--data-dir", str(tmp_path / "nowhere")],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode != 0
    assert missing.stderr.startswith("error: 'calc_x/gsm8k/") and "not found under data directory" in missing.stderr
    assert "Traceback" not in missing.stderr and missing.returncode == 2
    assert "pass --data-dir" in missing.stderr
