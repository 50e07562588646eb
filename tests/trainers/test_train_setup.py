"""Model loading helpers, resume from a checkpoint, argument errors."""

from __future__ import annotations

import json

import pytest
import torch
from agentlightning.trainers.checkpoint import latest_checkpoint
from agentlightning.trainers.models import ModelLoadError, load_model, smollm2_gguf_path, tiny_model
from train_agents import echo_length_agent

import agentlightning as agl


def test_tiny_model_chat_template_renders_tools_and_tool_turns():
    _, tokenizer = tiny_model()
    tool = {"type": "function", "function": {"name": "calculator", "parameters": {}}}
    messages = [
        {"role": "user", "content": "2+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=[tool], tokenize=False, add_generation_prompt=True)
    assert '"name": "calculator"' in text and "<tools>" in text
    assert '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>' in text
    assert "<tool_response>\n4\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None


def test_smollm2_gguf_ships_with_the_wheel():
    path = smollm2_gguf_path()
    assert path.exists() and path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_unknown_model_name_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model"):
        load_model("no-such-org/no-such-model")


def test_resume_continues_from_the_latest_checkpoint(tmp_path):
    tasks = [{"id": f"t{i}", "question": f"{i} + {i}?"} for i in range(3)]
    options = dict(
        group_size=2,
        tasks_per_step=2,
        learning_rate=1e-2,
        micro_batch_size=2,
        max_completion_length=6,
        output_dir=tmp_path / "run",
        use_server=False,
        progress=False,
        save_model=False,
        checkpoint_every=1,
    )
    model, tokenizer = tiny_model(seed=2)
    first = agl.train(echo_length_agent, tasks, model=model, tokenizer=tokenizer, max_steps=2, **options)
    assert latest_checkpoint(tmp_path / "run").name == "step-2"
    saved = {name: value.clone() for name, value in first.model.state_dict().items()}

    fresh, tokenizer = tiny_model(seed=99)  # different initial weights: the checkpoint must restore them
    restored = agl.train(
        echo_length_agent, tasks, model=fresh, tokenizer=tokenizer, max_steps=2, resume=True, **options
    )
    for name, value in restored.model.state_dict().items():
        assert torch.equal(value, saved[name]), name
    assert restored.model_version == first.model_version

    second = agl.train(
        echo_length_agent, tasks, model=restored.model, tokenizer=tokenizer, max_steps=3, resume=True, **options
    )
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert rows[2]["model_version"] == first.model_version
    assert latest_checkpoint(tmp_path / "run").name == "step-3" and second.steps == 3


def test_train_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="group_size"):
        agl.train(echo_length_agent, [{"id": "a", "question": "q"}], group_size=1, output_dir=tmp_path)
    with pytest.raises(ValueError, match="non-empty list"):
        agl.train(echo_length_agent, [], output_dir=tmp_path)
    with pytest.raises(ValueError, match="algorithm"):
        agl.train(echo_length_agent, [{"q": 1}], algorithm="ppo-ish", output_dir=tmp_path)
