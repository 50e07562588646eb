"""Train the Spider SQL agent (writer and rewriter roles) with GRPO, or check the whole path on CPU.

    python -m examples.spider.train --dry-run                   # CPU, a mock model, a few seconds
    python -m examples.spider.train --model Qwen/Qwen2.5-Coder-1.5B-Instruct   # GPU, see README.md
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from examples.common import base_parser, mock_dry_run, print_dry_run
from examples.spider.data import load_questions, split_by_database
from examples.spider.mock import mock_handler
from examples.spider.sql_agent import sql_agent

DRY_RUN_TASKS = 6


def parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run a few rollouts on CPU against a mock model")
    parser.add_argument("--model", default="Qwen/Qwen2.5-Coder-1.5B-Instruct", help="model to train")
    parser.add_argument("--group-size", type=int, default=8, help="GRPO group size (rollouts per question)")
    parser.add_argument("--batch-size", type=int, default=32, help="questions per training step")
    parser.add_argument("--epochs", type=int, default=2, help="passes over the training questions")
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--output-dir", default="runs/spider", help="checkpoints, metrics and reward curve")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    train, validation = split_by_database(load_questions(arguments.data_dir))
    if arguments.dry_run:
        tasks = train[:DRY_RUN_TASKS // 2] + validation[:DRY_RUN_TASKS // 2]
        print_dry_run(mock_dry_run(sql_agent, tasks, mock_handler(tasks)))
        return 0
    import agentlightning as agl

    result = agl.train(
        sql_agent,
        train,
        val_dataset=validation,
        roles=["writer", "rewriter"],
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
