"""``agl.train(backend="vllm")`` end to end: LoRA sync against the session's real vLLM server (conftest.py
``served``), and full fine-tuning with disk sync through a server the run starts and stops itself.

Runs before test_vllm_backend.py (file order); the LoRA adapters it loads are unloaded when the run ends.
"""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import time

import httpx
import pytest
from train_agents import reply_length_agent
from vllm_venv import DISK_SYNC_ON_CPU, largest_logprob_gap, require_vllm

import agentlightning as agl

torch = pytest.importorskip("torch")
from agentlightning.server import SQLiteStore  # noqa: E402

logger = logging.getLogger(__name__)


@pytest.mark.slow
def test_two_steps_on_vllm_serve_the_new_version_and_report_the_logprob_gap(served, tmp_path) -> None:
    backend, model, tokenizer = served
    tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(4)]
    started = time.perf_counter()
    result = agl.train(
        reply_length_agent,
        tasks,
        model=copy.deepcopy(model),
        tokenizer=tokenizer,
        backend="vllm",
        vllm={"url": backend.url},
        lora={"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
        group_size=4,
        tasks_per_step=2,
        max_steps=2,
        learning_rate=1e-2,
        micro_batch_size=4,
        max_completion_length=8,
        output_dir=tmp_path / "run",
        nworkers=2,
        progress=False,
        save_model=False,
        val_every=0,
        checkpoint_every=1,
    )
    logger.warning("2-step agl.train on vLLM: %.1f s; rows %s", time.perf_counter() - started, result.history)

    first, second = result.history
    assert first["model_version"] == "v0" and first["model_version_after"] == "v1"
    assert second["model_version"] == "v1", "the second step's rollouts must be sampled from the synced weights"
    for row in (first, second):
        assert row["llm_calls"] == 8 and row["calls_on_version"] == 8
        assert "train/sampling/importance_sampling_ratio/mean" in row  # IS correction is on with vLLM
    assert first["sync/logprob_gap"] < 1e-3  # vLLM's LoRA logprobs equal the trainer's after the first sync
    assert "sync/logprob_gap" not in second  # then checked every vllm.check_logprobs_every (10) syncs
    assert result.model_version == "v2"

    store = SQLiteStore(tmp_path / "run" / "store.db")
    try:
        rollouts = [store.get_rollout(info.rollout_id) for info in store.list_rollouts()]
        step_two = [rollout for rollout in rollouts if rollout.group_id.startswith("step1")]
        assert len(step_two) == 8
        for rollout in step_two:
            (call,) = rollout.llm_calls
            assert call.metadata.get("model_version") == "v1"
            assert call.token_source == "server" and call.prompt_token_ids and call.completion_token_ids
            assert len(call.completion_logprobs) == len(call.completion_token_ids)
    finally:
        store.close()
    # The second step's answers were sampled from the adapter of step 1: the policy with the step-1 checkpoint's
    # adapter gives their logprobs, the base model (v0: the adapter starts at zero) does not.
    policy = result.model
    weights = torch.load(tmp_path / "run" / "checkpoints" / "step-1" / "trainable.pt", map_location="cpu")
    assert not policy.load_state_dict(weights, strict=False).unexpected_keys
    calls = [rollout.llm_calls[0] for rollout in step_two]
    after_one = largest_logprob_gap(policy, calls)
    with policy.disable_adapter():
        base = largest_logprob_gap(policy, calls)
    logger.warning("largest logprob gaps of step 2's answers (nats): step-1 adapter %.2e, base %.2e", after_one, base)
    assert after_one < 1e-3 and base > 1e-2, (after_one, base)
    served_models = {entry["id"] for entry in httpx.get(backend.base_url + "/models").json()["data"]}
    assert served_models == {"policy"}, "the run unloads its adapters when it ends"


def _vllm_servers() -> set[str]:
    """Pid and command line of each vLLM server this process started and that still runs."""
    found = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(os.getpid())], capture_output=True, text=True)
    return {line.strip() for line in found.stdout.splitlines() if "agl_vllm_launch" in line}


@pytest.mark.slow
def test_agl_train_starts_its_own_vllm_and_syncs_full_weights_from_disk(tmp_path) -> None:
    """Full fine-tuning through a vLLM server ``agl.train`` starts and stops itself, weights synced by reloading them
    from disk after every update: each step's rollouts are sampled from the weights of the step before (their
    recorded logprobs are those of the step's checkpoint, not of the initial model) and the post-sync check agrees."""
    require_vllm()
    import torch
    from agentlightning.trainers.models import tiny_model

    model, tokenizer = tiny_model(seed=4, hidden_size=256)  # head size 64: vLLM's CPU attention supports it
    initial = copy.deepcopy(model)
    tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(4)]
    servers = _vllm_servers()  # the session's shared one, when the other tests of this folder started it
    started = time.perf_counter()
    result = agl.train(
        reply_length_agent,
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
    logger.warning("2-step agl.train with its own vLLM, disk sync: %.1f s", time.perf_counter() - started)
    assert _vllm_servers() == servers, "the run stops the vLLM server it started"

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
    calls = {step: [r.llm_calls[0] for r in rollouts if r.group_id.startswith(f"step{step}")] for step in (0, 1)}
    assert [len(calls[0]), len(calls[1])] == [8, 8]
    assert {call.metadata.get("model_version") for call in calls[1]} == {"v1"}
    after_one = copy.deepcopy(initial)
    weights = torch.load(tmp_path / "run" / "checkpoints" / "step-1" / "trainable.pt", map_location="cpu")
    missing, unexpected = after_one.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    gaps = {
        "step 0 vs initial": largest_logprob_gap(initial, calls[0]),
        "step 1 vs step-1 weights": largest_logprob_gap(after_one, calls[1]),
        "step 1 vs initial": largest_logprob_gap(initial, calls[1]),
    }
    logger.warning("largest logprob gaps (nats): %s", gaps)
    assert gaps["step 0 vs initial"] < 1e-3 and gaps["step 1 vs step-1 weights"] < 1e-3
    assert gaps["step 1 vs initial"] > 1e-2, "the first update must change what vLLM serves"
