"""End to end on a tiny random model: agent -> proxy -> HF backend -> transitions -> TRL update -> new version."""

from __future__ import annotations

import functools

import pytest
import torch
from agentlightning.trainers.models import tiny_model
from train_agents import echo_length_agent, task_reward_agent

import agentlightning as agl
from agentlightning.server import SQLiteStore


def test_train_updates_weights_and_serves_the_new_version(tmp_path):
    model, tokenizer = tiny_model(seed=1)
    before = {name: value.detach().clone() for name, value in model.state_dict().items()}
    tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(4)]

    result = agl.train(
        echo_length_agent,
        tasks,
        model=model,
        tokenizer=tokenizer,
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
        val_dataset=tasks[:2],
        val_every=0,
    )

    start, first, second = result.history
    assert start["step"] == 0 and "val/reward" in start  # the held-out evaluation before training
    assert first["model_version"] == "v0" and first["model_version_after"] == "v1"
    assert second["model_version"] == "v1", "the second step's rollouts must be served by the updated weights"
    for row in (first, second):
        assert row["llm_calls"] == 8 and row["calls_on_version"] == 8
        assert row["train/rows"] > 0
    changed = [name for name, value in result.model.state_dict().items() if not torch.equal(value, before[name])]
    assert changed, "one TRL update must change the weights"
    assert result.model_version == "v2"

    store = SQLiteStore(tmp_path / "run" / "store.db")
    try:
        rollouts = store.list_rollouts()
        step_two = [
            r for r in (store.get_rollout(info.rollout_id) for info in rollouts) if r.group_id.startswith("step1")
        ]
        assert len(step_two) == 8
        for rollout in step_two:
            (call,) = rollout.llm_calls
            assert call.token_source == "server" and call.completion_token_ids and call.prompt_token_ids
            assert call.metadata.get("model_version") == "v1"
            assert len(call.completion_logprobs) == len(call.completion_token_ids)
    finally:
        store.close()
    assert result.metrics_path.exists() and result.curve_path.exists()
    assert result.initial_validation is not None and result.final_validation is not None


@pytest.mark.parametrize("algorithm", ["grpo", "reinforce++"])
def test_groups_that_tie_are_trained_on_only_under_a_batch_baseline(tmp_path, algorithm):
    """Every group ties (the reward is the task's own) and the two groups differ: GRPO has nothing to learn and
    skips the update (and a run that updated nothing fails, saying why); reinforce++ centres on the batch mean and
    trains on every row."""
    model, tokenizer = tiny_model(seed=1)
    tasks = [{"id": "t0", "question": "a?", "reward": 0.0}, {"id": "t1", "question": "b?", "reward": 1.0}]
    train = functools.partial(
        agl.train,
        task_reward_agent,
        tasks,
        model=model,
        tokenizer=tokenizer,
        algorithm=algorithm,
        group_size=2,
        tasks_per_step=2,
        max_steps=1,
        learning_rate=1e-2,
        micro_batch_size=4,
        max_completion_length=4,
        output_dir=tmp_path / "run",
        nworkers=2,
        progress=False,
        save_model=False,
    )
    if algorithm == "grpo":
        with pytest.raises(
            agl.NothingTrainedError, match="every rollout of a group got the same reward \\(2 groups"
        ) as caught:
            train()
        result = caught.value.result
    else:
        result = train()
    (step,) = [row for row in result.history if row["step"] == 1]
    if algorithm == "grpo":
        assert step.get("skipped_update") == 1 and result.model_version == "v0"
    else:
        assert "skipped_update" not in step and step["batch/rows"] == 4 and result.model_version == "v1"


def test_shuffle_dataset_false_takes_the_tasks_in_the_dataset_order_epoch_after_epoch(tmp_path):
    """A curriculum (or an order that mixes kinds of task in every step) reaches the steps as written."""
    model, tokenizer = tiny_model(seed=1)
    tasks = [{"id": f"t{i}", "question": f"{i}?", "reward": 0.0} for i in range(3)]
    agl.train(
        task_reward_agent,
        tasks,
        model=model,
        tokenizer=tokenizer,
        shuffle_dataset=False,
        group_size=2,
        tasks_per_step=2,
        max_steps=3,
        micro_batch_size=4,
        max_completion_length=4,
        output_dir=tmp_path / "run",
        nworkers=2,
        progress=False,
        save_model=False,
        allow_no_update=True,  # every reward is 0: only the order of the tasks is looked at
    )
    store = SQLiteStore(tmp_path / "run" / "store.db")
    try:
        steps: dict[str, set[str]] = {}
        for info in store.list_rollouts():
            rollout = store.get_rollout(info.rollout_id)
            steps.setdefault(rollout.group_id.split(":")[0], set()).add(rollout.task_id)
    finally:
        store.close()
    assert steps == {"step0": {"t0", "t1"}, "step1": {"t2", "t0"}, "step2": {"t1", "t2"}}
