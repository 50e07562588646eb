"""The planner/caller example's agent against the mock model: the planner's call and the caller's call carry their
roles, the caller sees the expression found in the plan, and the per-policy credit rewards each role for its job."""

from __future__ import annotations

import re

import agentlightning as agl
from agentlightning.testing import MockLLMServer, MockReply, MockRequest, MockToolCall
from examples.planner_caller.train import credit, plan_score, planner_caller_agent

TASKS = [
    {"id": "t0", "question": "Tom has 53 pens and gives away 8. How many pens are left?", "answer": 45},
    {"id": "t1", "question": "Ana has 20 coins and gets 7 more. How many coins does Ana have now?", "answer": 27},
]
PLANS = {"t0": "Tom has 53 - 8 = 44 pens now.", "t1": "Ana has 20 * 7 coins"}  # right (prose around it), wrong


def handler(request: MockRequest) -> MockReply:
    text = request.last_user_text
    if not request.tools:  # the planner
        task = next(task for task in TASKS if task["question"] == text)
        return MockReply(content=PLANS[task["id"]])
    plan = re.search(r"\nPlan: (.*)$", text)
    assert plan is not None, text
    return MockReply(tool_calls=[MockToolCall("calculator", {"expression": plan[1]})])


def test_roles_hand_off_and_credit_per_policy() -> None:
    assert plan_score(TASKS[0], PLANS["t0"]) == 1.0 and plan_score(TASKS[1], PLANS["t1"]) == 0.1
    assert plan_score(TASKS[1], "I do not know") == 0.0
    with MockLLMServer(handler=handler) as server:
        rollouts = agl.run(planner_caller_agent, TASKS, llm=server.llm())
        caller_inputs = [request.last_user_text for request in server.requests if request.tools]
    assert sorted(caller_inputs) == sorted(
        f"{task['question']}\nPlan: {expected}" for task, expected in zip(TASKS, ["53 - 8", "20 * 7"], strict=True)
    )
    by_task = {rollout.task["id"]: rollout for rollout in rollouts}
    assert by_task["t0"].final_reward == 1.0 and by_task["t1"].final_reward == 0.1  # right / well-formed but wrong
    for rollout in rollouts:
        assert [call.role for call in rollout.calls if call.kind == "llm"] == ["planner", "caller"]
        planner_calls = [call for call in rollout.calls if call.role == "planner"]
        caller_calls = [call for call in rollout.calls if call.role == "caller"]
        assert credit(rollout, planner_calls, "planner") == [plan_score(rollout.task, PLANS[rollout.task["id"]])]
        assert credit(rollout, caller_calls, "caller") == [rollout.final_reward]
