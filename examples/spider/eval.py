"""Score a model on the Spider validation databases (unseen in training) with ``agl.evaluate``.

python -m examples.spider.eval --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-Coder-1.5B-Instruct
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from examples.common import cli, endpoint_parser, evaluate_endpoint
from examples.spider.data import load_questions, split_by_database
from examples.spider.sql_agent import sql_agent


def main(argv: Sequence[str] | None = None) -> int:
    arguments = endpoint_parser(__doc__.splitlines()[0]).parse_args(argv)
    logging.basicConfig(level=arguments.log_level.upper())
    _, validation = split_by_database(load_questions(arguments.data_dir))
    evaluate_endpoint(arguments, sql_agent, validation, "spider-validation")
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
