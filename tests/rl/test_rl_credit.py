"""Credit assignment: hand-computed returns per call for every built-in function and custom ones."""

from __future__ import annotations

import math

import pytest
from rl_records import llm, rollout

import agentlightning as agl
from agentlightning.rl.credit import assign_credit, discounted, identical, last, resolve_credit


def three_calls(reward: float | None = 4.0):
    return rollout("r1", reward, [llm("a"), llm("b"), llm("c")])


def test_identical_gives_every_call_the_final_return() -> None:
    ro = three_calls()
    assert identical(ro, ro.calls) == [4.0, 4.0, 4.0]


def test_last_gives_only_the_final_call_the_return() -> None:
    ro = three_calls()
    assert last(ro, ro.calls) == [0.0, 0.0, 4.0]
    assert last(ro, ro.calls[:1]) == [4.0]
    assert last(ro, []) == []


def test_discounted_by_distance_to_the_end() -> None:
    ro = three_calls()
    assert discounted(0.5)(ro, ro.calls) == [1.0, 2.0, 4.0]
    assert discounted(1.0)(ro, ro.calls) == identical(ro, ro.calls)
    assert discounted(0.0)(ro, ro.calls) == last(ro, ro.calls)
    assert discounted(0.5).__name__ == "discounted(0.5)"


@pytest.mark.parametrize("gamma", [1.5, -0.1, True, "0.9", math.nan])
def test_discounted_rejects_bad_gamma(gamma: object) -> None:
    with pytest.raises(ValueError, match="gamma"):
        discounted(gamma)  # type: ignore[arg-type]


def test_credit_without_final_reward_names_the_rollout() -> None:
    with pytest.raises(ValueError, match="'r1'.*no final reward"):
        identical(three_calls(None), three_calls(None).calls)


def test_resolve_names_and_callables() -> None:
    assert resolve_credit("identical") is identical
    assert resolve_credit("last") is last
    custom = lambda ro, calls: [0.0] * len(calls)  # noqa: E731
    assert resolve_credit(custom) is custom
    with pytest.raises(ValueError, match="unknown credit assignment 'first'.*identical"):
        resolve_credit("first")
    with pytest.raises(ValueError, match="credit must be"):
        resolve_credit(3)  # type: ignore[arg-type]


def test_custom_credit_is_checked() -> None:
    ro = three_calls()
    assert assign_credit(lambda r, calls: [1, 2, 3], ro, ro.calls) == [1.0, 2.0, 3.0]

    def short(r, calls):
        return [1.0]

    with pytest.raises(ValueError, match="'.*short' returned 1 values for the 3 calls of rollout 'r1'"):
        assign_credit(short, ro, ro.calls)
    with pytest.raises(ValueError, match="call 'b' of rollout 'r1' a non-finite value nan"):
        assign_credit(lambda r, calls: [1.0, math.nan, 1.0], ro, ro.calls)
    with pytest.raises(ValueError, match="non-finite value None"):
        assign_credit(lambda r, calls: [1.0, None, 1.0], ro, ro.calls)


def test_transitions_apply_the_chosen_credit() -> None:
    ro = three_calls()
    assert [t.reward for t in agl.transitions([ro])] == [4.0, 4.0, 4.0]
    assert [t.reward for t in agl.transitions([ro], credit="last")] == [0.0, 0.0, 4.0]
    assert [t.reward for t in agl.transitions([ro], credit=discounted(0.5))] == [1.0, 2.0, 4.0]
    # A custom function sees only the calls that become transitions (here: role 'writer').
    mixed = rollout("r2", 1.0, [llm("a"), llm("x", role="critic"), llm("b")])
    seen: list[list[str]] = []

    def by_position(r, calls):
        seen.append([call.call_id for call in calls])
        return [float(call.sequence) for call in calls]

    assert [t.reward for t in agl.transitions([mixed], roles=["writer"], credit=by_position)] == [0.0, 2.0]
    assert seen == [["a", "b"]]
