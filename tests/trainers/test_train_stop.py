"""``stop_accuracy``: training ends at the first held-out evaluation that reaches it, with a checkpoint there."""

from __future__ import annotations

import json

from agentlightning.trainers.checkpoint import latest_checkpoint
from agentlightning.trainers.models import tiny_model
from train_agents import echo_length_agent

import agentlightning as agl


def test_training_stops_once_held_out_accuracy_reaches_stop_accuracy(tmp_path):
    tasks = [{"id": f"t{i}", "question": f"{i} + {i}?"} for i in range(3)]
    model, tokenizer = tiny_model(seed=2)
    result = agl.train(
        echo_length_agent,
        tasks,
        model=model,
        tokenizer=tokenizer,
        max_steps=5,
        group_size=2,
        tasks_per_step=2,
        learning_rate=1e-2,
        micro_batch_size=2,
        max_completion_length=6,
        output_dir=tmp_path / "run",
        use_server=False,
        progress=False,
        save_model=False,
        val_dataset=tasks[:2],
        val_every=2,
        success_threshold=0.0,
        stop_accuracy=0.9,  # every rollout counts as a success: accuracy 1.0
    )
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2]  # the evaluation after step 2 reached it
    assert rows[-1]["val/accuracy"] == 1.0 and rows[-1]["val_seconds"] > 0 and "val_seconds" not in rows[1]
    assert result.steps == 2 and latest_checkpoint(tmp_path / "run").name == "step-2"
