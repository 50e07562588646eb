"""Asynchronous training end to end on a tiny random model: weight updates while rollouts are in flight, the
staleness bound and importance-sampling metrics of a real run, and a resume in the middle of the pipeline."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import async_agents
import pytest
import torch
from agentlightning.trainers.backends.hf.server import HFBackendServer
from agentlightning.trainers.models import tiny_model
from agentlightning.trainers.rollouts import LocalRollouts
from async_agents import sampled_together_agent, two_call_agent
from train_agents import echo_length_agent

import agentlightning as agl
from agentlightning.server import SQLiteStore
from agentlightning.types import Transition


def test_the_weights_change_only_inside_weights_changing(tmp_path):
    """What lets the HF backend keep generating through the forward and backward passes of an update."""
    from agentlightning.trainers.learner.grpo import LightningGRPOTrainer, grpo_config

    from agentlightning.rl import pack

    model, tokenizer = tiny_model(seed=2)
    trainer = LightningGRPOTrainer(model, grpo_config(str(tmp_path), micro_batch_size=4, learning_rate=1e-2), tokenizer)
    weights = [parameter for parameter in trainer.model.parameters() if parameter.requires_grad]
    initial = [parameter.detach().clone() for parameter in weights]
    seen = []

    @contextmanager
    def changing():
        seen.append(all(torch.equal(a, b) for a, b in zip(weights, initial, strict=True)))
        yield
        seen.append(all(torch.equal(a, b) for a, b in zip(weights, initial, strict=True)))

    rows = [
        Transition(
            rollout_id=f"r{i}",
            group_id="g",
            index=0,
            prompt_token_ids=[5, 6, 7],
            completion_token_ids=[8, 9 + i],
            advantage=1.0 - i,
            weight=1.0,
        )
        for i in range(3)
    ]
    trainer.step(pack(rows, tokenizer.pad_token_id), weights_changing=changing)
    assert seen == [True, False], "unchanged through forward/backward, changed by the optimizer step inside the block"


def test_the_importance_ratio_comes_from_the_training_forward_and_scales_the_update(tmp_path):
    """With one iteration, step() runs no extra forward pass for the ratio: each micro-batch's training forward
    gives the old log-probabilities. Sampling log-probabilities ln 2 below the model's make a (truncated) ratio of
    2 on every token, which doubles the SGD update against sampling log-probabilities equal to the model's."""
    from agentlightning.trainers.learner.grpo import LightningGRPOTrainer, grpo_config

    from agentlightning.rl import pack

    def trainer(name):
        model, tokenizer = tiny_model(seed=4)
        config = grpo_config(
            str(tmp_path / name),
            micro_batch_size=2,
            learning_rate=0.1,
            optim="sgd",
            max_grad_norm=0.0,
            vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode="token_truncate",
            vllm_importance_sampling_clip_max=3.0,
        )
        return LightningGRPOTrainer(model, config, tokenizer)

    def rows(logprobs=None):
        return [
            Transition(
                rollout_id=f"r{i}",
                group_id="g",
                index=0,
                prompt_token_ids=[5, 6, 7 + i],
                completion_token_ids=[8, 9 + i, 3],
                advantage=1.0 - i,
                weight=1.0,
                completion_logprobs=None if logprobs is None else logprobs[i],
            )
            for i in range(3)
        ]

    reference = trainer("reference")
    unscored = pack(rows([[0.0, 0.0, 0.0]] * 3), reference.processing_class.pad_token_id)
    own = reference._generate_and_score_completions(unscored)["old_per_token_logps"]  # a separate forward pass
    own_rows = [own[i, :3].tolist() for i in range(3)]
    deltas, ratios = [], []
    for name, shift in (("same", 0.0), ("shifted", math.log(2))):
        run = trainer(name)
        batch = pack(rows([[value - shift for value in row] for row in own_rows]), run.processing_class.pad_token_id)
        forwards = []
        hook = run.model.register_forward_hook(lambda *args, calls=forwards: calls.append(1))
        before = [parameter.detach().clone() for parameter in run.model.parameters()]
        metrics = run.step(batch)
        hook.remove()
        assert len(forwards) == 2, "one forward per micro-batch (3 rows in micro-batches of 2), none for the ratio"
        deltas.append([after.detach() - start for after, start in zip(run.model.parameters(), before, strict=True)])
        ratios.append(metrics["sampling/raw_ratio/mean"])
    assert abs(ratios[0] - 1.0) < 1e-4 and abs(ratios[1] - 2.0) < 1e-3, ratios
    assert any(delta.abs().max() > 0 for delta in deltas[0])
    for same, shifted in zip(*deltas, strict=True):
        assert torch.allclose(shifted, 2 * same, atol=1e-6, rtol=1e-4)


def test_an_update_while_a_rollout_is_in_flight_leaves_each_call_its_own_version():
    model, tokenizer = tiny_model(seed=3)
    async_agents.FIRST_CALL_DONE.clear()
    async_agents.WEIGHTS_UPDATED.clear()
    with HFBackendServer(model, tokenizer, model_version="v0", always_logprobs=True) as backend:
        source = LocalRollouts(two_call_agent, nworkers=1)
        source.set_model(backend.base_url, backend.model_name, backend.model_version)  # never told about v1
        try:
            (group,) = source.submit([{"id": "t0", "question": "hello"}], 1, "step0", timeout=60)
            assert async_agents.FIRST_CALL_DONE.wait(timeout=60)
            with backend.updating("v1"), torch.no_grad():  # the rollout is between its two calls
                for parameter in model.parameters():
                    parameter.add_(0.01)
            async_agents.WEIGHTS_UPDATED.set()
            (rollout,) = group.result(timeout=60)
        finally:
            source.close()
    assert rollout.status == "succeeded", rollout.error
    first, second = rollout.llm_calls
    assert (first.metadata["model_version"], second.metadata["model_version"]) == ("v0", "v1")
    assert rollout.model_version == "v0"  # the version the rollout started on
    transitions = agl.transitions([rollout])
    assert [row.model_version for row in transitions] == ["v0", "v1"]
    assert all(len(row.completion_logprobs) == len(row.completion_token_ids) for row in transitions)


TRAINING = dict(
    group_size=4,
    tasks_per_step=2,
    learning_rate=1e-2,
    micro_batch_size=4,
    max_completion_length=8,
    nworkers=2,
    progress=False,
    save_model=False,
    max_staleness=1,
    checkpoint_every=1,
)
TASKS = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(12)]

KILLED_RUN = """
import sys
sys.path.insert(0, {tests!r})
from train_agents import echo_length_agent
import agentlightning as agl
from agentlightning.trainers.models import tiny_model
model, tokenizer = tiny_model(seed=1)
agl.train(echo_length_agent, {tasks!r}, model=model, tokenizer=tokenizer, max_steps=4, output_dir={output!r},
          use_server=False, **{options!r})
"""


def test_asynchronous_training_bounds_staleness_and_corrects_off_policy(tmp_path):
    # The first step submits its own 2 groups and the 2 of the next step (16 rollouts), all running at once; none
    # returns before all 16 made their call, so step 2 trains on groups sampled one version behind.
    async_agents.SAMPLED_TOGETHER = 16
    model, tokenizer = tiny_model(seed=1)
    options = {**TRAINING, "use_server": False, "nworkers": 16}
    result = agl.train(
        sampled_together_agent,
        TASKS,
        model=model,
        tokenizer=tokenizer,
        max_steps=3,
        output_dir=tmp_path / "run",
        **options,
    )
    rows = [row for row in result.history if row["step"] > 0]
    assert len(rows) == 3
    for row in rows:
        assert row["async/staleness_max"] <= 1, row
        assert row["async/trainer_wait_seconds"] >= 0 and row["async/sampler_wait_seconds"] >= 0
    assert rows[0]["async/queue_depth"] + rows[0]["async/groups_used"] + rows[0]["async/groups_without_signal"] >= 4
    assert rows[-1]["async/queue_depth"] == 0, "nothing is sampled ahead of the last step"
    trained = [row for row in rows if not row.get("skipped_update")]
    assert trained, "no step trained"
    assert rows[1]["async/staleness_max"] == 1, "rollouts sampled ahead were trained on"
    for row in trained:
        # importance sampling is on by default with max_staleness > 0
        assert 0 < row["train/sampling/raw_ratio/mean"] and "train/sampling/masked_tokens" in row, row
        assert 0 <= row["async/pause_seconds"] < row["train/update_seconds"], "the pause is part of the update"
    assert result.model_version == f"v{len(trained)}"


def test_a_run_killed_mid_pipeline_resumes_with_the_groups_that_were_in_flight(tmp_path):
    output = tmp_path / "run"
    script = KILLED_RUN.format(tests=str(Path(__file__).parent), tasks=TASKS, output=str(output), options=TRAINING)
    process = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    checkpoint = output / "checkpoints" / "step-2" / "state.json"
    try:
        deadline = time.monotonic() + 240
        while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert checkpoint.exists(), f"the run never reached step 2 (exit code {process.poll()})"
    finally:
        process.kill()  # mid-step 3: the groups sampled ahead die with it
        process.wait(timeout=30)
    state = json.loads(checkpoint.read_text())
    pending = [TASKS[index]["id"] for index in state["pending"]]
    assert len(pending) >= 2, "the groups running ahead of step 3 are saved with the checkpoint"

    model, tokenizer = tiny_model(seed=1)
    resumed = agl.train(
        echo_length_agent,
        TASKS,
        model=model,
        tokenizer=tokenizer,
        max_steps=4,
        output_dir=output,
        resume=True,
        **TRAINING,
    )
    steps = [row["step"] for row in resumed.history if row["step"] > 0]
    assert steps[:2] == [1, 2] and steps[-2:] == [3, 4]
    store = SQLiteStore(output / "store.db")
    try:
        step_three = {info.task_id for info in store.list_rollouts(limit=1000) if info.group_id.startswith("step2:")}
        left = {info.status for info in store.list_rollouts(limit=1000)}
    finally:
        store.close()
    assert set(pending) <= step_three, "the resumed run first re-runs the groups that were in flight"
    assert not left & {"queued", "running"}, "nothing is left queued or running when a run ends"


def test_an_update_beside_a_decoding_batch_computes_the_loss_it_computes_alone(tmp_path):
    """TRL's loss reads ``model.training`` (the micro-batch normaliser): the HF backend decoding beside an update
    (``max_staleness > 0``) must leave the shared model's mode alone."""
    import copy

    from agentlightning.trainers.backends.hf.generation import GenerationEngine, SamplingParams
    from agentlightning.trainers.learner.grpo import LightningGRPOTrainer, grpo_config

    from agentlightning.rl import pack

    model, tokenizer = tiny_model(seed=3)
    twin = copy.deepcopy(model)
    rows = [
        Transition(
            rollout_id=f"r{i}",
            group_id="g",
            index=0,
            prompt_token_ids=[5, 6, 7, 8],
            completion_token_ids=[9 + i, 10, 11 + i],
            advantage=1.0 - i / 4,
            weight=1.0,
        )
        for i in range(8)
    ]
    alone = LightningGRPOTrainer(twin, grpo_config(str(tmp_path / "a"), micro_batch_size=2), tokenizer).step(
        pack(rows, tokenizer.pad_token_id)
    )
    trainer = LightningGRPOTrainer(model, grpo_config(str(tmp_path / "b"), micro_batch_size=2), tokenizer)
    engine = GenerationEngine(model, tokenizer, max_batch_size=8, batch_wait_s=0.0)
    engine.eos_token_ids = set()  # the rows decode their whole budget, through the update
    engine.start()
    try:
        futures = [engine.submit([5, 6, 7 + i], SamplingParams(max_tokens=400)) for i in range(8)]
        while engine.rows_run == 0:
            time.sleep(0.001)
        beside = trainer.step(pack(rows, tokenizer.pad_token_id))
        overlapped = not all(future.done() for future in futures)
    finally:
        engine.stop()
    assert alone["micro_batches"] == beside["micro_batches"] == 4
    assert overlapped, "the rows were still decoding when the update ended"
    assert beside["loss"] == pytest.approx(alone["loss"], rel=1e-5)  # not 4x it (no micro-batch normaliser)
