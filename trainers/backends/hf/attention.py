"""Attention for grouped-query models on CPU: SDPA with each key/value head shared by its group of query heads.

Transformers' ``sdpa`` attention copies every key/value head once per query head of its group (``repeat_kv``)
whenever an attention mask is passed and the device is not a GPU, which the rollouts' padded batches always pass:
each decode step then copies the whole KV cache ``num_attention_heads / num_key_value_heads`` times in every layer.
PyTorch's ``scaled_dot_product_attention(..., enable_gqa=True)`` reads the shared heads in place; the results are the
same. :func:`use_shared_kv_attention` switches a model to it through transformers' public ``AttentionInterface`` (and
``AttentionMaskInterface``: the masks are ``sdpa``'s).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

NAME = "agl_shared_kv_sdpa"


def shared_kv_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """An ``AttentionInterface`` function: transformers' ``sdpa`` with ``enable_gqa`` instead of copied heads (a
    position bias, which only encoder-decoder models pass, goes to the stock ``sdpa``)."""
    if kwargs.get("position_bias") is not None:
        return ALL_ATTENTION_FUNCTIONS["sdpa"](
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=bool(causal and attention_mask is None and query.shape[2] > 1),
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return output.transpose(1, 2).contiguous(), None


def use_shared_kv_attention(model: Any) -> bool:
    """Switch ``model`` from transformers' ``sdpa`` to :func:`shared_kv_sdpa` when its key/value heads are grouped
    and it runs on the CPU; returns whether it did. Other attention implementations (eager, flash, a user's own) are
    left as they are, and so are GPUs (where SDPA's fast kernels take no mask with ``enable_gqa``)."""
    config = getattr(model, "config", None)
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not heads or not kv_heads or heads == kv_heads:
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    AttentionInterface.register(NAME, shared_kv_sdpa)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.set_attn_implementation(NAME)
    return True
