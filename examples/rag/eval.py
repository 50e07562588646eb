"""Score a model on the held-out MuSiQue dev questions (reward 0.9 x F1 + 0.1 x format) with ``agl.evaluate``.

python -m examples.rag.eval --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-3B-Instruct
"""

from __future__ import annotations

import logging
import statistics
import sys
from collections.abc import Sequence

from examples.common import cli, endpoint_parser, evaluate_endpoint
from examples.rag.data import load_tasks
from examples.rag.rag_agent import rag_agent
from examples.rag.train import with_data_dir


def main(argv: Sequence[str] | None = None) -> int:
    arguments = endpoint_parser(__doc__.splitlines()[0]).parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    tasks = with_data_dir(load_tasks(arguments.data_dir, "test"), arguments.data_dir)
    report = evaluate_endpoint(arguments, rag_agent, tasks, "musique-dev")
    outputs = [r.output for r in report.rollout_records if isinstance(r.output, dict)]
    f1 = statistics.fmean(o["f1"] for o in outputs) if outputs else 0.0
    formatted = sum(1 for o in outputs if o["format_ok"]) / report.rollouts if report.rollouts else 0.0
    print(f"answer F1 {f1:.4f}, replies with a well-formed <answer> {formatted:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
