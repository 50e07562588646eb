"""Train the Calc-X assistant (AutoGen) with GRPO and AIR on math word problems, or check the path on CPU.

    python -m examples.calc_x.train --dry-run                               # CPU, a mock model, a few seconds
    python -m examples.calc_x.train --model Qwen/Qwen2.5-1.5B-Instruct      # GPU, see README.md

AIR: a failed calculator call (status 'error', e.g. an expression the calculator cannot parse) adds
``--tool-error-penalty`` to the reward of the LLM call that requested it, on top of the episode's final reward.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from agentlightning.rl.air import ToolErrorRule
from examples.calc_x.calc_agent import calc_agent
from examples.calc_x.data import SOURCES, load_tasks
from examples.calc_x.mock import mock_handler
from examples.common import base_parser, mock_dry_run, print_dry_run

DRY_RUN_TASKS = 6


def parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run a few rollouts on CPU against a mock model")
    parser.add_argument("--model", default="Qwen/Qwen2.5-1.5B-Instruct", help="model to train")
    parser.add_argument("--sources", nargs="+", default=["gsm8k", "svamp", "calcx_sample"], choices=SOURCES)
    parser.add_argument("--tool-error-penalty", type=float, default=-0.5, help="AIR reward of a failed tool call")
    parser.add_argument("--group-size", type=int, default=8, help="GRPO group size (rollouts per problem)")
    parser.add_argument("--batch-size", type=int, default=64, help="problems per training step")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the training problems")
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--output-dir", default="runs/calc_x", help="checkpoints, metrics and reward curve")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    air = [ToolErrorRule(penalty=arguments.tool_error_penalty)]
    train = load_tasks(arguments.data_dir, "train", arguments.sources)
    test = load_tasks(arguments.data_dir, "test", arguments.sources)
    if arguments.dry_run:
        tasks = train[-DRY_RUN_TASKS // 2 :] + test[: DRY_RUN_TASKS // 2]
        print_dry_run(mock_dry_run(calc_agent, tasks, mock_handler(tasks), group_size=3, air=air))
        return 0
    import agentlightning as agl

    result = agl.train(
        calc_agent,
        train,
        val_dataset=test,
        roles=calc_agent.roles,
        air=air,
        model=arguments.model,
        algorithm="grpo",
        group_size=arguments.group_size,
        batch_size=arguments.batch_size,
        epochs=arguments.epochs,
        learning_rate=arguments.learning_rate,
        output_dir=arguments.output_dir,
    )
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
