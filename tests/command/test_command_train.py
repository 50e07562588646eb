"""One training step of a command-line agent: its process's calls, recorded by the per-rollout proxy in front of
the in-process HF backend (tiny random model), become transitions and a TRL update changes the weights."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from command_agents import SCRIPTS, length_agent

import agentlightning as agl
from agentlightning.server import SQLiteStore

torch = pytest.importorskip("torch")


def test_one_training_step_of_a_command_agent(tmp_path):
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=1)
    before = {name: value.detach().clone() for name, value in model.state_dict().items()}
    tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(2)]

    result = agl.train(
        length_agent,
        tasks,
        model=model,
        tokenizer=tokenizer,
        group_size=4,
        tasks_per_step=2,
        max_steps=1,
        learning_rate=1e-2,
        micro_batch_size=4,
        max_completion_length=8,
        output_dir=tmp_path / "run",
        nworkers=2,
        progress=False,
        save_model=False,
    )

    [step] = result.history
    assert step["llm_calls"] == 8 and step["train/rows"] > 0
    assert step["model_version"] == "v0" and step["model_version_after"] == "v1"
    changed = [name for name, value in result.model.state_dict().items() if not torch.equal(value, before[name])]
    assert changed, "the update must change the weights"
    store = SQLiteStore(tmp_path / "run" / "store.db")
    try:
        rollouts = [store.get_rollout(info.rollout_id) for info in store.list_rollouts()]
    finally:
        store.close()
    assert len(rollouts) == 8 and all(r.status == "succeeded" for r in rollouts)
    for rollout in rollouts:
        (call,) = rollout.llm_calls
        assert call.token_source == "server" and call.prompt_token_ids and call.completion_token_ids
        assert any(line.startswith("stdout (tail): reply: ") for line in rollout.logs)


def test_agl_train_command_from_the_shell(tmp_path):
    from agentlightning.trainers.models import tiny_model

    model_dir = tmp_path / "tiny"
    model, tokenizer = tiny_model(seed=3)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"{i} + {i}?"}) + "\n" for i in range(2)))
    command = shlex.join([sys.executable, str(SCRIPTS / "length_agent.py")])
    options = ["--model", str(model_dir), "--group-size", "4", "--tasks-per-step", "2", "--max-steps", "1"]
    options += [
        "--max-completion-length",
        "8",
        "--nworkers",
        "2",
        "--no-progress",
        "--output-dir",
        str(tmp_path / "run"),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "agentlightning._cli", "train", "--command", command, "--dataset", str(tasks), *options],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["llm_calls"] == 8 and row["train/rows"] > 0 and row["model_version_after"] == "v1"

    neither = subprocess.run(
        [sys.executable, "-m", "agentlightning._cli", "train", "--dataset", str(tasks)], capture_output=True, text=True
    )
    assert neither.returncode == 2
    assert "agl train: error: give the agent as 'package.module:function' or a --command" in neither.stderr
