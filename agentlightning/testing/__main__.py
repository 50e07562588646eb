"""Run the mock OpenAI-compatible server from a shell: ``python -m agentlightning.testing --port 8000``."""

from __future__ import annotations

import argparse
import itertools
import logging
import threading
from collections.abc import Callable, Sequence

from agentlightning.testing._replies import MockReply, MockRequest
from agentlightning.testing._server import MockLLMServer


def main(argv: list[str] | None = None) -> None:
    """Serve until interrupted; replies echo the last user message unless ``--reply`` scripts them."""
    parser = argparse.ArgumentParser(prog="python -m agentlightning.testing", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument(
        "--reply",
        action="append",
        metavar="TEXT",
        help="scripted reply (repeat the option for several): served in order, then again from the first, so "
        "that an agent called many times (a training run) gets an answer every time; default: echo",
    )
    parser.add_argument("--token-ids", action="store_true", help="always return vLLM-style token ids")
    parser.add_argument("--model", action="append", help="model name listed by /v1/models (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = MockLLMServer(
        handler=_cycling(args.reply) if args.reply else None,
        token_ids=args.token_ids,
        models=args.model or ["mock-model"],
        host=args.host,
        port=args.port,
    )
    with server:
        logging.info("mock OpenAI-compatible server at %s (Ctrl-C to stop)", server.base_url)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            logging.info("stopping")


def _cycling(replies: Sequence[str]) -> Callable[[MockRequest], MockReply]:
    """A handler answering with ``replies`` in order, round and round (``replies=`` answers each once: a test's
    script, where one more request is a bug worth a 500)."""
    script = itertools.cycle(replies)
    lock = threading.Lock()

    def handler(_: MockRequest) -> MockReply:
        with lock:
            return MockReply(content=next(script))

    return handler


if __name__ == "__main__":
    main()
