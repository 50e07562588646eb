"""``agl.train(backend="vllm")`` end to end against the session's real vLLM server (conftest.py ``served``).

Runs before test_vllm_backend.py (file order); the LoRA adapters it loads are unloaded when the run ends.
"""

from __future__ import annotations

import copy
import logging
import time

import httpx
import pytest
from train_agents import reply_length_agent

import agentlightning as agl

pytest.importorskip("torch")
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
    served_models = {entry["id"] for entry in httpx.get(backend.base_url + "/models").json()["data"]}
    assert served_models == {"policy"}, "the run unloads its adapters when it ends"
