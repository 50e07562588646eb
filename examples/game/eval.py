"""Score a model on held-out number games (a seed never used for training) with ``agl.evaluate``.

python -m examples.game.eval --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-0.5B-Instruct
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from examples.common import cli, endpoint_parser, evaluate_endpoint
from examples.game.train import agent_run, make_tasks

HELD_OUT_SEED = 10_000


def main(argv: Sequence[str] | None = None) -> int:
    parser = endpoint_parser(__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=200, help="held-out games to play")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    tasks = make_tasks(arguments.limit or arguments.games, HELD_OUT_SEED)
    evaluate_endpoint(arguments, agent_run, tasks, "number-game")
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
