"""Property-based checks (hypothesis) of the invariants LightningRL promises."""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_records import llm, rollout

from agentlightning.capture import role_matches
from agentlightning.rl import compute_advantages, extract_transitions, pack
from agentlightning.types import Transition

FAST = settings(max_examples=60, deadline=None)

rewards = st.floats(min_value=-10, max_value=10, allow_nan=False)


@st.composite
def grouped_transitions(draw: st.DrawFn) -> list[Transition]:
    """Several groups of rollouts; each rollout has 1-4 transitions with possibly different rewards."""
    rows: list[Transition] = []
    for g in range(draw(st.integers(1, 3))):
        for r in range(draw(st.integers(1, 5))):
            per_call = draw(st.lists(rewards, min_size=1, max_size=4))
            for index, value in enumerate(per_call):
                rows.append(
                    Transition(
                        rollout_id=f"g{g}-r{r}",
                        group_id=f"g{g}",
                        index=index,
                        reward=value,
                        prompt_token_ids=[1],
                        completion_token_ids=[2] * draw(st.integers(1, 5)),
                    )
                )
    return rows


def totals(rows: list[Transition], key: str, value) -> dict[str, float]:  # type: ignore[no-untyped-def]
    sums: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        sums[getattr(row, key)].append(value(row))
    return {name: math.fsum(values) for name, values in sums.items()}


@FAST
@given(grouped_transitions(), st.sampled_from(["grpo", "dr_grpo"]), st.booleans())
def test_group_advantages_sum_to_zero_at_rollout_level(rows: list[Transition], estimator: str, scale: bool) -> None:
    if estimator == "dr_grpo":
        scale = False
    compute_advantages(rows, estimator, scale_std=scale)  # type: ignore[arg-type]
    for group, total in totals(rows, "group_id", lambda row: row.weight * row.advantage).items():
        assert abs(total) <= 1e-9 * max(1.0, *(abs(row.advantage) for row in rows)), group


@FAST
@given(
    grouped_transitions(),
    st.sampled_from(["rollout", "rollout_token"]),
    st.sampled_from(["grpo", "dr_grpo", "reinforce++", "reinforce++_baseline"]),
)
def test_per_rollout_weights_give_every_rollout_the_same_total(
    rows: list[Transition], weighting: str, estimator: str
) -> None:
    compute_advantages(rows, estimator, weighting=weighting)  # type: ignore[arg-type]
    for rollout_id, total in totals(rows, "rollout_id", lambda row: row.weight).items():
        assert math.isclose(total, 1.0, rel_tol=1e-12), rollout_id


@FAST
@given(grouped_transitions())
def test_reinforce_pp_batch_advantages_sum_to_zero(rows: list[Transition]) -> None:
    compute_advantages(rows, "reinforce++")
    scale = max(1.0, *(abs(row.advantage) for row in rows))
    assert abs(math.fsum(row.weight * row.advantage for row in rows)) <= 1e-9 * scale


ROLE_NAMES = ["writer", "rewriter", "sql_writer", "sql_check", "critic", "Writer", None]
PATTERNS = ["writer", "rewriter", "sql_*", "*writer", "crit?c", "w*", "[rs]*", "Writer"]


@FAST
@given(
    st.lists(st.lists(st.sampled_from(ROLE_NAMES), max_size=6), min_size=1, max_size=4),
    st.one_of(st.none(), st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=3)),
)
def test_role_selection_never_leaks_and_never_loses(
    call_roles: list[list[str | None]], patterns: list[str] | None
) -> None:
    rollouts = [
        rollout(f"r{i}", 1.0, [llm(f"r{i}-c{j}", role=role) for j, role in enumerate(roles)])
        for i, roles in enumerate(call_roles)
    ]
    found = extract_transitions(rollouts, roles=patterns).transitions
    selected = [call.call_id for ro in rollouts for call in ro.calls if role_matches(call.role, patterns)]
    assert [t.call_id for t in found] == selected
    if patterns is not None:
        assert all(t.role is not None and role_matches(t.role, patterns) for t in found)


def naive_pack(rows: list[Transition], pad: int, max_prompt: int, max_completion: int) -> dict[str, list]:
    """Plain-Python reference: nested loops over lists."""
    prompts = [row.prompt_token_ids[-max_prompt:] for row in rows]
    completions = [row.completion_token_ids[:max_completion] for row in rows]
    width_p = max(len(p) for p in prompts)
    width_c = max(len(c) for c in completions)
    return {
        "prompt_ids": [[pad] * (width_p - len(p)) + p for p in prompts],
        "prompt_mask": [[0] * (width_p - len(p)) + [1] * len(p) for p in prompts],
        "completion_ids": [c + [pad] * (width_c - len(c)) for c in completions],
        "completion_mask": [[1] * len(c) + [0] * (width_c - len(c)) for c in completions],
    }


@FAST
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(1, 1000), min_size=0, max_size=12),
            st.lists(st.integers(1, 1000), min_size=1, max_size=12),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 14),
    st.integers(1, 14),
)
def test_vectorised_pack_equals_plain_python_padding(
    sequences: list[tuple[list[int], list[int]]], max_prompt: int, max_completion: int
) -> None:
    rows = [
        Transition(
            rollout_id=f"r{i}",
            index=0,
            prompt_token_ids=p,
            completion_token_ids=c,
            advantage=0.0,
            completion_logprobs=[-float(t) for t in c],
        )
        for i, (p, c) in enumerate(sequences)
    ]
    batch = pack(rows, pad_token_id=0, max_prompt_length=max_prompt, max_completion_length=max_completion)
    expected = naive_pack(rows, 0, max_prompt, max_completion)
    for name, value in expected.items():
        assert getattr(batch, name).tolist() == value, name
    expected_logprobs = [[-float(t) if t else 0.0 for t in ids] for ids in expected["completion_ids"]]
    assert torch.equal(batch.old_logprobs, torch.tensor(expected_logprobs))  # type: ignore[arg-type]
    lengths = [(len(p), len(c)) for p, c in sequences]
    assert batch.stats.prompts_truncated == sum(p > max_prompt for p, _ in lengths)
    assert batch.stats.completions_truncated == sum(c > max_completion for _, c in lengths)
