"""Batch shaping: padding, truncation, drops, logprobs, validation."""

from __future__ import annotations

import logging
import math
import subprocess
import sys

import pytest
import torch
from rl_records import llm, rollout

from agentlightning.rl import compute_advantages, pack, transitions
from agentlightning.types import Transition


def row(rollout_id: str, prompt: list[int], completion: list[int], advantage: float = 1.0, **kw: object) -> Transition:
    fields = {"index": 0, "call_id": f"{rollout_id}-c", "group_id": "g", "reward": 0.0, "weight": 1.0}
    fields.update(kw)
    return Transition(
        rollout_id=rollout_id, prompt_token_ids=prompt, completion_token_ids=completion, advantage=advantage, **fields
    )


def test_left_padded_prompts_and_right_padded_completions() -> None:
    rows = [
        row("r0", [11, 12, 13], [21], advantage=0.5, weight=0.25, completion_logprobs=[-0.5], model_version="v1"),
        row("r1", [14], [22, 23, 24], advantage=-0.5, weight=1.0, completion_logprobs=[-0.1, -0.2, -0.3]),
    ]
    batch = pack(rows, pad_token_id=0)
    assert batch.prompt_ids.tolist() == [[11, 12, 13], [0, 0, 14]]
    assert batch.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.completion_ids.tolist() == [[21, 0, 0], [22, 23, 24]]
    assert batch.completion_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert batch.advantages.tolist() == [0.5, -0.5]
    assert batch.weights.tolist() == [0.25, 1.0]
    assert batch.old_logprobs is not None
    assert torch.allclose(batch.old_logprobs, torch.tensor([[-0.5, 0, 0], [-0.1, -0.2, -0.3]]))
    assert (batch.prompt_ids.dtype, batch.prompt_mask.dtype, batch.completion_mask.dtype) == (torch.int64,) * 3
    assert (batch.advantages.dtype, batch.weights.dtype, batch.old_logprobs.dtype) == (torch.float32,) * 3
    assert (len(batch), batch.rollout_ids, batch.call_ids, batch.group_ids) == (
        2,
        ["r0", "r1"],
        ["r0-c", "r1-c"],
        ["g", "g"],
    )
    assert batch.model_versions == ["v1", None]
    assert (batch.stats.rows, batch.stats.prompt_tokens, batch.stats.completion_tokens) == (2, 4, 4)
    assert batch.to("cpu").completion_ids.tolist() == batch.completion_ids.tolist()


def test_old_logprobs_only_when_every_row_has_them() -> None:
    batch = pack([row("r0", [1], [2], completion_logprobs=[-1.0]), row("r1", [1], [2])], pad_token_id=0)
    assert batch.old_logprobs is None
    assert batch.stats.rows_with_logprobs == 1


def test_truncation_keeps_the_prompt_end_and_the_completion_start() -> None:
    rows = [
        row("r0", [1, 2, 3, 4, 5], [6, 7, 8, 9], completion_logprobs=[-0.6, -0.7, -0.8, -0.9]),
        row("r1", [1, 2], [6], completion_logprobs=[-0.6]),
    ]
    batch = pack(rows, pad_token_id=-1, max_prompt_length=3, max_completion_length=2)
    assert batch.prompt_ids.tolist() == [[3, 4, 5], [-1, 1, 2]]
    assert batch.completion_ids.tolist() == [[6, 7], [6, -1]]
    assert torch.allclose(batch.old_logprobs, torch.tensor([[-0.6, -0.7], [-0.6, 0.0]]))  # type: ignore[arg-type]
    assert (batch.stats.prompts_truncated, batch.stats.completions_truncated, batch.stats.dropped_overlong) == (1, 1, 0)
    assert rows[0].prompt_token_ids == [1, 2, 3, 4, 5]  # the input is not modified


def test_overlong_rows_can_be_dropped() -> None:
    rows = [row("r0", [1, 2, 3], [4]), row("r1", [1], [4, 5, 6]), row("r2", [1], [4])]
    batch = pack(rows, pad_token_id=0, max_prompt_length=2, max_completion_length=2, overlong="drop")
    assert batch.rollout_ids == ["r2"]
    assert batch.prompt_ids.tolist() == [[1]]
    assert (batch.stats.dropped_overlong, batch.stats.prompts_truncated, batch.stats.rows) == (2, 0, 1)


def test_zero_variance_groups_kept_or_dropped() -> None:
    rows = [
        row("a0", [1], [2], group_id="a", reward=1.0, advantage=0.0),
        row("a1", [1], [2], group_id="a", reward=1.0, advantage=0.0),
        row("b0", [1], [2], group_id="b", reward=1.0, advantage=0.7),
        row("b1", [1], [2], group_id="b", reward=0.0, advantage=-0.7),
        row("c0", [1], [2], group_id=None, reward=0.5, advantage=0.0),  # alone: its own (flat) group
    ]
    kept = pack(rows, pad_token_id=0)
    assert (len(kept), kept.stats.zero_variance_groups, kept.stats.dropped_zero_variance_rows) == (5, 2, 0)
    dropped = pack(rows, pad_token_id=0, drop_zero_variance_groups=True)
    assert dropped.rollout_ids == ["b0", "b1"]
    assert (dropped.stats.dropped_zero_variance_groups, dropped.stats.dropped_zero_variance_rows) == (2, 3)


def test_everything_dropped_gives_an_empty_batch_and_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        batch = pack([row("r0", [1], [2], reward=1.0)], pad_token_id=0, drop_zero_variance_groups=True)
    assert len(batch) == 0
    assert batch.completion_ids.shape == (0, 0)
    assert "every one of the 1 transitions was dropped" in caplog.text


def test_empty_completions_are_dropped() -> None:
    batch = pack([row("r0", [1], []), row("r1", [1], [2])], pad_token_id=0)
    assert (batch.rollout_ids, batch.stats.dropped_empty_completion) == (["r1"], 1)


def test_validation_names_the_row() -> None:
    with pytest.raises(ValueError, match="got no transitions"):
        pack([], pad_token_id=0)
    with pytest.raises(ValueError, match="transition 0 \\(call 'r0-c'\\) of rollout 'r0' has no advantage; run"):
        pack([row("r0", [1], [2], advantage=None)], pad_token_id=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rollout 'r1' has advantage nan"):
        pack([row("r0", [1], [2]), row("r1", [1], [2], advantage=math.nan)], pad_token_id=0)
    with pytest.raises(ValueError, match="rollout 'r0' has advantage 1.0 and weight inf"):
        pack([row("r0", [1], [2], weight=math.inf)], pad_token_id=0)
    with pytest.raises(ValueError, match="has 1 logprobs for 2 completion tokens"):
        pack([row("r0", [1], [2, 3], completion_logprobs=[-1.0])], pad_token_id=0)
    with pytest.raises(ValueError, match="pad_token_id"):
        pack([row("r0", [1], [2])], pad_token_id=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_prompt_length"):
        pack([row("r0", [1], [2])], pad_token_id=0, max_prompt_length=0)
    with pytest.raises(ValueError, match="overlong"):
        pack([row("r0", [1], [2])], pad_token_id=0, overlong="cut")  # type: ignore[arg-type]


def test_end_to_end_from_rollouts() -> None:
    rollouts = [
        rollout("r0", 1.0, [llm("a", prompt=[1, 2], completion=[3]), llm("b", prompt=[1, 2, 3, 4], completion=[5, 6])]),
        rollout("r1", 0.0, [llm("c", prompt=[1], completion=[7, 8, 9])]),
    ]
    batch = pack(compute_advantages(transitions(rollouts)), pad_token_id=0)
    assert batch.prompt_ids.tolist() == [[0, 0, 1, 2], [1, 2, 3, 4], [0, 0, 0, 1]]
    assert batch.completion_ids.tolist() == [[3, 0, 0], [5, 6, 0], [7, 8, 9]]
    assert batch.weights.tolist() == [0.5, 0.5, 1.0]
    assert batch.advantages.tolist() == pytest.approx([math.sqrt(0.5)] * 2 + [-math.sqrt(0.5)], abs=1e-5)
    assert float((batch.weights * batch.advantages).sum()) == pytest.approx(0.0, abs=1e-6)


def test_importing_rl_does_not_import_torch_or_numpy() -> None:
    code = (
        "import sys, agentlightning as agl, agentlightning.rl; agl.transitions; "
        "print('torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
