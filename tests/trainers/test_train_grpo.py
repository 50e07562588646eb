"""LightningGRPOTrainer: TRL's loss on LightningRL batches (weights, micro-batches, sampler correction, LoRA+KL)."""

from __future__ import annotations

import pytest
import torch
from agentlightning.trainers.learner.batch import pack
from agentlightning.trainers.learner.grpo import LightningGRPOTrainer, grpo_config
from agentlightning.trainers.models import tiny_model
from transformers import TrainerCallback

from agentlightning.types import Transition


def _row(
    rollout: str,
    prompt: list[int],
    completion: list[int],
    advantage: float,
    weight: float = 1.0,
    logprobs: list[float] | None = None,
) -> Transition:
    return Transition(
        rollout_id=rollout,
        group_id="g",
        index=0,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        advantage=advantage,
        weight=weight,
        completion_logprobs=logprobs,
    )


def _trainer(tmp_path, micro: int, **overrides) -> LightningGRPOTrainer:
    model, tokenizer = tiny_model(seed=5)
    settings = {"learning_rate": 0.5, "optim": "sgd", "max_grad_norm": 0.0, **overrides}
    return LightningGRPOTrainer(
        model, grpo_config(str(tmp_path / "trl"), micro_batch_size=micro, **settings), tokenizer
    )


def _delta(trainer: LightningGRPOTrainer, batch) -> dict[str, torch.Tensor]:
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.step(batch)
    return {n: p.detach() - before[n] for n, p in trainer.model.named_parameters()}


def test_row_weights_and_micro_batches_give_the_weighted_objective(tmp_path):
    """One row of weight 1 == the same row twice with weight 1/2 each, even split over uneven micro-batches."""
    a = _row("r1", [5, 6, 7], [8, 9, 10], advantage=1.0)
    b = _row("r2", [11, 12], [13, 14], advantage=-1.0)
    c = _row("r3", [15], [16, 17, 18, 19], advantage=0.5)
    plain = pack([a, b, c], pad_token_id=0)
    half = [
        b.model_copy(update={"weight": 0.5, "rollout_id": "r2a"}),
        b.model_copy(update={"weight": 0.5, "rollout_id": "r2b"}),
    ]
    # grpo loss = sum_b w_b * mean_tokens(loss_b) / sum_b w_b: rescale so both batches have the same total weight
    split = pack([a.model_copy(update={"weight": 1.0}), *half, c], pad_token_id=0)
    one = _delta(_trainer(tmp_path / "one", micro=8), plain)
    two = _delta(_trainer(tmp_path / "two", micro=2), split)  # micro-batches of 2 and 2 rows
    assert any(value.abs().max() > 0 for value in one.values())
    for name in one:
        assert torch.allclose(one[name], two[name], atol=1e-6), name


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_an_update_trains_in_training_mode_and_hands_the_model_back_in_its_mode(tmp_path, mode):
    """Between synchronous steps the model stays in eval mode, so decoding does not switch every module's mode."""
    trainer = _trainer(tmp_path, micro=4)
    seen: list[bool] = []
    trainer.model.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    trainer.model.train(mode == "train")
    trainer.step(pack([_row("r1", [5, 6], [7, 8], 1.0), _row("r2", [5, 6], [9, 8], -1.0)], pad_token_id=0))
    assert seen and all(seen)
    assert trainer.model.training is (mode == "train")


def test_sampler_logprobs_from_the_same_weights_give_ratio_one(tmp_path):
    trainer = _trainer(tmp_path, micro=4, temperature=0.7, vllm_importance_sampling_mode="token_truncate")
    model = trainer.model
    prompt, completion = [5, 6, 7, 8], [9, 10, 11]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1] / 0.7
    logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()
    batch = pack(
        [
            _row("r1", prompt, completion, 1.0, logprobs=logprobs),
            _row("r2", prompt, completion, -1.0, logprobs=logprobs),
        ],
        pad_token_id=0,
    )
    inputs = trainer._generate_and_score_completions(batch)
    ratio = inputs["importance_sampling_ratio"]
    assert torch.allclose(ratio * batch.completion_mask, batch.completion_mask.float(), atol=1e-3)
    shifted = pack([_row("r1", prompt, completion, 1.0, logprobs=[lp - 0.5 for lp in logprobs])], pad_token_id=0)
    assert torch.all(trainer._generate_and_score_completions(shifted)["importance_sampling_ratio"] > 1.5)
    metrics = trainer.step(batch)
    assert abs(metrics["sampling/importance_sampling_ratio/mean"] - 1.0) < 1e-3


def test_lora_with_kl_penalty_trains_only_the_adapter(tmp_path):
    from peft import LoraConfig

    model, tokenizer = tiny_model(seed=6)
    config = grpo_config(str(tmp_path / "trl"), micro_batch_size=2, learning_rate=0.05, beta=0.1)
    trainer = LightningGRPOTrainer(
        model,
        config,
        tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    batch = pack([_row("r1", [5, 6], [7, 8, 9], 1.0), _row("r2", [5, 6], [10, 11], -1.0)], pad_token_id=0)
    metrics = trainer.step(batch)
    trainer.step(batch)
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in name for name in changed)
    assert "kl" in metrics and metrics["rows"] == 2.0


def test_bad_batches_are_rejected_with_a_reason(tmp_path):
    trainer = _trainer(tmp_path, micro=2)
    empty = pack([_row("r1", [5], [], 1.0)], pad_token_id=0)
    with pytest.raises(ValueError, match="no rows"):
        trainer.step(empty)
    batch = pack([_row("r1", [5], [6], 1.0)], pad_token_id=0)
    batch.advantages[0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        trainer.step(batch)


def test_shared_prompt_prefix_runs_once_with_the_same_logprobs_and_gradients(tmp_path):
    """Rows sharing a long prompt prefix (left-padded prompts of different lengths, right-padded completions):
    the prefix-sharing forward gives TRL's per-token log-probabilities, entropies and LoRA gradients."""
    from agentlightning.trainers.learner.grpo import _shared_prompt_prefix
    from peft import LoraConfig
    from trl import GRPOTrainer

    model, tokenizer = tiny_model(seed=7)
    config = grpo_config(str(tmp_path / "trl"), micro_batch_size=4, learning_rate=0.05, temperature=0.7)
    trainer = LightningGRPOTrainer(
        model,
        config,
        tokenizer,
        peft_config=LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "v_proj", "up_proj"],
            task_type="CAUSAL_LM",
            init_lora_weights=False,
        ),
    )
    prefix = [(7 * i) % 300 + 5 for i in range(40)]
    rows = [
        _row(f"r{i}", prefix + suffix, completion, 1.0)
        for i, (suffix, completion) in enumerate(
            [([11, 12], [13, 14, 15]), ([21, 22, 23, 24], [25]), ([31], [32, 33, 34, 35]), ([41, 42, 43], [44, 45])]
        )
    ]
    batch = pack(rows, pad_token_id=0)
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
    mask = torch.cat([batch.prompt_mask, batch.completion_mask], 1)
    keep = batch.completion_ids.size(1)
    assert _shared_prompt_prefix(ids, mask, ids.size(1) - keep) == 40
    trainer.model.train()
    results = []
    for method in (
        LightningGRPOTrainer._get_per_token_logps_and_entropies,
        GRPOTrainer._get_per_token_logps_and_entropies,
    ):
        trainer.model.zero_grad()
        logps, entropies, _ = method(trainer, trainer.model, ids, mask, keep, compute_entropy=True)
        ((logps * batch.completion_mask).sum() + (entropies * batch.completion_mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        results.append((logps * batch.completion_mask, entropies * batch.completion_mask, grads))
    (shared_logps, shared_entropy, shared_grads), (plain_logps, plain_entropy, plain_grads) = results
    assert torch.allclose(shared_logps, plain_logps, atol=1e-5)
    assert torch.allclose(shared_entropy, plain_entropy, atol=1e-5)
    assert shared_grads.keys() == plain_grads.keys() and shared_grads
    for name, grad in plain_grads.items():
        assert torch.allclose(shared_grads[name], grad, atol=1e-5), name


class _Logs(TrainerCallback):
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.rows.append(dict(logs or {}))


def test_each_update_is_logged_through_trl_to_the_callbacks(tmp_path):
    """An update's metrics go through TRL's ``log`` as ``Trainer.train()``'s steps do: a ``TrainerCallback`` sees
    each update's row (TRL's loss statistics with ours), and each row holds that update's figures only."""
    model, tokenizer = tiny_model(seed=5)
    logs = _Logs()
    config = grpo_config(str(tmp_path / "trl"), micro_batch_size=2, learning_rate=0.5, optim="sgd", max_grad_norm=0.0)
    trainer = LightningGRPOTrainer(model, config, tokenizer, callbacks=[logs])
    batch = pack([_row("r1", [5, 6], [7, 8], 1.0), _row("r2", [5, 6], [9, 8], -1.0)], pad_token_id=0)
    first = trainer.step(batch)
    second = trainer.step(batch)
    assert {"loss", "entropy", "clip_ratio/region_mean", "rows", "update_seconds"} <= set(first), sorted(first)
    assert set(second) == set(first)
    assert [row["rows"] for row in logs.rows] == [2.0, 2.0]
    assert [row["loss"] for row in logs.rows] == [first["loss"], second["loss"]]
    assert logs.rows[1]["entropy"] == pytest.approx(second["entropy"])
    assert second["entropy"] != pytest.approx(first["entropy"], abs=1e-9)  # its own update's, not a running mean
    assert [row["step"] for row in trainer.state.log_history] == [1, 2]
