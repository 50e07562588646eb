"""Run the mock OpenAI-compatible server from a shell: ``python -m agentlightning.testing --port 8000``."""

from __future__ import annotations

import argparse
import logging
import threading

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
        help="scripted reply, served in order (repeat the option); default: echo",
    )
    parser.add_argument("--token-ids", action="store_true", help="always return vLLM-style token ids")
    parser.add_argument("--model", action="append", help="model name listed by /v1/models (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = MockLLMServer(
        replies=args.reply,
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


if __name__ == "__main__":
    main()
