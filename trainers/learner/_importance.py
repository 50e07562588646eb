"""Importance-sampling weights between the trained policy and the weights that sampled a batch.

The same four modes as TRL's ``vllm_importance_sampling_mode`` (``token_truncate``, ``token_mask``,
``sequence_truncate``, ``sequence_mask``) with bounds ``[clip_min, clip_max]``: truncation clamps the ratio into
the bounds (truncated IS), masking sets a ratio outside them to 0 (masked IS: those tokens do not train). Used for
a separate sampler (vLLM) and for rollouts sampled by older weights (``agl.train(max_staleness=K)``).
"""

from __future__ import annotations

import torch


def importance_weights(
    trained: torch.Tensor,
    sampled: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``pi_trained / pi_sampler`` from per-token log-probabilities ``[B, C]`` (``mask`` 1 = real token), per token
    (``[B, C]``) or per sequence (``[B, 1]``, the product over the sequence's tokens), truncated or masked.

    The statistics are over real tokens (a sequence ratio counts once per token): the ratio's mean/min/max before
    truncation or masking, and how many tokens were truncated or masked."""
    if mode not in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        raise ValueError(f"importance sampling mode {mode!r}: use token_/sequence_ + truncate/mask")
    difference = torch.nan_to_num((trained - sampled) * mask, nan=0.0)
    if mode.startswith("sequence"):
        difference = difference.sum(dim=-1, keepdim=True)
    ratio = torch.exp(difference)
    outside = torch.zeros_like(ratio, dtype=torch.bool)
    if clip_min is not None:
        outside |= ratio < clip_min
    if clip_max is not None:
        outside |= ratio > clip_max
    real = mask.bool()
    raw = ratio.expand_as(mask)[real]
    changed = int(outside.expand_as(mask)[real].sum())
    stats = {
        "sampling/raw_ratio/mean": float(raw.mean()) if raw.numel() else 1.0,
        "sampling/raw_ratio/min": float(raw.min()) if raw.numel() else 1.0,
        "sampling/raw_ratio/max": float(raw.max()) if raw.numel() else 1.0,
        "sampling/truncated_tokens": float(changed if mode.endswith("truncate") else 0),
        "sampling/masked_tokens": float(changed if mode.endswith("mask") else 0),
    }
    if mode.endswith("truncate"):
        return (ratio if clip_min is None and clip_max is None else torch.clamp(ratio, clip_min, clip_max)), stats
    return ratio.masked_fill(outside, 0.0), stats
