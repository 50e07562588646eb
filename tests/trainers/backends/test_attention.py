"""Grouped-query attention on CPU with each key/value head read in place (``trainers/backends/hf/attention.py``)."""

from __future__ import annotations

import torch
from agentlightning.trainers.backends.hf.attention import NAME, use_shared_kv_attention
from agentlightning.trainers.backends.hf.generation import GenerationEngine
from agentlightning.trainers.models import tiny_model


def _padded_logits(model) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of a left-padded batch, then of one decode step on its KV cache (the rollouts' two kinds of forward)."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 7, 8, 9, 11]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        step = model(
            input_ids=torch.tensor([[12], [13]]),
            attention_mask=torch.cat([mask, torch.ones(2, 1)], 1).long(),
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    return out.logits, step.logits


def test_shared_kv_heads_give_the_logits_of_transformers_sdpa_on_padded_batches_and_decode_steps():
    model, _ = tiny_model(seed=4)  # 4 query heads share 2 key/value heads
    model.eval()
    assert model.config._attn_implementation == "sdpa"
    stock = _padded_logits(model)
    assert use_shared_kv_attention(model) and model.config._attn_implementation == NAME
    shared = _padded_logits(model)
    torch.testing.assert_close(shared[0][0], stock[0][0], rtol=0, atol=1e-6)
    torch.testing.assert_close(shared[0][1, 2:], stock[0][1, 2:], rtol=0, atol=1e-6)  # the padded row's tokens
    torch.testing.assert_close(shared[1], stock[1], rtol=0, atol=1e-6)


def test_only_grouped_sdpa_models_are_switched_and_the_decoder_switches_them():
    from transformers import LlamaConfig, LlamaForCausalLM

    model, tokenizer = tiny_model(seed=4)
    GenerationEngine(model, tokenizer)
    assert model.config._attn_implementation == NAME
    config = model.config.to_dict()
    one_kv_per_head = LlamaForCausalLM(LlamaConfig(**{**config, "num_key_value_heads": 4}))
    assert not use_shared_kv_attention(one_kv_per_head)  # nothing repeated: nothing to gain
    eager = LlamaForCausalLM(LlamaConfig(**config))
    eager.set_attn_implementation("eager")
    assert not use_shared_kv_attention(eager) and eager.config._attn_implementation == "eager"
