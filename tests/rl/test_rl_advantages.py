"""Advantage estimators and loss weights against hand-computed numbers."""

from __future__ import annotations

import logging
import math

import pytest
from rl_records import llm, rollout

from agentlightning.rl import CallRule, compute_advantages, transitions
from agentlightning.types import Transition

SQRT_HALF = math.sqrt(0.5)


def group(rewards: list[float | None], task_id: str = "t1", calls: list[int] | None = None, **kw: object):
    """Transitions of one rollout per reward, rollout i having calls[i] LLM calls (default 1)."""
    counts = calls or [1] * len(rewards)
    rollouts = [
        rollout(
            f"{task_id}-r{i}",
            reward,
            [llm(f"{task_id}-r{i}-c{j}") for j in range(count)],
            task_id=task_id,
            status="succeeded" if reward is not None else "failed",
        )
        for i, (reward, count) in enumerate(zip(rewards, counts, strict=True))
    ]
    return transitions(rollouts, **kw)  # type: ignore[arg-type]


def advantages(found: list[Transition]) -> list[float]:
    return [t.advantage for t in found]  # type: ignore[misc]


def test_grpo_by_hand() -> None:
    # mean 0.5, sample std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    found = compute_advantages(group([1.0, 0.0, 0.5]), eps=0.0)
    assert advantages(found) == pytest.approx([1.0, -1.0, 0.0])
    assert advantages(compute_advantages(group([1.0, 0.0, 0.5]), scale_std=False)) == pytest.approx([0.5, -0.5, 0.0])
    # eps is added to the std: (1 - 0.5) / (0.5 + 0.5)
    assert advantages(compute_advantages(group([1.0, 0.0, 0.5]), eps=0.5)) == pytest.approx([0.5, -0.5, 0.0])
    # population std on request: std([1, 0]) = 0.5
    assert advantages(compute_advantages(group([1.0, 0.0]), eps=0.0, std_ddof=0)) == pytest.approx([1.0, -1.0])


def test_grpo_statistics_are_per_rollout_not_per_transition() -> None:
    # r0: R=1 with 3 calls, r1: R=0 with 1 call. Per rollout: mean 0.5, std sqrt(0.5); per transition it would be 0.75.
    found = compute_advantages(group([1.0, 0.0], calls=[3, 1]), eps=0.0)
    assert advantages(found) == pytest.approx([SQRT_HALF] * 3 + [-SQRT_HALF])
    assert [t.weight for t in found] == pytest.approx([1 / 3] * 3 + [1.0])


def test_grpo_group_of_one_and_all_equal_rewards(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert advantages(compute_advantages(group([0.7]))) == [0.0]
    assert "1 of 1 groups have a single rollout" in caplog.text
    assert advantages(compute_advantages(group([0.3, 0.3, 0.3]), eps=0.0)) == [0.0, 0.0, 0.0]
    flat = group([0.3, 0.3], calls=[2, 1])
    assert advantages(compute_advantages(flat, estimator="reinforce++", eps=0.0)) == [0.0] * 3
    for estimator in ("grpo", "dr_grpo", "reinforce++", "reinforce++_baseline"):  # fsum([x] * 3) / 3 != x here
        assert advantages(compute_advantages(group([3.5316274842091024] * 3), estimator=estimator)) == [0.0] * 3


def test_grpo_failed_rollouts_without_reward() -> None:
    # The failed rollout is not part of the group by default ...
    found = compute_advantages(group([1.0, None, 0.0]), eps=0.0)
    assert [(t.rollout_id, t.advantage) for t in found] == [
        ("t1-r0", pytest.approx(SQRT_HALF)),
        ("t1-r2", pytest.approx(-SQRT_HALF)),
    ]
    # ... or counts as reward 0 with failed='include', missing_reward=0: mean 1/3, std sqrt(1/3)
    found = compute_advantages(group([1.0, None, 0.0], failed="include", missing_reward=0.0), eps=0.0)
    third = math.sqrt(1 / 3)
    assert advantages(found) == pytest.approx([(2 / 3) / third, -(1 / 3) / third, -(1 / 3) / third])


def test_groups_are_separate() -> None:
    found = compute_advantages(group([1.0, 0.0], task_id="a") + group([5.0, 5.0, 8.0], task_id="b"), eps=0.0)
    # b: mean 6, std sqrt((1 + 1 + 4) / 2) = sqrt(3)
    assert advantages(found) == pytest.approx(
        [SQRT_HALF, -SQRT_HALF, -1 / math.sqrt(3), -1 / math.sqrt(3), 2 / math.sqrt(3)]
    )


def test_grpo_with_different_rewards_inside_a_rollout() -> None:
    # r0: R=1 plus an AIR bonus of 0.5 on its first call -> rewards [1.5, 1.0]; r1: [0.0].
    bonus = CallRule(lambda call: 0.5 if call.call_id == "t1-r0-c0" else None)
    found = compute_advantages(group([1.0, 0.0], calls=[2, 1], air=bonus), eps=0.0)
    # rollout means 1.25 and 0 -> group mean 0.625; variance (((0.875**2 + 0.375**2) / 2) + 0.625**2) / 1
    std = math.sqrt((0.875**2 + 0.375**2) / 2 + 0.625**2)
    assert advantages(found) == pytest.approx([0.875 / std, 0.375 / std, -0.625 / std])
    assert sum(t.weight * t.advantage for t in found) == pytest.approx(0.0, abs=1e-12)


def test_dr_grpo_centres_without_scaling() -> None:
    assert advantages(compute_advantages(group([1.0, 0.0, 0.5]), "dr_grpo")) == pytest.approx([0.5, -0.5, 0.0])
    assert advantages(compute_advantages(group([2.0, 0.0], calls=[1, 2]), "dr_grpo")) == pytest.approx([1, -1, -1])
    with pytest.raises(ValueError, match="dr_grpo.*without std scaling"):
        compute_advantages(group([1.0, 0.0]), "dr_grpo", scale_std=True)


def test_reinforce_pp_uses_a_normalised_batch_baseline() -> None:
    found = group([1.0, 0.0], task_id="a") + group([1.0, 1.0], task_id="b")
    # batch mean 0.75; centred [0.25, -0.75, 0.25, 0.25]; sample std sqrt(0.75 / 3) = 0.5
    assert advantages(compute_advantages(found, "reinforce++", eps=0.0)) == pytest.approx([0.5, -1.5, 0.5, 0.5])
    assert advantages(compute_advantages(found, "reinforce++", scale_std=False)) == pytest.approx(
        [0.25, -0.75, 0.25, 0.25]
    )
    # a single rollout: centred on itself
    assert advantages(compute_advantages(group([3.0]), "reinforce++")) == [0.0]


def test_reinforce_pp_baseline_centres_per_group_and_scales_over_the_batch() -> None:
    found = group([1.0, 0.0], task_id="a") + group([1.0, 1.0], task_id="b")
    # group means 0.5 and 1 -> centred [0.5, -0.5, 0, 0]; std over the batch sqrt(0.5 / 3)
    std = math.sqrt(0.5 / 3)
    assert advantages(compute_advantages(found, "reinforce++_baseline", eps=0.0)) == pytest.approx(
        [0.5 / std, -0.5 / std, 0.0, 0.0]
    )


def test_weightings() -> None:
    rollouts = [
        rollout("r0", 1.0, [llm("a", completion=[1] * 3), llm("b", completion=[1])]),
        rollout("r1", 0.0, [llm("c", completion=[1] * 4)]),
    ]

    def weights(mode: str) -> list[float]:
        return [t.weight for t in compute_advantages(transitions(rollouts), weighting=mode)]  # type: ignore[arg-type]

    assert weights("rollout") == [0.5, 0.5, 1.0]
    assert weights("rollout_token") == [0.75, 0.25, 1.0]
    assert weights("token") == [3.0, 1.0, 4.0]
    assert weights("transition") == [1.0, 1.0, 1.0]


def test_ungrouped_rollouts_are_their_own_group(caplog: pytest.LogCaptureFixture) -> None:
    found = transitions([rollout("r0", 1.0, [llm("a")], task_id=None), rollout("r1", 0.0, [llm("b")], task_id=None)])
    with caplog.at_level(logging.WARNING):
        assert advantages(compute_advantages(found)) == [0.0, 0.0]
        assert advantages(compute_advantages(found, "reinforce++", eps=0.0)) == pytest.approx([SQRT_HALF, -SQRT_HALF])
    assert "2 rollouts have no group_id or task_id" in caplog.text


def test_bad_input_is_named() -> None:
    found = group([1.0, 0.0])
    found[1].reward = math.nan
    with pytest.raises(ValueError, match=r"transition 0 \(call 't1-r1-c0'\) of rollout 't1-r1' has a non-finite"):
        compute_advantages(found)
    found = group([1.0, 0.0])
    found[1].group_id = "other"
    found.append(found[1].model_copy(update={"group_id": "t1", "index": 1}))
    with pytest.raises(ValueError, match="rollout 't1-r1' has transitions in two groups"):
        compute_advantages(found)
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        compute_advantages(group([1.0]), "ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown weighting 'sample'"):
        compute_advantages(group([1.0]), weighting="sample")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps"):
        compute_advantages(group([1.0]), eps=-1.0)
    with pytest.raises(ValueError, match="std_ddof"):
        compute_advantages(group([1.0]), std_ddof=-1)
    assert compute_advantages([]) == []
