"""Rejection-sampling SFT from captured traces on the tiny model: a real training run's store -> the rollouts that
passed the threshold -> rows that are exactly the captured token ids -> TRL's SFTTrainer (the loss goes down) ->
a merged model that ``agl.train`` starts from; and ``agl sft`` from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
import torch
from agentlightning.trainers.models import load_model, tiny_model
from agentlightning.trainers.sft import NoSFTRowsError, read_rollouts, select_rollouts, sft, sft_rows
from train_agents import echo_length_agent

import agentlightning as agl
from agentlightning._cli import main as agl_main
from agentlightning.testing import MockLLMServer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model saved as a directory (what a user names with ``model=``)."""
    model, tokenizer = tiny_model(seed=3)
    directory = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Path:
    """A real one-step training run of the tiny model (server, workers, HF backend, store.db), held-out tasks too."""
    tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(4)]
    directory = tmp_path_factory.mktemp("run")
    agl.train(
        echo_length_agent,
        tasks,
        model=str(tiny_dir),
        group_size=4,
        tasks_per_step=4,
        max_steps=1,
        learning_rate=1e-3,
        micro_batch_size=4,
        max_completion_length=8,
        output_dir=directory,
        nworkers=2,
        progress=False,
        save_model=False,
        val_dataset=[{"id": "held-out", "question": "What is 9 + 9?"}],
        val_every=0,
    )
    return directory


def test_rows_are_the_captured_token_ids_of_the_rollouts_that_passed(run_dir: Path) -> None:
    rollouts = read_rollouts(run_dir)
    assert {r.group_id.split(":")[0] for r in rollouts} >= {"step0", "val-initial"}
    kept = select_rollouts(rollouts, min_reward=0.5)
    assert kept and all(r.final_reward >= 0.5 and not r.group_id.startswith("val-") for r in kept)
    assert len(kept) < len([r for r in rollouts if not r.group_id.startswith("val-")]), "some must fall below 0.5"
    rows = sft_rows(kept)
    calls = {call.call_id: call for rollout in kept for call in rollout.llm_calls}
    assert len(rows) == len({(tuple(c.prompt_token_ids), tuple(c.completion_token_ids)) for c in calls.values()})
    for row in rows:
        call = calls[row["call_id"]]
        assert call.token_source == "server"
        assert row["input_ids"] == call.prompt_token_ids + call.completion_token_ids
        assert row["completion_mask"] == [0] * len(call.prompt_token_ids) + [1] * len(call.completion_token_ids)
        assert row["messages"][:-1] == call.input and row["messages"][-1]["role"] == "assistant"


def test_nothing_passing_is_a_clear_error(run_dir: Path) -> None:
    with pytest.raises(NoSFTRowsError, match=r"no rollout of the \d+ read has reward >= 5.0 .*held-out"):
        select_rollouts(read_rollouts(run_dir), min_reward=5.0)
    with pytest.raises(FileNotFoundError, match="no store.db"):
        read_rollouts(run_dir / "missing")


@agl.rollout
def doubling_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call; right when the reply names twice the task's number."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": f"What is {task['n']} + {task['n']}?"}]
    )
    return 1.0 if str(2 * task["n"]) in (reply.choices[0].message.content or "") else 0.0


def _doubling_reply(request) -> str:
    number = int(request.messages[-1]["content"].split()[2])
    return f"The answer is {2 * number if number % 3 else number}."  # wrong for multiples of 3


def _completion_nll(model, rows: list[dict]) -> float:
    """Mean negative log-likelihood of the rows' completion tokens under ``model``."""
    total = count = 0.0
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            logits = model(ids).logits[0, :-1]
            mask = torch.tensor(row["completion_mask"][1:], dtype=torch.bool)
            total += torch.nn.functional.cross_entropy(logits[mask], ids[0, 1:][mask], reduction="sum").item()
            count += int(mask.sum())
    return total / count


def test_sft_lowers_the_loss_and_agl_train_starts_from_the_merged_model(tiny_dir: Path, tmp_path: Path) -> None:
    with MockLLMServer(handler=_doubling_reply, token_ids=True) as server:
        rollouts = agl.run(doubling_agent, [{"id": f"n{n}", "n": n} for n in range(1, 19)], llm=server.llm())
    result = sft(rollouts, str(tiny_dir), output_dir=tmp_path / "sft", epochs=5, learning_rate=5e-2, batch_size=4)
    assert result.rollouts == 12 and result.rows == 12  # the six wrong answers are left out
    assert sum(result.losses[-2:]) < sum(result.losses[:2]) - 0.2, result.losses
    rows = [json.loads(line) for line in result.rows_path.read_text().splitlines()]
    assert all("answer is" in row["messages"][-1]["content"] for row in rows)
    config = json.loads((result.adapter_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_dir)

    base, _ = load_model(str(tiny_dir))
    merged, _ = load_model(str(result.model_dir))
    from_adapter, _ = load_model(str(result.adapter_dir))  # an adapter directory loads merged into its base
    assert _completion_nll(merged, rows) < _completion_nll(base, rows) - 0.2
    for name, value in merged.state_dict().items():
        assert torch.allclose(value, from_adapter.state_dict()[name], atol=1e-6)

    follow = agl.train(
        echo_length_agent,
        [{"id": "t0", "question": "What is 0 + 0?"}],
        model=str(result.model_dir),
        lora=True,
        group_size=2,
        tasks_per_step=1,
        max_steps=1,
        micro_batch_size=2,
        max_completion_length=8,
        output_dir=tmp_path / "grpo",
        nworkers=1,
        progress=False,
        val_every=0,
    )
    adapter = json.loads((follow.model_path / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(result.model_dir), "the GRPO adapter sits on the SFT weights"


def test_agl_sft_command_from_a_rollouts_file(tmp_path: Path, tiny_dir: Path, capsys: pytest.CaptureFixture) -> None:
    tasks = [{"id": f"q{i}", "question": "Say hi"} for i in range(3)]
    with MockLLMServer(handler=lambda request: "ok", token_ids=True) as server:
        rollouts = agl.run(echo_length_agent, tasks, llm=server.llm())
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(r.model_dump_json() + "\n" for r in rollouts))
    code = agl_main(
        ["sft", "--from", str(path), "--min-reward", "0", "--model", str(tiny_dir), "--output-dir", str(tmp_path / "o")]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "SFT on 1 rows from 3 rollouts" in out, out  # the three identical calls make one row
    assert (tmp_path / "o" / "model" / "config.json").is_file()
    assert agl_main(["sft", "--from", str(path), "--min-reward", "9", "--model", str(tiny_dir)]) == 2
    assert "no rollout of the 3 read has reward >= 9.0 (3 reward below threshold)" in capsys.readouterr().err
