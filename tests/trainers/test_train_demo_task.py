"""The demo's task generator, calculator, reward and agent (against the mock OpenAI server)."""

from __future__ import annotations

import pytest

import agentlightning as agl
from agentlightning.testing import MockLLMServer, MockReply, MockToolCall
from examples.demo.__main__ import split_problems
from examples.demo.task import calculate, calculator_agent, interleave_kinds, make_problems, score, uses_problem_numbers


def test_problems_are_deterministic_and_the_held_out_split_is_disjoint():
    assert make_problems(5, seed=3) == make_problems(5, seed=3)
    train, held_out = split_problems(200, 24, seed=0)
    assert len(train) == 200 and len(held_out) == 24
    assert not {p["question"] for p in train} & {p["question"] for p in held_out}
    for problem in train[:50]:
        assert isinstance(problem["answer"], int)


def test_training_problems_cycle_through_the_kinds_so_every_step_sees_each():
    train, _ = split_problems(300, 24, seed=1)
    assert sorted(p["id"] for p in train) == sorted(p["id"] for p in interleave_kinds(train))  # a reordering
    kinds = [problem["op"] for problem in train]
    first_run_out = min(kinds.count(op) for op in "+-*") * 3
    assert all(set(kinds[start : start + 3]) == {"+", "-", "*"} for start in range(0, first_run_out, 3))
    assert interleave_kinds([]) == []


def test_calculator_is_safe_arithmetic():
    assert calculate("3 + 4 * 2") == 11
    assert calculate("6 x 7") == 42
    for bad in ("__import__('os')", "2 ** 1000", "1 / 0", "x"):
        with pytest.raises(ValueError):
            calculate(bad)


def test_reward_shaping():
    task = {"question": "Tom has 58 pens and gives away 8. How many pens are left?", "answer": 50}
    assert score(task, used_tool=True, value=50.0, well_formed=True) == 1.0
    assert score(task, used_tool=False, value=50.0, well_formed=False) == 0.3
    assert score(task, used_tool=True, value=66.0, well_formed=True) == 0.1
    assert score(task, used_tool=True, value=5.0, well_formed=False) == 0.0
    assert uses_problem_numbers("58 - 8", task["question"])
    assert not uses_problem_numbers("3 + 2", task["question"])  # the prompt's example, copied
    assert not uses_problem_numbers("58", task["question"])


@pytest.mark.parametrize(
    ("reply", "reward"),
    [
        (MockReply(tool_calls=[MockToolCall(name="calculator", arguments={"expression": "58 - 8"})]), 1.0),
        (MockReply(tool_calls=[MockToolCall(name="calculator", arguments={"expression": "58 + 8"})]), 0.1),
        (MockReply(tool_calls=[MockToolCall(name="calculator", arguments={"expression": "3 + 2"})]), 0.0),
        (MockReply(content="Tom has 50 pens left."), 0.3),
        (MockReply(content="I do not know."), 0.0),
    ],
)
def test_agent_scores_what_the_model_did(reply, reward):
    task = {"id": "t", "question": "Tom has 58 pens and gives away 8. How many pens are left?", "answer": 50}
    with MockLLMServer(replies=[reply]) as server:
        (rollout,) = agl.run(calculator_agent, [task], llm=server.llm())
        (request,) = server.requests
    assert rollout.final_reward == reward
    assert request.tools and request.tools[0]["function"]["name"] == "calculator"


def test_steps_are_printed_with_their_times_and_the_time_to_the_target(capsys):
    from examples.demo.__main__ import print_steps, time_to_accuracy

    history = [
        {"step": 0, "elapsed_seconds": 30.0, "val/accuracy": 0.2, "val/reward": 0.25},
        {"step": 1, "elapsed_seconds": 45.0, "step_seconds": 15.0, "reward": 0.4},
        {
            "step": 2,
            "elapsed_seconds": 66.0,
            "step_seconds": 15.0,
            "reward": 0.6,
            "val/accuracy": 0.875,
            "val/reward": 0.9,
            "val_seconds": 6.0,
        },
        {
            "step": 3,
            "elapsed_seconds": 87.0,
            "step_seconds": 15.0,
            "reward": 0.8,
            "val/accuracy": 0.917,
            "val/reward": 0.93,
            "val_seconds": 6.0,
        },
        {"step": 4, "elapsed_seconds": 88.0, "reward": 1.0, "skipped_update": 1},
    ]
    assert time_to_accuracy(history, 0.9) == (3, 45.0, 57.0)  # 57 s, of which 12 s held-out evaluations
    assert time_to_accuracy(history, 0.95) is None
    print_steps(history, 0.9)
    out = capsys.readouterr().out
    assert "before training: 30 s" in out and "step  3   15.0 s  elapsed    57 s" in out
    assert "held-out accuracy 0.917 (evaluated in 6 s)" in out
    assert "step 3, training wall time 0.75 min (0.95 min with the evaluations)" in out
    assert "step  4  skipped" in out
