"""Shared pytest fixtures. Every test talks to real servers on 127.0.0.1 only; nothing downloads from a hub."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from agentlightning.testing import MockLLMServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The fault tests send Ctrl-C and hang-ups to real processes, as a terminal does. A run started in the background
# (`nohup make test &`, `make test &` in a script) ignores SIGINT, SIGQUIT and SIGHUP, which every child inherits
# (Python then never turns SIGINT into KeyboardInterrupt): the test processes take the default dispositions back.
for _ignored in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
    if signal.getsignal(_ignored) == signal.SIG_IGN:
        signal.signal(_ignored, signal.default_int_handler if _ignored == signal.SIGINT else signal.SIG_DFL)


@pytest.fixture
def mock_llm_server() -> Iterator[MockLLMServer]:
    """A started :class:`MockLLMServer` (echo replies; change with ``set_replies`` / ``set_handler``)."""
    with MockLLMServer() as server:
        yield server
