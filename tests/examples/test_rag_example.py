"""The RAG example end to end on CPU: Agents SDK agent -> mock model -> BM25 tool -> capture with the agent's
name as role -> 0.9 x F1 + 0.1 x format reward -> GRPO transitions; plus the data and the eval script."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentlightning as agl
from agentlightning.testing import MockLLMServer
from examples.common import mock_dry_run
from examples.rag import eval as rag_eval
from examples.rag.data import load_tasks
from examples.rag.mock import mock_handler
from examples.rag.rag_agent import AGENT_NAME, rag_agent


def test_splits(data_dir: Path) -> None:
    train, test = load_tasks(data_dir, "train"), load_tasks(data_dir, "test")
    assert len(train) == 200 and len(test) == 100
    assert {t["source"] for t in train} == {"musique", "hotpotqa"}
    assert not {t["task_id"] for t in train} & {t["task_id"] for t in test}
    with pytest.raises(ValueError, match="split must be one of"):
        load_tasks(data_dir, "dev")


def test_dry_run_roles_tools_rewards(data_dir: Path) -> None:
    tasks = [{**task, "data_dir": str(data_dir)} for task in load_tasks(data_dir, "test")[:2]]
    result = mock_dry_run(rag_agent, tasks, mock_handler(tasks), group_size=3)
    assert all(r.status == "succeeded" for r in result.rollouts)
    for rollout in result.rollouts:
        assert [(c.kind, c.role) for c in rollout.calls] == [
            ("llm", AGENT_NAME),
            ("tool", AGENT_NAME),
            ("llm", AGENT_NAME),
        ]
        tool = rollout.calls[1]
        assert tool.name == "retrieve" and tool.status == "ok"
        assert tool.parent_call_id == rollout.calls[0].call_id
        assert "[1] " in str(tool.output)  # BM25 returned ranked paragraphs
        reply, answer = rollout.output["reply"], rollout.task["answer"]
        if f"<answer>{answer}</answer>" in reply:
            assert rollout.final_reward == 1.0
        elif "<answer>" in reply:
            assert rollout.final_reward == pytest.approx(0.1)
        else:
            assert rollout.final_reward == 0.0 and rollout.output["format_ok"] is False
    for task in tasks:
        rewards = sorted(r.final_reward for r in result.rollouts if r.task_id == task["task_id"])
        assert rewards == pytest.approx([0.0, 0.1, 1.0])
    assert len(result.transitions) == 12 and set(result.roles()) == {AGENT_NAME}
    assert all(t.prompt_token_ids and t.completion_token_ids for t in result.transitions)
    best = [t for t in result.transitions if t.reward == 1.0]
    assert len(best) == 4 and all(t.advantage > 0 for t in best)


def test_unusable_gold_answer_fails_the_rollout_clearly(data_dir: Path) -> None:
    task = {**load_tasks(data_dir, "test")[0], "answer": "  ", "data_dir": str(data_dir)}
    with MockLLMServer(handler=mock_handler([task])) as server:
        (rollout,) = agl.run(rag_agent, [task], llm=server.llm())
    assert rollout.status == "failed" and rollout.error.type == "GoldAnswerError"
    assert "gold answer must be a non-empty string, got '  '" in rollout.error.message


def test_eval_script(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tasks = load_tasks(data_dir, "test")[:3]
    with MockLLMServer(handler=mock_handler(tasks)) as server:
        assert (
            rag_eval.main(["--base-url", server.base_url, "--model", "m", "--data-dir", str(data_dir), "--limit", "3"])
            == 0
        )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("musique-dev (") and "3 rollouts of 3 tasks" in lines[0] and "(3 succeeded)" in lines[0]
    assert lines[-1].startswith("answer F1 ")


def test_train_main_dry_run(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from examples.rag import train as rag_train

    assert rag_train.main(["--dry-run", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert "llm:rag_agent tool:rag_agent llm:rag_agent" in out
    assert out.strip().splitlines()[-1].startswith("dry run: 12 rollouts, mean reward 0.3667")  # (1 + 0.1 + 0) / 3
