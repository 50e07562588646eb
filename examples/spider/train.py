"""Train the Spider SQL agent (writer and rewriter roles) with GRPO, or check the whole path on CPU.

    python -m examples.spider.train --dry-run                   # CPU, a mock model, a few seconds
    python -m examples.spider.train --model Qwen/Qwen2.5-Coder-1.5B-Instruct   # GPU, see README.md
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from examples.common import (
    cli,
    add_training_arguments,
    base_parser,
    load_policy,
    mock_dry_run,
    print_dry_run,
    training_kwargs,
)
from examples.spider.data import load_questions, split_by_database
from examples.spider.mock import mock_handler
from examples.spider.sql_agent import sql_agent

def parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run a few rollouts on CPU against a mock model")
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
    if arguments.dry_run:
        tasks = plan["dataset"][:3] + plan["val_dataset"][:3]
        print_dry_run(mock_dry_run(plan["agent"], tasks, mock_handler(tasks), group_size=2, air=plan.get("air")))
        return 0
    import agentlightning as agl

    model, tokenizer = load_policy(arguments)
    print(agl.train(model=model, tokenizer=tokenizer, **plan).summary())
    return 0

if __name__ == "__main__":
    sys.exit(cli(main))
