"""Shared pytest fixtures. Every test talks to real servers on 127.0.0.1 only; nothing downloads from a hub."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agentlightning.testing import MockLLMServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def mock_llm_server() -> Iterator[MockLLMServer]:
    """A started :class:`MockLLMServer` (echo replies; change with ``set_replies`` / ``set_handler``)."""
    with MockLLMServer() as server:
        yield server
