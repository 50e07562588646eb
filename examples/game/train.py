"""Train the unmodified number-guessing agent of ``agent.py`` through a Lightning Server (the paper's appendix).

Nothing in ``agent.py`` knows about Agent Lightning. This file wraps it: ``agent_run`` seeds a game from the task,
lets the agent play through the rollout's endpoint, and scores the result against the secret. Then a client serves
rollouts for a running server, which owns the model and the training:

    agl server --model Qwen/Qwen2.5-0.5B-Instruct --port 4747          # on the GPU machine
    AGL_SERVER_URL=http://gpu-box:4747 python -m examples.game.train   # anywhere, CPU is enough

``--dry-run`` does the same on CPU in one process: an in-process Lightning Server whose proxy forwards to a mock
model, this client with two worker processes, and the finished rollouts printed.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openai import OpenAI

import agentlightning as agl
from examples.common import cli
from examples.game.agent import GuessingAgent, NumberGame

MIN_RANGE, MAX_RANGE = 16, 128
MAX_GUESSES = 6


def make_tasks(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` games with random ranges and secrets, the same for the same ``seed``."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        low = rng.randint(0, 50)
        high = low + rng.randint(MIN_RANGE, MAX_RANGE)
        tasks.append(
            {
                "task_id": f"game-{seed}-{index:05d}",
                "low": low,
                "high": high,
                "secret": rng.randint(low, high),
                "max_guesses": MAX_GUESSES,
            }
        )
    return tasks


def game_reward(game: NumberGame, task: dict[str, Any]) -> float:
    """1.0 when the agent named the task's secret within its guesses, else 0.0."""
    return 1.0 if game.guesses and game.guesses[-1] == task["secret"] else 0.0


@agl.rollout
def agent_run(task: dict[str, Any], llm: agl.LLM) -> float:
    """One game: the existing agent, pointed at the rollout's endpoint, against a host holding the task's secret."""
    if not task["low"] <= task["secret"] <= task["high"]:
        raise ValueError(
            f"task {task.get('task_id')!r}: secret {task['secret']} outside [{task['low']}, {task['high']}]"
        )
    game = NumberGame(secret=task["secret"], low=task["low"], high=task["high"], max_guesses=task["max_guesses"])
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=1)
    GuessingAgent(client, llm.model).play(game)
    return game_reward(game, task)


def dry_run(tasks: Sequence[dict[str, Any]], *, group_size: int = 2, nworkers: int = 2) -> list[agl.Rollout]:
    """Serve ``tasks`` through an in-process Lightning Server (proxy -> mock model) and this client."""
    from agentlightning.server import LightningServer
    from agentlightning.testing import MockLLMServer
    from examples.game.mock import handle

    with tempfile.TemporaryDirectory() as directory, MockLLMServer(handler=handle) as model:
        with LightningServer(Path(directory) / "store.db", upstream_url=model.base_url, model_name="mock") as server:
            errors: list[BaseException] = []

            def serve() -> None:
                try:
                    agl.Client(server.url).train(agent_run, dataset=list(tasks), nworkers=nworkers)
                except BaseException as exc:  # noqa: BLE001 - reported below, in the main thread
                    errors.append(exc)

            client = threading.Thread(target=serve, name="agl-client", daemon=True)
            client.start()
            dataset_id = server.wait_for_dataset(timeout=120)
            if dataset_id is None:
                raise RuntimeError(f"the client did not attach a dataset within 120 s: {errors or 'no error'}")
            rollouts = server.wait(server.enqueue(dataset_id, group_size=group_size), timeout=300)
            server.request_stop()
            client.join(timeout=120)
            if errors:
                raise RuntimeError(f"the client failed: {errors[0]!r}") from errors[0]
    return rollouts


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="server, mock model and client in this process")
    parser.add_argument("--server-url", default=None, help="Lightning Server URL (default: $AGL_SERVER_URL)")
    parser.add_argument("--games", type=int, default=2000, help="training games to upload")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training games")
    parser.add_argument("--nworkers", type=int, default=-1, help="worker processes (-1: one per core)")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    if arguments.dry_run:
        rollouts = dry_run(make_tasks(4, arguments.seed))
        for rollout in rollouts:
            guesses = sum(1 for call in rollout.calls if call.kind == "llm")
            print(
                f"{rollout.task_id:<16} {rollout.status:<10} reward {rollout.final_reward}  LLM calls {guesses}  "
                f"token ids from {sorted({str(c.token_source) for c in rollout.calls})}"
            )
        won = sum(1 for r in rollouts if r.final_reward == 1.0)
        print(f"dry run: {len(rollouts)} rollouts through the server, {won} won")
        return 0
    agl.Client(arguments.server_url).train(
        agent_run, dataset=make_tasks(arguments.games, arguments.seed), nworkers=arguments.nworkers
    )
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
