"""The appendix example: an agent that knows nothing of Agent Lightning, trained through a Lightning Server and
``agl.Client().train`` with worker processes; the dry run goes server -> proxy -> mock model and back."""

from __future__ import annotations

import re

import pytest

import agentlightning as agl
from agentlightning.testing import MockLLMServer
from examples.common import REPO_ROOT
from examples.game import eval as game_eval
from examples.game.agent import NumberGame
from examples.game.mock import handle
from examples.game.train import agent_run, dry_run, game_reward, make_tasks


def test_agent_module_is_untouched_by_agent_lightning() -> None:
    source = (REPO_ROOT / "examples" / "game" / "agent.py").read_text()
    assert "agentlightning" not in source and "agl" not in source
    assert re.search(r"^from openai import OpenAI$", source, re.MULTILINE)


def test_tasks_are_seeded_and_valid() -> None:
    tasks = make_tasks(50, seed=3)
    assert tasks == make_tasks(50, seed=3) and tasks != make_tasks(50, seed=4)
    assert all(t["low"] <= t["secret"] <= t["high"] for t in tasks)
    assert len({t["task_id"] for t in tasks}) == 50


def test_reward_against_the_ground_truth() -> None:
    task = {"secret": 7, "low": 1, "high": 10, "max_guesses": 3}
    game = NumberGame(secret=7, low=1, high=10, max_guesses=3)
    assert game_reward(game, task) == 0.0  # no guess yet
    assert [game.judge(5), game.judge(8), game.judge(7)] == ["higher", "lower", "correct"]
    assert game_reward(game, task) == 1.0
    lost = NumberGame(secret=7, low=1, high=10, max_guesses=2)
    lost.judge(5), lost.judge(6)
    assert lost.over and game_reward(lost, task) == 0.0


def test_dry_run_through_server_and_client_workers() -> None:
    tasks = make_tasks(3, seed=0)
    rollouts = dry_run(tasks, group_size=2, nworkers=2)
    assert len(rollouts) == 6 and all(r.status == "succeeded" for r in rollouts)
    assert len({r.group_id for r in rollouts}) == 3
    for rollout in rollouts:
        llm_calls = [call for call in rollout.calls if call.kind == "llm"]
        assert llm_calls and all(call.token_source == "server" and call.prompt_token_ids for call in llm_calls)
        guesses = [int(m.group(1)) for c in llm_calls if (m := re.search(r"GUESS: (-?\d+)", c.output["content"]))]
        won = guesses[-1] == rollout.task["secret"]
        assert rollout.final_reward == (1.0 if won else 0.0)
        assert len(guesses) <= rollout.task["max_guesses"]
    assert {r.final_reward for r in rollouts} == {0.0, 1.0}  # seed 0 has both wins and losses for bisection
    assert len(agl.transitions(rollouts)) == sum(len(r.llm_calls) for r in rollouts)


def test_bad_task_fails_its_rollout_clearly() -> None:
    with MockLLMServer(handler=handle) as server:
        (rollout,) = agl.run(
            agent_run, [{"task_id": "bad", "low": 1, "high": 10, "secret": 50, "max_guesses": 3}], llm=server.llm()
        )
    assert rollout.status == "failed" and "secret 50 outside [1, 10]" in rollout.error.message


def test_eval_script(capsys: pytest.CaptureFixture[str]) -> None:
    with MockLLMServer(handler=handle) as server:
        assert game_eval.main(["--base-url", server.base_url, "--model", "m", "--games", "4"]) == 0
    first = capsys.readouterr().out.strip().splitlines()[0]
    assert first.startswith("number-game (") and "4 rollouts of 4 tasks" in first
