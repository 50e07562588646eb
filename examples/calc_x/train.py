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
from typing import Any

from agentlightning.rl.air import ToolErrorRule
from examples.calc_x.calc_agent import calc_agent
from examples.calc_x.data import SOURCES, load_tasks
from examples.calc_x.mock import mock_handler
from examples.common import add_training_arguments, base_parser, cli, run_recipe, training_kwargs


def parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run a few rollouts on CPU against a mock model")
    parser.add_argument("--sources", nargs="+", default=["gsm8k", "svamp", "calcx_sample"], choices=SOURCES)
    parser.add_argument("--tool-error-penalty", type=float, default=-0.5, help="AIR reward of a failed tool call")
    add_training_arguments(parser, model="Qwen/Qwen2.5-1.5B-Instruct", max_steps=300, output_dir="runs/calc_x")
    return parser


def training_plan(arguments: argparse.Namespace) -> dict[str, Any]:
    """Everything ``agl.train`` gets except the model: agent, data, roles, AIR and the recipe options."""
    test = load_tasks(arguments.data_dir, "test", arguments.sources)
    return {
        "agent": calc_agent,
        "dataset": load_tasks(arguments.data_dir, "train", arguments.sources),
        "roles": calc_agent.roles,
        "air": [ToolErrorRule(penalty=arguments.tool_error_penalty)],
        "val_dataset": test[: arguments.val_size] if arguments.val_size else test,
        **training_kwargs(arguments),
    }


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    plan = training_plan(arguments)
    return run_recipe(arguments, plan, mock_handler, plan["dataset"][-3:] + plan["val_dataset"][:3], group_size=3)


if __name__ == "__main__":
    sys.exit(cli(main))
