"""Score a model on the held-out math problems (GSM8K test, SVAMP rows 700-999; ``--svamp-one-op``: the 162
held-out one-operation SVAMP problems of the SVAMP benchmark) with ``agl.evaluate``.

python -m examples.calc_x.eval --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-1.5B-Instruct
python -m examples.calc_x.eval --model runs/svamp/seed0/grpo --svamp-one-op    # a run's model, in-process
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from examples.calc_x.calc_agent import calc_agent
from examples.calc_x.data import SOURCES, load_svamp_one_op, load_tasks
from examples.common import cli, endpoint_parser, evaluate_endpoint


def main(argv: Sequence[str] | None = None) -> int:
    parser = endpoint_parser(__doc__.splitlines()[0])
    parser.add_argument("--sources", nargs="+", default=["gsm8k", "svamp"], choices=SOURCES)
    parser.add_argument("--svamp-one-op", action="store_true", help="the SVAMP benchmark's held-out split instead")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    if arguments.svamp_one_op:
        tasks, name = load_svamp_one_op(arguments.data_dir, "heldout"), "svamp-heldout"
    else:
        tasks, name = load_tasks(arguments.data_dir, "test", arguments.sources), "calc-x-test"
    evaluate_endpoint(arguments, calc_agent, tasks, name)
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
