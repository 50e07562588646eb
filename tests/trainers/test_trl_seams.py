"""The TRL and accelerate behaviour that LightningGRPOTrainer relies on beyond their documented API.

``LightningGRPOTrainer.step`` runs one optimizer update per packed batch itself (the rows come from agents, not from
TRL's generation loop), so it relies on two behaviours TRL and accelerate do not document for this use. Each test
here names one and fails, with that name, when a TRL or accelerate upgrade changes it; ``trainers/learner/grpo.py``
says where each is used. (The update's metrics go through TRL's public ``log`` and the callbacks' ``on_log``:
tests/trainers/test_train_grpo.py.)
"""

from __future__ import annotations

import math

import pytest
import torch
from agentlightning.trainers.learner.batch import pack
from agentlightning.trainers.learner.grpo import LightningGRPOTrainer, grpo_config
from agentlightning.trainers.models import tiny_model

from agentlightning.types import Transition

PROMPT, COMPLETION = [5, 6, 7, 8], [9, 10, 11]


def _trainer(tmp_path, micro_batch_size: int = 4, **overrides) -> LightningGRPOTrainer:
    model, tokenizer = tiny_model(seed=5)
    settings = {"learning_rate": 0.1, "optim": "sgd", "max_grad_norm": 0.0, **overrides}
    config = grpo_config(str(tmp_path), micro_batch_size=micro_batch_size, **settings)
    return LightningGRPOTrainer(model, config, tokenizer)


def _row(advantage: float, logprobs: list[float] | None = None) -> Transition:
    return Transition(
        rollout_id=f"r{advantage}",
        group_id="g",
        index=0,
        prompt_token_ids=PROMPT,
        completion_token_ids=COMPLETION,
        advantage=advantage,
        completion_logprobs=logprobs,
    )


def _model_logprobs(trainer: LightningGRPOTrainer) -> list[float]:
    """The completion's log-probabilities under the trainer's current weights (temperature 1)."""
    with torch.no_grad():
        logits = trainer.model(torch.tensor([PROMPT + COMPLETION])).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(COMPLETION)[:, None]).squeeze(1).tolist()


def test_trl_applies_the_sampler_ratio_when_use_vllm_is_set(tmp_path):
    """``GRPOTrainer.use_vllm``: TRL multiplies the per-token loss by ``inputs["importance_sampling_ratio"]`` only
    when this flag (and ``vllm_importance_sampling_correction``) is set. ``_prepare_inputs`` sets it for batches that
    carry sampling log-probabilities from any backend, so a sampler twice as unlikely as the trained model doubles
    the loss; if TRL renamed the flag, the correction would vanish silently and this test fail."""
    options = {"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_max": 3.0}
    plain = _trainer(tmp_path / "plain", **options)
    without_sampler = plain.step(pack([_row(1.0)], pad_token_id=0))
    corrected = _trainer(tmp_path / "corrected", **options)
    halved = [value - math.log(2.0) for value in _model_logprobs(corrected)]
    with_sampler = corrected.step(pack([_row(1.0, logprobs=halved)], pad_token_id=0))
    assert with_sampler["sampling/importance_sampling_ratio/mean"] == pytest.approx(2.0, rel=1e-3)
    assert without_sampler["loss"] == pytest.approx(-1.0, rel=1e-3)  # -advantage at the sampled weights
    assert with_sampler["loss"] == pytest.approx(2.0 * without_sampler["loss"], rel=1e-3)
    assert corrected.use_vllm is False  # reset after the update: TRL's own generation paths never see it set


def test_accelerate_sync_gradients_follows_the_flag_step_sets_per_micro_batch(tmp_path):
    """``Accelerator.sync_gradients`` (its public setter, outside ``accumulate()``): ``step`` marks only the last
    micro-batch of an update as a gradient-sync boundary, which is what ``Accelerator.backward`` hands DeepSpeed's
    engine (it steps at a boundary, so ZeRO updates once per batch; tests/trainers/test_distributed.py checks the
    result equals one process) and what TRL reads during the micro-batch. accelerate documents the flag for
    ``accumulate()``, whose fixed count of micro-batches an update of any number of rows does not have."""
    trainer = _trainer(tmp_path, micro_batch_size=2)
    seen: list[bool] = []
    original = trainer.training_step

    def recording(*args, **kwargs):
        seen.append(trainer.accelerator.sync_gradients)
        return original(*args, **kwargs)

    trainer.training_step = recording  # type: ignore[method-assign]
    trainer.step(pack([_row(advantage) for advantage in (1.0, -0.5, 0.25, 0.5, -1.0)], pad_token_id=0))
    assert seen == [False, False, True]  # micro-batches of 2, 2 and 1 rows
