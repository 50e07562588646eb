"""Train the Spider SQL agent (writer and rewriter roles) with GRPO, or check the whole path on CPU.

python -m examples.spider.train --dry-run                   # CPU, a mock model, a few seconds
python -m examples.spider.train --dry-run --policies        # CPU: writer and rewriter as two adapters
python -m examples.spider.train --model Qwen/Qwen2.5-Coder-1.5B-Instruct   # GPU, see README.md
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import agentlightning as agl
from examples.common import add_training_arguments, base_parser, cli, policy_dry_run, run_recipe, training_kwargs
from examples.spider.data import load_questions, split_by_database
from examples.spider.mock import mock_handler
from examples.spider.sql_agent import sql_agent

POLICIES = {"writer": agl.Policy(), "rewriter": agl.Policy(), "checker": None}
"""``--policies``: the writer and the rewriter as two LoRA adapters, the checker served by the frozen base."""


def parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run a few rollouts on CPU against a mock model")
    parser.add_argument(
        "--policies",
        action="store_true",
        help="train the writer and the rewriter as two LoRA adapters, the checker frozen (with "
        "--dry-run: two training steps of a tiny model on the mock model's rollouts)",
    )
    add_training_arguments(parser, model="Qwen/Qwen2.5-Coder-1.5B-Instruct", max_steps=150, output_dir="runs/spider")
    return parser


def training_plan(arguments: argparse.Namespace) -> dict[str, Any]:
    """Everything ``agl.train`` gets except the model: agent, data, roles and the recipe options."""
    train, validation = split_by_database(load_questions(arguments.data_dir))
    return {
        "agent": sql_agent,
        "dataset": train,
        "roles": ["writer", "rewriter"],
        "val_dataset": validation[: arguments.val_size] if arguments.val_size else validation,
        **training_kwargs(arguments),
    }


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    plan = training_plan(arguments)
    if arguments.policies and arguments.dry_run:  # two adapters trained on the mock model's rollouts
        tasks = plan["dataset"][:3]
        result = policy_dry_run(plan, mock_handler(tasks), tasks, POLICIES, Path(arguments.output_dir) / "dry-run")
        print(result.summary())
        for row in result.history:
            print(
                f"step {row['step']}: "
                + ", ".join(
                    f"{name} {row.get(f'policy/{name}/model_version')} ({row.get(f'policy/{name}/transitions')} "
                    f"transitions)"
                    for name in ("writer", "rewriter")
                )
            )
        return 0
    if arguments.policies:
        plan = {**{key: value for key, value in plan.items() if key != "roles"}, "policies": POLICIES}
    return run_recipe(arguments, plan, mock_handler, plan["dataset"][:3] + plan["val_dataset"][:3], group_size=2)


if __name__ == "__main__":
    sys.exit(cli(main))
