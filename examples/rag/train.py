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
from typing import Any

from examples.common import add_training_arguments, base_parser, cli, run_recipe, training_kwargs
from examples.rag.data import load_tasks
from examples.rag.mock import mock_handler
from examples.rag.rag_agent import rag_agent


def parser() -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run a few rollouts on CPU against a mock model")
    add_training_arguments(parser, model="Qwen/Qwen2.5-3B-Instruct", max_steps=200, output_dir="runs/rag")
    return parser


def with_data_dir(tasks: list[dict], data_dir: Path) -> list[dict]:
    """Tasks that tell the agent which paragraph collection to search."""
    return [{**task, "data_dir": str(Path(data_dir).resolve())} for task in tasks]


def training_plan(arguments: argparse.Namespace) -> dict[str, Any]:
    """Everything ``agl.train`` gets except the model: agent, data, roles and the recipe options."""
    test = with_data_dir(load_tasks(arguments.data_dir, "test"), arguments.data_dir)
    return {
        "agent": rag_agent,
        "dataset": with_data_dir(load_tasks(arguments.data_dir, "train"), arguments.data_dir),
        "roles": rag_agent.roles,
        "val_dataset": test[: arguments.val_size] if arguments.val_size else test,
        **training_kwargs(arguments),
    }


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    plan = training_plan(arguments)
    return run_recipe(arguments, plan, mock_handler, plan["dataset"][:2] + plan["val_dataset"][:2], group_size=3)


if __name__ == "__main__":
    sys.exit(cli(main))
