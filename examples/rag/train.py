"""Train the RAG agent (OpenAI Agents SDK) with GRPO on MuSiQue/HotpotQA, or check the whole path on CPU.

    python -m examples.rag.train --dry-run                               # CPU, a mock model, a few seconds
    python -m examples.rag.train --model Qwen/Qwen2.5-3B-Instruct        # GPU, see README.md
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from examples.common import base_parser, mock_dry_run, print_dry_run
from examples.rag.data import load_tasks
from examples.rag.mock import mock_handler
from examples.rag.rag_agent import rag_agent

DRY_RUN_TASKS = 4


def parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run a few rollouts on CPU against a mock model")
    parser.add_argument("--model", default="Qwen/Qwen2.5-3B-Instruct", help="model to train")
    parser.add_argument("--group-size", type=int, default=8, help="GRPO group size (rollouts per question)")
    parser.add_argument("--batch-size", type=int, default=32, help="questions per training step")
    parser.add_argument("--epochs", type=int, default=3, help="passes over the training questions")
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--output-dir", default="runs/rag", help="checkpoints, metrics and reward curve")
    return parser


def with_data_dir(tasks: list[dict], data_dir: Path) -> list[dict]:
    """Tasks that tell the agent which paragraph collection to search."""
    return [{**task, "data_dir": str(Path(data_dir).resolve())} for task in tasks]


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    train = with_data_dir(load_tasks(arguments.data_dir, "train"), arguments.data_dir)
    test = with_data_dir(load_tasks(arguments.data_dir, "test"), arguments.data_dir)
    if arguments.dry_run:
        tasks = train[: DRY_RUN_TASKS // 2] + test[: DRY_RUN_TASKS // 2]
        print_dry_run(mock_dry_run(rag_agent, tasks, mock_handler(tasks), group_size=3))
        return 0
    import agentlightning as agl

    result = agl.train(
        rag_agent,
        train,
        val_dataset=test,
        roles=rag_agent.roles,
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
