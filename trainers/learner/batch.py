"""Batch shaping: transitions with advantages -> padded tensors for the trainer (:func:`pack`).

Dropped: empty completions, zero-variance groups on request, over-long rows with ``overlong='drop'``; over-long rows
are truncated otherwise (prompts from the left, completions from the right). Prompts are left-padded, completions
right-padded; ids and masks are int64, floats float32 (shapes in docs/lightning_rl.md, "Padded batches"). Weights are
kept as computed. torch and numpy are imported only when :func:`pack` runs (the ``[train]`` extra).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from agentlightning.rl.advantages import group_key
from agentlightning.types import Transition

if TYPE_CHECKING:
    import numpy as np
    import torch

logger = logging.getLogger(__name__)

Overlong = Literal["truncate", "drop"]


@dataclass
class PackStats:
    """What :func:`pack` kept, cut and dropped."""

    transitions_in: int = 0
    rows: int = 0
    prompts_truncated: int = 0
    completions_truncated: int = 0
    dropped_overlong: int = 0
    dropped_empty_completion: int = 0
    zero_variance_groups: int = 0  # groups whose transitions all have the same reward (found, dropped or not)
    dropped_zero_variance_groups: int = 0
    dropped_zero_variance_rows: int = 0
    rows_with_logprobs: int = 0
    prompt_tokens: int = 0  # real (unpadded) tokens in the batch
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict (for metrics logging)."""
        return asdict(self)


@dataclass
class PackedBatch:
    """Padded tensors for one training step, with the ids of the rows' origins."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    old_logprobs: torch.Tensor | None
    stats: PackStats
    rollout_ids: list[str]
    call_ids: list[str | None]
    group_ids: list[str | None]
    model_versions: list[str | None]

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    def to(self, device: Any) -> PackedBatch:
        """A copy with every tensor on ``device``."""
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        return replace(self, **{name: value.to(device) for name, value in values.items() if hasattr(value, "to")})


def pack(
    transitions: Sequence[Transition],
    pad_token_id: int,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    overlong: Overlong = "truncate",
    drop_zero_variance_groups: bool = False,
) -> PackedBatch:
    """Pad ``transitions`` (advantages already computed) into a :class:`PackedBatch`.

    ``drop_zero_variance_groups``: drop groups whose transitions all have the same reward (no learning signal
    under group-relative estimators). Over-long rows are truncated or, with ``overlong='drop'``, dropped.
    Counts of everything cut or dropped are in ``batch.stats``.
    """
    import numpy as np
    import torch

    _check_arguments(transitions, pad_token_id, max_prompt_length, max_completion_length, overlong)
    rows = list(transitions)
    advantages, weights = _checked_floats(rows)
    stats = PackStats(transitions_in=len(rows))
    prompt_lengths = np.fromiter(map(len, (row.prompt_token_ids for row in rows)), np.int64, len(rows))
    completion_lengths = np.fromiter(map(len, (row.completion_token_ids for row in rows)), np.int64, len(rows))

    keep = completion_lengths > 0
    stats.dropped_empty_completion = int((~keep).sum())
    flat_groups = _zero_variance_rows(rows, stats)
    if drop_zero_variance_groups:
        stats.dropped_zero_variance_groups = stats.zero_variance_groups
        stats.dropped_zero_variance_rows = int((flat_groups & keep).sum())
        keep &= ~flat_groups
    prompt_limit = max_prompt_length if max_prompt_length is not None else int(prompt_lengths.max(initial=0))
    completion_limit = (
        max_completion_length if max_completion_length is not None else int(completion_lengths.max(initial=0))
    )
    too_long_prompt = prompt_lengths > prompt_limit
    too_long_completion = completion_lengths > completion_limit
    if overlong == "drop":
        overlong_rows = (too_long_prompt | too_long_completion) & keep
        stats.dropped_overlong = int(overlong_rows.sum())
        keep &= ~overlong_rows
    else:
        stats.prompts_truncated = int((too_long_prompt & keep).sum())
        stats.completions_truncated = int((too_long_completion & keep).sum())

    kept = np.flatnonzero(keep)
    kept_rows = [rows[index] for index in kept.tolist()]
    prompt_kept = np.minimum(prompt_lengths[kept], prompt_limit)
    completion_kept = np.minimum(completion_lengths[kept], completion_limit)
    width_prompt = int(prompt_kept.max(initial=0))
    width_completion = int(completion_kept.max(initial=0))

    prompt_mask = np.arange(width_prompt)[None, :] >= (width_prompt - prompt_kept)[:, None]
    completion_mask = np.arange(width_completion)[None, :] < completion_kept[:, None]
    prompts = [row.prompt_token_ids for row in kept_rows]
    completions = [row.completion_token_ids for row in kept_rows]
    prompt_ids = _padded(prompts, prompt_mask, pad_token_id, np.int64, prompt_limit, from_left=True)
    completion_ids = _padded(completions, completion_mask, pad_token_id, np.int64, completion_limit)

    stats.rows_with_logprobs = sum(1 for row in kept_rows if row.completion_logprobs is not None)
    old_logprobs = None
    if kept_rows and stats.rows_with_logprobs == len(kept_rows):
        old_logprobs = torch.from_numpy(_old_logprobs(kept_rows, completion_mask, completion_limit))

    stats.rows = len(kept_rows)
    stats.prompt_tokens = int(prompt_kept.sum())
    stats.completion_tokens = int(completion_kept.sum())
    if not kept_rows:
        logger.warning("pack(): every one of the %d transitions was dropped: %s", len(rows), stats.as_dict())
    return PackedBatch(
        prompt_ids=torch.from_numpy(prompt_ids),
        prompt_mask=torch.from_numpy(prompt_mask.astype(np.int64)),
        completion_ids=torch.from_numpy(completion_ids),
        completion_mask=torch.from_numpy(completion_mask.astype(np.int64)),
        advantages=torch.from_numpy(advantages[kept].astype(np.float32)),
        weights=torch.from_numpy(weights[kept].astype(np.float32)),
        old_logprobs=old_logprobs,
        stats=stats,
        rollout_ids=[row.rollout_id for row in kept_rows],
        call_ids=[row.call_id for row in kept_rows],
        group_ids=[row.group_id for row in kept_rows],
        model_versions=[row.model_version for row in kept_rows],
    )


def _check_arguments(
    transitions: Sequence[Transition],
    pad_token_id: int,
    max_prompt_length: int | None,
    max_completion_length: int | None,
    overlong: str,
) -> None:
    if not transitions:
        raise ValueError("pack() got no transitions; check the warnings of agl.transitions() for what was skipped")
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int):
        raise ValueError(f"pack(pad_token_id=...) must be an int, got {pad_token_id!r}")
    for name, value in (("max_prompt_length", max_prompt_length), ("max_completion_length", max_completion_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"pack({name}=...) must be a positive int or None, got {value!r}")
    if overlong not in ("truncate", "drop"):
        raise ValueError(f"pack(overlong=...) must be 'truncate' or 'drop', got {overlong!r}")


def _checked_floats(rows: Sequence[Transition]) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and weights as float64 arrays; ``ValueError`` naming the first missing or non-finite one."""
    import numpy as np

    for row in rows:
        if not isinstance(row, Transition):
            raise TypeError(f"pack() expects Transition records, got {type(row).__name__}")
        advantage, weight = row.advantage, row.weight
        where = f"transition {row.index} (call {row.call_id!r}) of rollout {row.rollout_id!r}"
        if advantage is None:
            raise ValueError(f"{where} has no advantage; run agentlightning.rl.compute_advantages first")
        if not (math.isfinite(advantage) and math.isfinite(weight) and weight >= 0):
            raise ValueError(
                f"{where} has advantage {advantage!r} and weight {weight!r}; both must be finite and the weight >= 0"
            )
    advantages = np.fromiter((row.advantage for row in rows), np.float64, len(rows))
    weights = np.fromiter((row.weight for row in rows), np.float64, len(rows))
    return advantages, weights


def _zero_variance_rows(rows: Sequence[Transition], stats: PackStats) -> np.ndarray:
    """Boolean array: rows of groups whose transitions all have the same reward (counted in ``stats``)."""
    import numpy as np

    bounds: dict[str, tuple[float, float]] = {}
    keys = [group_key(row) for row in rows]
    for key, row in zip(keys, rows, strict=True):
        low, high = bounds.get(key, (row.reward, row.reward))
        bounds[key] = (min(low, row.reward), max(high, row.reward))
    flat = {key for key, (low, high) in bounds.items() if high - low <= 1e-12 * max(1.0, abs(high))}
    stats.zero_variance_groups = len(flat)
    return np.fromiter((key in flat for key in keys), bool, len(rows))


def _old_logprobs(rows: Sequence[Transition], mask: np.ndarray, limit: int) -> np.ndarray:
    """Sampling logprobs padded like the completions; ``ValueError`` naming a row whose lengths differ."""
    import numpy as np

    logprobs: list[list[float]] = []
    for row in rows:
        values = row.completion_logprobs or []
        if len(values) != len(row.completion_token_ids):
            raise ValueError(
                f"transition {row.index} (call {row.call_id!r}) of rollout {row.rollout_id!r} has "
                f"{len(values)} logprobs for {len(row.completion_token_ids)} completion tokens"
            )
        logprobs.append(values)
    return _padded(logprobs, mask, 0.0, np.float32, limit)


def _padded(
    sequences: Sequence[Sequence[float]], mask: np.ndarray, pad: float, dtype: Any, limit: int, from_left: bool = False
) -> np.ndarray:
    """Fill a ``mask``-shaped array with ``sequences`` (cut to ``limit``) where ``mask`` is set, ``pad`` elsewhere.
    The set cells of ``mask`` in row-major order are exactly the kept tokens of each row in order, so one boolean
    assignment places every token."""
    import numpy as np

    cut = [seq if len(seq) <= limit else seq[-limit:] if from_left else seq[:limit] for seq in sequences]
    flat = np.fromiter(itertools.chain.from_iterable(cut), dtype, int(mask.sum()))
    out = np.full(mask.shape, pad, dtype=dtype)
    out[mask] = flat
    return out
