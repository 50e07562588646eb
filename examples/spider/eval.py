"""Score any OpenAI-compatible endpoint on the Spider validation databases (unseen in training).

    python -m examples.spider.eval --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-Coder-1.5B-Instruct
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import agentlightning as agl
from examples.common import cli, endpoint_parser, summarise, write_rollouts
from examples.spider.data import load_questions, split_by_database
from examples.spider.sql_agent import sql_agent


def main(argv: Sequence[str] | None = None) -> int:
    arguments = endpoint_parser(__doc__.splitlines()[0]).parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    _, validation = split_by_database(load_questions(arguments.data_dir))
    tasks = validation[: arguments.limit] if arguments.limit else validation
    llm = agl.LLM(
        base_url=arguments.base_url,
        model=arguments.model,
        api_key=arguments.api_key,
        sampling_parameters={"temperature": arguments.temperature},
    )
    rollouts = agl.run(sql_agent, tasks, llm=llm, n_workers=arguments.workers, timeout=arguments.timeout)
    if arguments.output:
        write_rollouts(arguments.output, rollouts)
    print(summarise(rollouts).line(f"spider validation ({arguments.model})"))
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
