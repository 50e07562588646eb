"""Score any OpenAI-compatible endpoint on the held-out math problems (GSM8K test, SVAMP rows 700-999).

python -m examples.calc_x.eval --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-1.5B-Instruct
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from examples.calc_x.calc_agent import calc_agent
from examples.calc_x.data import SOURCES, load_tasks
from examples.common import cli, endpoint_parser, evaluate_endpoint, summarise


def main(argv: Sequence[str] | None = None) -> int:
    parser = endpoint_parser(__doc__.splitlines()[0])
    parser.add_argument("--sources", nargs="+", default=["gsm8k", "svamp"], choices=SOURCES)
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    tasks = load_tasks(arguments.data_dir, "test", arguments.sources)
    rollouts = evaluate_endpoint(arguments, calc_agent, tasks)
    tool_calls = [call for rollout in rollouts for call in rollout.calls if call.kind == "tool"]
    failed = sum(1 for call in tool_calls if call.status == "error")
    print(summarise(rollouts).line(f"calc-x test ({arguments.model})"))
    print(f"calculator calls {len(tool_calls)}, failed {failed}")
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
