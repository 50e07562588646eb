"""``agl.evaluate`` and its report: hand-checked intervals, a real agent against the mock server (calls per role,
tool errors, tokens, failures), the JSON file, ``compare`` and ``agl eval`` from the command line; no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest

import agentlightning as agl
from agentlightning._cli import main as agl_main
from agentlightning.evaluation import EvalReport, compare, wilson_interval
from agentlightning.evaluation._intervals import bootstrap_mean_interval, newcombe_difference
from agentlightning.testing import MockLLMServer, MockReply, MockToolCall

REPO = Path(__file__).resolve().parents[2]


def test_wilson_interval_hand_checked() -> None:
    interval = wilson_interval(8, 10)  # p = 0.8, z = 1.96: centre 0.7167, half-width 0.2266
    assert interval.value == 0.8 and round(interval.low, 4) == 0.4902 and round(interval.high, 4) == 0.9433
    none = wilson_interval(0, 162)
    assert none.low == 0.0 and 0.02 < none.high < 0.025  # z^2 / (n + z^2) = 0.0232
    assert wilson_interval(0, 0).high == 1.0
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_interval(5, 4)


def test_newcombe_difference_matches_his_worked_example() -> None:
    # Newcombe (1998), method 10, example (a): 56/70 - 48/80 = 0.2000 [0.0524, 0.3339]
    before, after = wilson_interval(48, 80), wilson_interval(56, 70)
    difference = newcombe_difference(before, 80, after, 70)
    assert round(difference.value, 4) == 0.2
    assert round(difference.low, 4) == 0.0524 and round(difference.high, 4) == 0.3339


def test_bootstrap_is_reproducible_and_brackets_the_mean() -> None:
    values = [0.0, 1.0, 0.5, 1.0, 0.0, 0.25, 1.0, 1.0]
    first, second = bootstrap_mean_interval(values), bootstrap_mean_interval(values)
    assert first == second and first.low < first.value < first.high
    assert bootstrap_mean_interval([0.3] * 5).model_dump() == {
        "value": 0.3,
        "low": 0.3,
        "high": 0.3,
        "method": "bootstrap",
    }


@agl.rollout(roles=["solver"])
def tool_agent(task: dict, llm: agl.LLM) -> float:
    """A hand-written tool loop (as the openai docs write one): ask, run the tool it asks for, ask again."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    if task.get("crash"):
        raise RuntimeError("the agent crashed")
    messages = [{"role": "user", "content": task["question"]}]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    with agl.role("solver"):
        first = client.chat.completions.create(
            model=llm.model, messages=messages, tools=tools, **llm.sampling_parameters
        )
    call = first.choices[0].message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])}]
    with agl.role("checker"):
        final = client.chat.completions.create(model=llm.model, messages=messages)
    return 1.0 if final.choices[0].message.content == str(task["answer"]) else 0.0


def _handler(request) -> MockReply:
    if request.messages[-1]["role"] == "tool":
        return MockReply(content=request.messages[-1]["content"])
    a, b = (int(word) for word in request.messages[-1]["content"].split() if word.isdigit())
    return MockReply(tool_calls=[MockToolCall(name="add", arguments={"a": a, "b": b if a != 2 else b + 1})])


TASKS = [{"id": f"t{a}", "question": f"add {a} and 3", "answer": a + 3} for a in range(1, 6)]


def test_evaluate_reports_scores_roles_tokens_and_failures(tmp_path: Path) -> None:
    tasks = [*TASKS, {"id": "boom", "question": "add 0 and 0", "answer": 0, "crash": True}]
    with MockLLMServer(handler=_handler, token_ids=True) as server:
        report = agl.evaluate(tool_agent, tasks, server.base_url, name="adds", output=tmp_path / "adds.json")
        request = server.requests[0]
    assert request.body["temperature"] == 0.0, "greedy by default, passed to the agent as llm.sampling_parameters"
    assert report.rollouts == report.tasks == 6 and report.status == {"succeeded": 5, "failed": 1}
    assert report.accuracy.value == pytest.approx(4 / 6) and report.accuracy.method == "wilson"
    assert report.reward.value == pytest.approx(4 / 6) and report.reward.low < report.reward.value
    assert report.calls_by_role == {"solver": 5, "checker": 5} and report.llm_calls == 10
    assert report.failures[0].task_id == "boom" and "RuntimeError: the agent crashed" in report.failures[0].error
    assert report.prompt_tokens > 0 and report.completion_tokens > 0
    assert report.model == server.base_url and report.agent == "tool_agent"
    saved = EvalReport.load(tmp_path / "adds.json")
    assert saved.accuracy == report.accuracy and saved.per_task == report.per_task and not saved.rollout_records
    assert "rollout_records" not in json.loads((tmp_path / "adds.json").read_text())


def test_compare_pairs_the_same_tasks_and_not_others() -> None:
    with MockLLMServer(handler=_handler, token_ids=True) as server:
        before = agl.evaluate(tool_agent, TASKS, server.base_url, name="before")
        right = lambda request: MockReply(content=str(int(request.messages[-1]["content"].split()[1]) + 3))  # noqa: E731
    with MockLLMServer(handler=right) as server:
        after = agl.evaluate(tool_agent_direct, TASKS, server.base_url, name="after")
    paired = compare(before, after)
    assert paired.paired and paired.tasks == 5 and paired.accuracy.method == "paired bootstrap"
    assert paired.accuracy.value == pytest.approx(0.2) and paired.accuracy.low <= 0.2 <= paired.accuracy.high
    other = after.model_copy(
        update={"per_task": [t.model_copy(update={"task_id": "x" + t.task_id}) for t in after.per_task]}
    )
    unpaired = compare(before, other)
    assert not unpaired.paired and unpaired.accuracy.method == "newcombe" and unpaired.reward.method == "bootstrap"
    assert "after - before (paired over 5 tasks):" in paired.summary()


@agl.rollout
def tool_agent_direct(task: dict, llm: agl.LLM) -> float:
    """One call, no tool: the reply is the answer."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    return 1.0 if reply.choices[0].message.content == str(task["answer"]) else 0.0


def test_agl_eval_command_and_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = tmp_path / "adds.jsonl"
    dataset.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    sys.path.insert(0, str(Path(__file__).parent))
    with MockLLMServer(handler=_handler, token_ids=True) as server:
        for name in ("first", "second"):
            arguments = ["eval", "test_evaluation:tool_agent", "--dataset", str(dataset), "--model", server.base_url]
            assert agl_main([*arguments, "--name", name, "--output", str(tmp_path / f"{name}.json")]) == 0
    out = capsys.readouterr().out
    assert (
        "first (http://127.0.0.1:" in out and "accuracy 0.800 [" in out and "LLM calls 10 (checker 5, solver 5)" in out
    )
    assert agl_main(["eval", "--compare", str(tmp_path / "first.json"), str(tmp_path / "second.json")]) == 0
    assert "accuracy +0.000 [+0.000, +0.000] (paired bootstrap 95%)" in capsys.readouterr().out
    assert agl_main(["eval", "--compare", str(tmp_path / "first.json"), str(dataset)]) == 2
    assert "not an evaluation report" in capsys.readouterr().err
    assert agl_main(["eval", "test_evaluation:tool_agent", "--dataset", str(dataset)]) == 2


def test_evaluating_a_url_imports_no_torch() -> None:
    code = (
        "import sys, agentlightning as agl\n"
        "from agentlightning.testing import MockLLMServer\n"
        "from test_evaluation import TASKS, _handler, tool_agent\n"
        "with MockLLMServer(handler=_handler, token_ids=True) as server:\n"
        "    report = agl.evaluate(tool_agent, TASKS, server.base_url)\n"
        "assert report.rollouts == 5\n"
        "assert 'torch' not in sys.modules, 'evaluating a URL must not import torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, check=True, timeout=120)
