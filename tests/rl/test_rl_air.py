"""Automatic intermediate rewards: each rule on hand-made rollouts, and how they combine with the return."""

from __future__ import annotations

import math
import re

import pytest
from rl_records import llm, rollout, tool

from agentlightning.rl import AIR, CallRule, FormatRule, LLMErrorRule, ToolErrorRule, discounted, transitions
from agentlightning.types import Call, Reward


def pairs(rewards: list[Reward]) -> list[tuple[str | None, float, str | None]]:
    return [(reward.call_id, reward.value, reward.name) for reward in rewards]


def test_tool_errors_penalise_the_llm_call_that_requested_them() -> None:
    ro = rollout(
        "r1",
        1.0,
        [
            llm("a"),
            tool("t1", parent="a", status="error"),
            llm("b"),
            tool("t2", parent="a", status="error", name="sql"),  # late result of a's second tool call
            tool("t3", parent="b", status="ok"),
            tool("t4", parent=None, status="error"),  # no parent recorded: the latest LLM call before it (b)
        ],
    )
    rewards = ToolErrorRule(penalty=-0.5).rewards(ro)
    assert pairs(rewards) == [("a", -0.5, "tool_error"), ("a", -0.5, "tool_error"), ("b", -0.5, "tool_error")]
    assert {reward.source for reward in rewards} == {"air"}
    assert pairs(ToolErrorRule(tools=["sq*"]).rewards(ro)) == [("a", -1.0, "tool_error")]
    assert [t.reward for t in transitions([ro], air=[ToolErrorRule(penalty=-0.5)])] == [0.0, 0.5]


def test_tool_error_before_any_llm_call_is_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    ro = rollout("r1", 1.0, [tool("t0", parent=None, status="error"), llm("a")])
    assert ToolErrorRule().rewards(ro) == []
    assert "failed tool call t0 (search) of rollout r1 has no LLM call before it" in caplog.text


def test_llm_errors_penalise_the_call_itself() -> None:
    ro = rollout("r1", 1.0, [llm("a", status="error", error="BadRequest: too long"), llm("b")])
    assert pairs(LLMErrorRule(penalty=-2.0).rewards(ro)) == [("a", -2.0, "llm_error")]
    assert [t.reward for t in transitions([ro], air=LLMErrorRule(penalty=-2.0))] == [-1.0, 1.0]


def test_format_rule_with_regex_callable_and_roles() -> None:
    calls = [
        llm("a", output={"content": "```sql\nSELECT 1\n```"}),
        llm("b", output={"content": "I think the answer is SELECT 1"}),
        llm("c", output="```sql\nSELECT 2\n```", role="critic"),
        llm("d", output={"content": None, "tool_calls": [{"id": "x"}]}),
        llm("e", output={"content": "garbage"}, status="error"),  # errored calls are left to LLMErrorRule
    ]
    ro = rollout("r1", 0.0, calls)
    sql_block = FormatRule(r"```sql\n.*\n```", failed=-1.0, passed=0.1)
    assert pairs(sql_block.rewards(ro)) == [
        ("a", 0.1, "format"),
        ("b", -1.0, "format"),
        ("c", 0.1, "format"),
        ("d", -1.0, "format"),
    ]
    writer_only = FormatRule(re.compile("^```"), roles=["writer"], name="fence")
    assert pairs(writer_only.rewards(ro)) == [("b", -1.0, "fence"), ("d", -1.0, "fence")]
    short = FormatRule(lambda text: len(text) < 10, failed=-0.5, passed=None)
    assert pairs(short.rewards(ro)) == [("a", -0.5, "format"), ("b", -0.5, "format"), ("c", -0.5, "format")]
    with pytest.raises(ValueError, match="invalid regex '\\('"):
        FormatRule("(")
    with pytest.raises(ValueError, match="check must be a regex or a function"):
        FormatRule(42)  # type: ignore[arg-type]


def test_user_functions_on_llm_and_tool_calls() -> None:
    def long_completion(call: Call) -> float | None:
        return -0.1 if len(call.completion_token_ids or []) > 2 else None

    def slow_tool(call: Call) -> float | None:
        return -0.2 if call.name == "slow" else None

    ro = rollout("r1", 1.0, [llm("a", completion=[1, 2, 3]), tool("t", "a", name="slow"), llm("b")])
    assert pairs(CallRule(long_completion).rewards(ro)) == [("a", -0.1, "long_completion")]
    assert pairs(CallRule(slow_tool, kind="tool", name="slow").rewards(ro)) == [("a", -0.2, "slow")]
    air = AIR([long_completion, CallRule(slow_tool, kind="tool")])
    assert pairs(air.rewards(ro)) == [("a", -0.1, "long_completion"), ("a", -0.2, "slow_tool")]
    found = transitions([ro], air=air)
    assert [t.reward for t in found] == pytest.approx([0.7, 1.0])
    with pytest.raises(ValueError, match="AIR rule must be"):
        AIR([3])  # type: ignore[list-item]


def test_non_finite_rule_value_names_rule_call_and_rollout() -> None:
    ro = rollout("r1", 1.0, [llm("a")])
    with pytest.raises(ValueError, match="AIR rule 'bad' on call 'a' of rollout 'r1'.*nan"):
        transitions([ro], air=CallRule(lambda call: math.nan, name="bad"))


def test_documented_combination_with_credit_and_emitted_rewards() -> None:
    """transition reward = credited return + every intermediate reward on that call (emitted, stored, AIR)."""
    ro = rollout(
        "r1",
        4.0,
        [llm("a", output={"content": "no"}), tool("t", "a", status="error"), llm("b", output={"content": "ANSWER: 4"})],
        rewards=[Reward(value=0.3, call_id="b", source="emitted")],
    )
    air = [ToolErrorRule(penalty=-1.0), FormatRule("^ANSWER:", failed=-0.5)]
    found = transitions([ro], credit=discounted(0.5), air=air)
    # a: 0.5 * 4 - 1 (tool error) - 0.5 (format); b: 4 + 0.3 (emitted)
    assert [t.reward for t in found] == pytest.approx([0.5, 4.3])
