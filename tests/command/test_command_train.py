"""Training a command-line agent: its process's calls, recorded by the per-rollout proxy in front of the in-process
HF backend (tiny random model), become transitions and a TRL update changes the weights; the same on vLLM's CPU build
(`make vllm-venv`), where the second step's calls are served by the weights of the first update."""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys

import pytest
from command_agents import SCRIPTS, length_agent
from vllm_venv import DISK_SYNC_ON_CPU, largest_logprob_gap, require_vllm

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
    assert step["calls/proxy_only"] == 0  # every call is the proxy's on purpose: none counts as missed by capture
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


@pytest.mark.usefixtures("bubblewrap")
def test_agl_train_command_isolated_reaches_the_workers_agent(tmp_path, monkeypatch):
    """`agl train --command C --isolated`: the agent its worker processes import by reference is isolated too."""
    from agentlightning._command import command_line_agent

    for name in ("AGL_COMMAND", "AGL_COMMAND_ISOLATED"):  # set by command_line_agent for the workers: restored after
        monkeypatch.setenv(name, "")
    assert command_line_agent("python agent.py", isolated=True).isolated
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "from agentlightning._command import cli_agent; print(cli_agent.argv, cli_agent.isolated)",
        ],
        capture_output=True,
        text=True,
    )
    assert imported.stdout.strip() == "['python', 'agent.py'] True", imported.stderr[-2000:]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": 1}\n')
    misused = subprocess.run(
        [sys.executable, "-m", "agentlightning._cli", "train", "pkg:agent", "--isolated", "--dataset", str(tasks)],
        capture_output=True,
        text=True,
    )
    assert misused.returncode == 2 and "--isolated applies to a --command agent" in misused.stderr


@pytest.mark.slow
def test_two_steps_of_a_command_agent_on_vllm(tmp_path):
    """agl.train(backend="vllm") starts vLLM's CPU build and reloads the full weights from disk after each update:
    the command's calls go through the proxy to vLLM, which gives their token ids and logprobs; the second step's are
    sampled from the step-1 weights (their logprobs are that checkpoint's, not the initial model's)."""
    require_vllm()
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=5, hidden_size=256)  # head size 64: vLLM's CPU attention supports it
    initial = copy.deepcopy(model)
    tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(2)]
    result = agl.train(
        length_agent,
        tasks,
        model=model,
        tokenizer=tokenizer,
        backend="vllm",
        vllm=DISK_SYNC_ON_CPU,
        group_size=4,
        tasks_per_step=2,
        max_steps=2,
        learning_rate=1e-2,
        micro_batch_size=4,
        max_completion_length=8,
        temperature=1.0,
        output_dir=tmp_path / "run",
        nworkers=2,
        progress=False,
        save_model=False,
        val_every=0,
        checkpoint_every=1,
    )

    first, second = result.history
    assert (first["model_version"], first["model_version_after"]) == ("v0", "v1")
    assert (second["model_version"], second["model_version_after"]) == ("v1", "v2")
    for row in (first, second):
        assert row["llm_calls"] == 8 and row["calls_on_version"] == 8 and row["train/rows"] > 0
        assert row["sync/logprob_gap"] < 1e-3, row  # vLLM's logprobs equal the trainer's after each reload
    store = SQLiteStore(tmp_path / "run" / "store.db")
    try:
        rollouts = [store.get_rollout(info.rollout_id) for info in store.list_rollouts()]
    finally:
        store.close()
    assert len(rollouts) == 16 and all(rollout.status == "succeeded" for rollout in rollouts)
    calls = {step: [r.llm_calls[0] for r in rollouts if r.group_id.startswith(f"step{step}")] for step in (0, 1)}
    assert [len(calls[0]), len(calls[1])] == [8, 8]
    assert all(len(rollout.llm_calls) == 1 for rollout in rollouts)  # the script's one request, recorded once
    assert {call.metadata.get("model_version") for call in calls[0]} == {"v0"}
    assert {call.metadata.get("model_version") for call in calls[1]} == {"v1"}
    for call in calls[0] + calls[1]:
        assert call.token_source == "server" and call.prompt_token_ids and call.completion_token_ids
        assert len(call.completion_logprobs) == len(call.completion_token_ids)
    after_one = copy.deepcopy(initial)
    weights = torch.load(tmp_path / "run" / "checkpoints" / "step-1" / "trainable.pt", map_location="cpu")
    missing, unexpected = after_one.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    assert largest_logprob_gap(initial, calls[0]) < 1e-3  # vLLM sampled step 0 from the initial weights
    assert largest_logprob_gap(after_one, calls[1]) < 1e-3  # and step 1 from the step-1 weights
    assert largest_logprob_gap(initial, calls[1]) > 1e-2, "the first update must change what vLLM serves"
