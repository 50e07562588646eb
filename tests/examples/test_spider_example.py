"""The Spider example end to end on CPU: LangChain agent -> mock model -> capture with roles -> reward ->
GRPO transitions of the trainable roles only; plus the data split and the eval script."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import agentlightning as agl
from agentlightning.testing import MockLLMServer
from examples.common import mock_dry_run
from examples.spider import eval as spider_eval
from examples.spider.data import load_questions, split_by_database
from examples.spider.mock import BROKEN_SQL, mock_handler
from examples.spider.sql_agent import extract_sql, sql_agent


@pytest.fixture(scope="module")
def tasks(data_dir: Path) -> list[dict]:
    return load_questions(data_dir)


def test_usable_questions_and_split_by_database(tasks: list[dict]) -> None:
    assert len(tasks) == 972
    assert "wta_1" not in {task["db_id"] for task in tasks}
    train, validation = split_by_database(tasks)
    assert len(train) + len(validation) == 972
    assert {t["db_id"] for t in train}.isdisjoint({t["db_id"] for t in validation})
    assert 0.2 <= len(validation) / 972 <= 0.3
    again = split_by_database(list(reversed(tasks)))
    assert {t["task_id"] for t in again[1]} == {t["task_id"] for t in validation}  # deterministic
    with pytest.raises(ValueError, match="validation_fraction must be in"):
        split_by_database(tasks, 1.5)


def test_extract_sql_from_replies() -> None:
    assert extract_sql("```sql\nSELECT 1;\n```") == "SELECT 1"
    assert extract_sql("First ```sql\nSELECT 1\n``` then ```SQL\nSELECT 2\n```") == "SELECT 2"
    assert extract_sql("SELECT name FROM t;") == "SELECT name FROM t"


def test_dry_run_roles_rewards_and_transitions(tasks: list[dict]) -> None:
    chosen = [tasks[2], tasks[300]]  # two different databases
    result = mock_dry_run(sql_agent, chosen, mock_handler(chosen), group_size=3)
    assert len(result.rollouts) == 6 and all(r.status == "succeeded" for r in result.rollouts)
    by_task: dict[str, list] = {}
    for rollout in result.rollouts:
        by_task.setdefault(rollout.task_id, []).append(rollout)
        roles = [call.role for call in rollout.calls]
        assert roles[0] == "writer" and roles[1] == "checker"
        assert set(roles) <= {"writer", "checker", "rewriter"} and all(c.kind == "llm" for c in rollout.calls)
        gold = rollout.task["gold_sql"]
        if rollout.output["sql"] == gold:
            assert rollout.final_reward == 1.0 and rollout.output["error"] is None
        else:  # the mock's malformed rewrite: reward 0 with the SQLite error recorded
            assert rollout.output["sql"] == BROKEN_SQL
            assert rollout.final_reward == 0.0 and "syntax error" in rollout.output["error"]
            assert roles == ["writer", "checker", "rewriter", "checker", "rewriter", "checker", "rewriter"]
    for group in by_task.values():  # each question got each mock outcome once: right, fixed, broken
        assert sorted(r.final_reward for r in group) == [0.0, 1.0, 1.0]
        assert sorted(len(r.calls) for r in group) == [2, 4, 7]
    # transitions: every writer/rewriter call, no checker call, token ids from the server's response
    expected = sum(1 for r in result.rollouts for c in r.calls if c.role in ("writer", "rewriter"))
    assert len(result.transitions) == expected == 2 * (1 + 2 + 4)
    assert Counter(result.roles()) == {"writer": 6, "rewriter": 8}
    for transition in result.transitions:
        assert transition.prompt_token_ids and transition.completion_token_ids
        assert transition.token_source == "response"
        assert transition.advantage is not None
    rollout = next(r for r in result.rollouts if r.final_reward == 0.0)
    assert all(t.reward == 0.0 and t.advantage < 0 for t in result.transitions if t.rollout_id == rollout.rollout_id)


def test_malformed_gold_and_missing_database_fail_clearly(tasks: list[dict], tmp_path: Path) -> None:
    bad_gold = {**tasks[0], "task_id": "bad-gold", "gold_sql": "SELECT nope FROM singer"}
    no_db = {**tasks[0], "task_id": "no-db", "db_path": str(tmp_path / "wta_1.sqlite")}
    with MockLLMServer(handler=mock_handler([tasks[0]])) as server:
        rollouts = agl.run(sql_agent, [bad_gold, no_db], llm=server.llm(), n_workers=2)
    assert [r.status for r in rollouts] == ["failed", "failed"]
    assert rollouts[0].error.type == "GoldQueryError"
    assert "gold SQL 'SELECT nope FROM singer' fails" in rollouts[0].error.message
    assert "no such column: nope" in rollouts[0].error.message
    assert rollouts[0].calls  # the calls made before the error are kept
    assert rollouts[1].error.type == "DatabaseNotFoundError" and "wta_1.sqlite" in rollouts[1].error.message


def test_eval_script_scores_an_endpoint(tasks: list[dict], data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, validation = split_by_database(tasks)
    with MockLLMServer(handler=mock_handler(validation[:3])) as server:
        code = spider_eval.main(
            ["--base-url", server.base_url, "--model", "mock", "--data-dir", str(data_dir), "--limit", "3"]
        )
    assert code == 0
    line = capsys.readouterr().out.strip().splitlines()[0]
    assert line.startswith(f"spider-validation ({server.base_url}, version ")
    assert "3 rollouts of 3 tasks" in line and "(3 succeeded)" in line


def test_train_main_dry_run_prints_rollouts_and_transitions(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from examples.spider import train as spider_train

    assert spider_train.main(["--dry-run", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert "llm:writer llm:checker" in out and "transitions for training" in out
    assert " checker " not in out.split("transitions for training")[1]  # the checker is never trained
    assert out.strip().splitlines()[-1].startswith("dry run: 12 rollouts")
