"""Honest outcomes (issue 35, item 3): a run that updated nothing fails with the reason, a typo in ``roles`` names the
roles seen, and an agent that cannot receive the model is refused before the first rollout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentlightning.rl.transitions import ExtractionStats, extract_transitions
from agentlightning.types import Call, Rollout

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def _agl_train(tmp_path: Path, agent: str, *options: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"{i} + {i}?"}) + "\n" for i in range(2)))
    return subprocess.run(
        [sys.executable, "-m", "agentlightning._cli", "train", f"train_agents:{agent}", "--dataset", str(tasks)]
        + list(options),
        cwd=HERE,  # agents are named relative to the working directory
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentlightning.trainers.models import tiny_model

    path = tmp_path_factory.mktemp("tiny")
    model, tokenizer = tiny_model(seed=3)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_a_typo_in_roles_fails_the_run_naming_the_roles_seen(tmp_path: Path, tiny_dir: Path) -> None:
    common = ["--model", str(tiny_dir), "--roles", "sovler", "--group-size", "2", "--tasks-per-step", "2"]
    common += ["--max-steps", "2", "--max-completion-length", "6", "--no-use-server", "--no-progress"]
    done = _agl_train(tmp_path, "solver_agent", *common, "--output-dir", str(tmp_path / "run"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert "ran 2 steps, but none updated the model: it is still v0" in done.stdout
    assert "no step updated the model (2 steps ran; it is still v0)" in done.stderr
    assert "roles ['sovler'] matched no LLM call; roles seen: ['solver'] (steps 1, 2)" in done.stderr
    assert "4 of 4 rollouts skipped" in done.stderr  # counted over the step's rollouts, not per group
    assert "--allow-no-update" in done.stderr and "Traceback" not in done.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2] and all(row["skipped_update"] == 1 for row in rows)
    assert any("roles seen: ['solver']" in line for line in rows[0]["warnings"])  # what the dashboard shows

    allowed = _agl_train(tmp_path, "solver_agent", *common, "--output-dir", str(tmp_path / "ok"), "--allow-no-update")
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "none updated the model" in allowed.stdout


@pytest.mark.slow
def test_an_agent_without_an_llm_parameter_is_refused_before_any_rollout(tmp_path: Path) -> None:
    started = time.perf_counter()
    done = _agl_train(tmp_path, "no_llm_agent", "--output-dir", str(tmp_path / "run"), timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "does not take the model it should call" in done.stderr
    assert "def no_llm_agent(task, llm)" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()  # refused before the model loaded or a rollout ran
    assert time.perf_counter() - started < 60


def _rollout(rollout_id: str, role: str, trainable: list[str]) -> Rollout:
    call = Call(
        call_id=f"{rollout_id}-c",
        rollout_id=rollout_id,
        sequence=0,
        role=role,
        name="m",
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        token_source="server",
    )
    return Rollout(
        rollout_id=rollout_id,
        task_id="t",
        status="succeeded",
        calls=[call],
        final_reward=1.0,
        trainable_roles=trainable,
    )


def test_a_typo_in_the_decorators_roles_is_named_too_and_counted_over_all_groups() -> None:
    groups = [[_rollout(f"r{g}{i}", "solver", ["sovler"]) for i in range(2)] for g in range(2)]
    stats = ExtractionStats.combined(extract_transitions(group).stats for group in groups)
    assert stats.problems() == [
        "4 of 4 rollouts skipped: no LLM call of a selected role with token ids",
        "roles ['sovler'] matched no LLM call; roles seen: ['solver']",
        "no transitions were produced from 4 rollouts",
    ]
    matched = ExtractionStats.combined(
        [extract_transitions(groups[0]).stats, extract_transitions([_rollout("x", "sovler", ["sovler"])]).stats]
    )
    assert matched.unmatched_roles == []  # matched in one group: not a typo
