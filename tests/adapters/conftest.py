"""Fixtures of the framework adapter tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from adapter_support import RecordingModel, Rule

from agentlightning.testing import MockLLMServer


@pytest.fixture
def serve() -> Iterator[Callable[[Rule], tuple[MockLLMServer, RecordingModel]]]:
    """``serve(rule)`` starts a mock server (token ids on) answering with ``rule``; stopped after the test."""
    servers: list[MockLLMServer] = []

    def start(rule: Rule) -> tuple[MockLLMServer, RecordingModel]:
        model = RecordingModel(rule)
        server = MockLLMServer(handler=model, token_ids=True).start()
        servers.append(server)
        return server, model

    yield start
    for server in servers:
        server.stop()
